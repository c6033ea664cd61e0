"""Seeded official subsets, and the seeds that shaped a score.

``rsigym score RUN --subset N --seed S`` scores N tasks of a split, the same N for the initial
system, the reference system and every run. The draw orders the split's task ids by
``sha256("<seed>:<task id>")`` and keeps the first N, in the split's own order. It is a pure
function of (task ids, N, seed): stable across processes, machines and Python versions (unlike
``random.Random.sample``, whose algorithm Python does not promise to keep), and nested (the
subset of N at a seed holds the subset of any smaller N at that seed).

A score names every seed that shaped it: the subset seed above, and the split's own seed
(:func:`split_seed_name`): a generated split's seed (its source and fingerprint, never the
seed itself, services/evaluation/official_splits.py) or an imported benchmark's
``[source] split_seed`` (ops/benchmark_imports/humaneval.py).
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.errors import Unprocessable


def draw_order(task_ids: Sequence[str], seed: int) -> list[str]:
    """Every task id, in the seed's order (ties, impossible for distinct ids, fall back to the id)."""
    return sorted(set(task_ids), key=lambda t: (hashlib.sha256(f"{seed}:{t}".encode()).digest(), t))


def draw_subset(task_ids: Sequence[str], size: int, seed: int, *, where: str = "the split") -> list[str]:
    """The seed's ``size`` tasks of ``task_ids``, in their given order; a 422 (param ``subset``)
    when the split has fewer tasks than that."""
    if size < 1:
        raise Unprocessable(f"a subset holds at least one task (got {size})", param="subset")
    distinct = len(set(task_ids))
    if size > distinct:
        raise Unprocessable(f"subset of {size} tasks asked for, but {where} has {distinct}: "
                            "score a smaller subset, or the whole split (no subset)", param="subset")
    chosen = set(draw_order(task_ids, seed)[:size])
    return [t for t in dict.fromkeys(task_ids) if t in chosen]


def split_seed_name(splits: dict[str, Any], split: str, benchmark_root: Path | str) -> str | None:
    """The seed that drew ``split``, by name, for the report: ``<source> seed <fingerprint>`` for a
    split generated at registration, ``split_seed <n>`` for a benchmark whose ``[source]`` table
    records one (an import), None for a split that is a fixed list of tasks."""
    generated = (splits.get(split) or {}).get("generated")
    if generated:
        return f"{generated.get('seed', 'gym')} seed {generated.get('seed_fingerprint', '?')}"
    try:
        header = tomllib.loads((Path(benchmark_root) / "benchmark.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    source = header.get("source")
    seed = source.get("split_seed") if isinstance(source, dict) else None
    return None if seed is None or isinstance(seed, bool) else f"split_seed {seed}"
