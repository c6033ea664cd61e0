"""Regenerate the offline benchmarks ``arithmetic`` and ``shell`` in Harbor's task format.

    python benchmarks/generate.py             # rewrite benchmarks/arithmetic and benchmarks/shell
    python benchmarks/generate.py --out DIR   # write DIR/arithmetic and DIR/shell instead

What is written is public: ``benchmark.toml``, the ``dev`` split and the training pool, a pure
function of the generators in services/evaluation/task_generators/ and their published seed (no
clock, no environment), so the committed files must equal a fresh run; tests/unit/services/evaluation/test_benchmarks.py
checks that. The hidden ``official`` split is not written here: ``benchmark.toml`` declares it
generated, and the gym draws it at registration from a seed its operator holds
(services/evaluation/official_splits.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from services.evaluation.task_generators import GENERATORS, PER_SPLIT, public_draw, render_task  # noqa: E402

VERSION = "2.0.0"
"""2.0.0: the official split is generated at registration; 1.0.0 committed it (now retired)."""
POOL_FILE = "train.jsonl"


def benchmark_toml(name: str, description: str, *, pool: bool) -> str:
    text = f'name = "{name}"\ndescription = "{description}"\nversion = "{VERSION}"\n'
    text += "\n[splits.dev]\nhidden = false\n"
    text += ("\n# Generated at registration from a seed the gym's operator holds: never in this repository.\n"
             f'[splits.official]\nhidden = true\ngenerator = "{name}"\ncount = {PER_SPLIT}\n')
    if pool:
        text += f'\n[training]\npool = "{POOL_FILE}"\n'
    return text


def build(name: str) -> dict[str, str]:
    """All files of one benchmark, keyed by path relative to benchmarks/<name>/."""
    gen, draw = GENERATORS[name], public_draw(name)
    keys = Counter(spec.question_key() for spec in (*draw.dev, *draw.retired))
    assert max(keys.values()) == 1, f"{name}: generated a repeated question"
    files = {"benchmark.toml": benchmark_toml(name, gen.description, pool=bool(draw.pool))}
    if draw.pool:
        files[POOL_FILE] = "".join(json.dumps({"question": question}) + "\n" for question in draw.pool)
    for n, spec in enumerate(draw.dev, start=1):
        task_id = f"{gen.id_prefix}-{n:04d}"
        for rel, text in render_task(name, task_id, spec).items():
            files[f"dev/{task_id}/{rel}"] = text
    return files


def write(out: Path) -> None:
    for name in GENERATORS:
        root = out / name
        if root.exists():
            shutil.rmtree(root)
        for rel, text in build(name).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8"))
            if path.suffix == ".sh":
                path.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="directory that receives <name>/ for each benchmark")
    args = parser.parse_args(argv)
    write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
