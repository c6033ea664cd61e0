"""Regenerate the offline benchmarks ``arithmetic`` and ``shell`` in Harbor's task format.

    python benchmarks/generate.py             # rewrite benchmarks/arithmetic and benchmarks/shell
    python benchmarks/generate.py --out DIR   # write DIR/arithmetic and DIR/shell instead

The output is a pure function of this file (fixed seed, no clock, no environment), so the
committed tasks must equal a fresh run; tests/unit/test_benchmarks.py checks that.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SEED = 20250611
PER_SPLIT = 60
POOL_ROWS = 2000
"""Questions in ``arithmetic``'s training pool: drawn from the pairs no task uses (about half of them,
so the pool does not spell out the hidden split as the complement of what it lists)."""
SPLITS: tuple[tuple[str, bool], ...] = (("dev", False), ("official", True))
ORG = "rsigym"
POOL_FILE = "train.jsonl"

# --------------------------------------------------------------------------- task model


@dataclass(frozen=True)
class TaskSpec:
    """Everything that differs between two tasks; the rest is rendered the same way."""

    instruction: str  # the whole instruction.md
    check: str  # bash lines for test.sh that set reward=1 on success
    solve: str  # bash lines for solve.sh
    summary: str  # one line for the comments in test.sh / solve.sh (never shown to the agent)
    metadata: dict[str, str]
    app: dict[str, str] = field(default_factory=dict)  # environment/app/<path> -> content

    def question_key(self) -> str:
        """What makes two tasks "the same question": instruction plus input files."""
        h = hashlib.sha256(self.instruction.encode())
        for path in sorted(self.app):
            h.update(b"\0" + path.encode() + b"\0" + self.app[path].encode())
        return h.hexdigest()


TEST_PRELUDE = """\
#!/bin/bash
# Verifier ({summary}).
# Runs from /app; always writes 0 or 1 to /logs/verifier/reward.txt and exits 0.
mkdir -p /logs/verifier
reward=0

"""

TRIMMED = """\
# Print a file with leading/trailing whitespace removed; fail when it is not a file.
trimmed() {
  [ -f "$1" ] || return 1
  local s
  s="$(cat -- "$1" 2>/dev/null)" || return 1
  s="${s#"${s%%[![:space:]]*}"}"
  s="${s%"${s##*[![:space:]]}"}"
  printf '%s' "$s"
}

"""

LINES = """\
# Print a file's lines with trailing whitespace and trailing blank lines removed.
lines() {
  [ -f "$1" ] || return 1
  local s
  s="$(sed 's/[[:space:]]*$//' -- "$1" 2>/dev/null)" || return 1
  printf '%s' "$s"
}

"""

TEST_EPILOGUE = """
echo "$reward" > /logs/verifier/reward.txt
exit 0
"""


def task_toml(benchmark: str, task_id: str, description: str, metadata: dict[str, str]) -> str:
    meta = "".join(f'{key} = "{value}"\n' for key, value in metadata.items())
    return (
        'schema_version = "1.4"\n'
        # The verifier runs in a fresh environment that gets only these outputs of the agent's.
        'artifacts = ["/app"]\n\n'
        "[task]\n"
        f'name = "{ORG}/{benchmark}__{task_id}"\n'
        f'description = "{description}"\n\n'
        f"[metadata]\n{meta}\n"
        '[verifier]\ntimeout_sec = 60.0\nenvironment_mode = "separate"\n\n'
        "[agent]\ntimeout_sec = 300.0\n\n"
        '[environment]\nbuild_timeout_sec = 600.0\nworkdir = "/app"\ncpus = 1\nmemory_mb = 1024\n'
    )


def dockerfile(has_app: bool) -> str:
    text = "FROM python:3.11-slim\nWORKDIR /app\n"
    return text + ("COPY app/ /app/\n" if has_app else "")


def test_sh(spec: TaskSpec) -> str:
    helpers = (TRIMMED if "trimmed " in spec.check else "") + (LINES if "lines " in spec.check else "")
    return TEST_PRELUDE.format(summary=spec.summary) + helpers + spec.check + TEST_EPILOGUE


def render_task(benchmark: str, task_id: str, spec: TaskSpec) -> dict[str, str]:
    # task.toml stays answer-free: some sandboxes may show it to the agent.
    if spec.metadata["kind"] == "qa":
        description = "Two-digit subtraction."
    else:
        description = f"Shell task ({spec.metadata['template']})."
    files = {
        "task.toml": task_toml(benchmark, task_id, description, spec.metadata),
        "instruction.md": spec.instruction,
        "environment/Dockerfile": dockerfile(bool(spec.app)),
        "tests/test.sh": test_sh(spec),
        "solution/solve.sh": f"#!/bin/bash\n# Oracle ({spec.summary}).\n{spec.solve}",
    }
    files.update({f"environment/app/{path}": text for path, text in spec.app.items()})
    return files


def benchmark_toml(name: str, description: str, version: str, *, pool: bool = False) -> str:
    text = f'name = "{name}"\ndescription = "{description}"\nversion = "{version}"\n'
    for split, hidden in SPLITS:
        text += f"\n[splits.{split}]\nhidden = {'true' if hidden else 'false'}\n"
    if pool:
        text += f'\n[training]\npool = "{POOL_FILE}"\n'
    return text


def q(text: str) -> str:
    """Single-quote for bash (our generated strings never contain a quote)."""
    assert "'" not in text and "\n" not in text, text
    return f"'{text}'"


def heredoc_var(var: str, lines: list[str]) -> str:
    body = "\n".join(lines)
    return f"{var}=\"$(cat <<'__EXPECTED__'\n{body}\n__EXPECTED__\n)\"\n"


def answer_check(expected: str) -> str:
    return f'if got="$(trimmed /app/answer.txt)" && [ "$got" = {q(expected)} ]; then reward=1; fi\n'


def lines_check(path: str, expected: list[str]) -> str:
    return (
        heredoc_var("want", expected)
        + f'if got="$(lines {path})" && [ "$got" = "$want" ]; then reward=1; fi\n'
    )


# --------------------------------------------------------------------------- arithmetic


ARITHMETIC_PAIRS = [(a, b) for a in range(10, 100) for b in range(10, a)]


def arithmetic_tasks(rng: random.Random) -> Iterator[tuple[str, TaskSpec]]:
    for n, (a, b) in enumerate(rng.sample(ARITHMETIC_PAIRS, PER_SPLIT * len(SPLITS)), start=1):
        answer = str(a - b)
        yield f"sub-{n:04d}", TaskSpec(
            instruction=f"What is {a} - {b}?\n",
            check=answer_check(answer),
            solve=f"echo {answer} > /app/answer.txt\n",
            summary=f"{a} - {b} = {answer}",
            metadata={"kind": "qa", "answer_file": "/app/answer.txt"},
        )


def arithmetic_pool(rng: random.Random, tasks: list[tuple[str, TaskSpec]]) -> list[str]:
    """``POOL_ROWS`` questions of the benchmark's form that no task of any split asks."""
    asked = {spec.instruction.strip() for _, spec in tasks}
    free = [q for q in (f"What is {a} - {b}?" for a, b in ARITHMETIC_PAIRS) if q not in asked]
    return rng.sample(free, POOL_ROWS)


# --------------------------------------------------------------------------- shell

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "nina", "oscar", "peggy", "rupert", "sybil", "trent", "victor", "walter"]
FRUITS = ["apple", "banana", "cherry", "grape", "kiwi", "lemon", "mango", "melon", "olive",
          "peach", "pear", "plum"]
CITIES = ["austin", "berlin", "cairo", "delhi", "lima", "lisbon", "madrid", "oslo", "paris",
          "quito", "rome", "seoul", "tokyo", "vienna"]
TEAMS = ["red", "blue", "green", "gold", "teal"]
# No word here is a substring of another, so a plain sed replacement is also a whole-word one.
WORDS = ["river", "stone", "cloud", "tiger", "maple", "frost", "ember", "lotus", "orbit",
         "quill", "pixel", "sand", "wolf", "harbor", "bright", "moss"]
NEW_WORDS = ["comet", "falcon", "glacier", "meadow", "nebula", "willow", "zephyr"]
LEVELS = ["INFO", "WARN", "ERROR", "DEBUG"]
MESSAGES = ["cache miss for key", "request served", "retrying upstream call",
            "disk usage checked", "user logged in", "connection reset by peer",
            "job finished", "config reloaded", "slow query detected", "token refreshed"]
FOLDERS = ["notes", "out", "docs", "reports", "drafts"]

ANSWER_NOTE = "Write only the answer (nothing else) to /app/answer.txt."


def t_count_level(rng: random.Random) -> TaskSpec:
    level = rng.choice(["ERROR", "WARN"])
    rows: list[str] = []
    for i in range(rng.randint(12, 30)):
        month, day, hour, minute = (rng.randint(1, 12), rng.randint(1, 28),
                                    rng.randint(0, 23), rng.randint(0, 59))
        stamp = f"2024-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{i % 60:02d}"
        rows.append(f"{stamp} {rng.choice(LEVELS)} {rng.choice(MESSAGES)} {rng.randint(1, 999)}")
    rows[rng.randrange(len(rows))] = rows[0].split(" ", 1)[0] + f" {level} {rng.choice(MESSAGES)} 1"
    count = sum(1 for r in rows if r.split(" ")[1] == level)
    return TaskSpec(
        instruction=(
            f"Each line of /app/app.log is `TIMESTAMP LEVEL MESSAGE`. How many lines have the "
            f"level {level}? {ANSWER_NOTE}\n"
        ),
        app={"app.log": "\n".join(rows) + "\n"},
        check=answer_check(str(count)),
        solve=f"awk '$2 == \"{level}\"' /app/app.log | wc -l > /app/answer.txt\n",
        summary=f"{count} {level} lines",
        metadata={"kind": "shell", "template": "count_level"},
    )


def t_count_word(rng: random.Random) -> TaskSpec:
    vocab = rng.sample(WORDS, 8)
    target = vocab[0]
    text_lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 9)))
                  for _ in range(rng.randint(6, 14))]
    text_lines[rng.randrange(len(text_lines))] += f" {target}"
    count = sum(line.split().count(target) for line in text_lines)
    return TaskSpec(
        instruction=(
            f"How many times does the word `{target}` occur in /app/text.txt? Words are "
            f"separated by single spaces. {ANSWER_NOTE}\n"
        ),
        app={"text.txt": "\n".join(text_lines) + "\n"},
        check=answer_check(str(count)),
        solve=f"grep -ow {q(target)} /app/text.txt | wc -l > /app/answer.txt\n",
        summary=f"{target} occurs {count} times",
        metadata={"kind": "shell", "template": "count_word"},
    )


def t_sort_unique(rng: random.Random) -> TaskSpec:
    pool = rng.sample(NAMES, rng.randint(5, 9))
    rows = pool + [rng.choice(pool) for _ in range(rng.randint(5, 14))]
    rng.shuffle(rows)
    expected = sorted(set(rows))
    return TaskSpec(
        instruction=(
            "Write the distinct lines of /app/names.txt to /app/sorted.txt, sorted "
            "alphabetically, one per line, each line appearing once.\n"
        ),
        app={"names.txt": "\n".join(rows) + "\n"},
        check=lines_check("/app/sorted.txt", expected),
        solve="sort -u /app/names.txt > /app/sorted.txt\n",
        summary=f"{len(expected)} distinct names",
        metadata={"kind": "shell", "template": "sort_unique"},
    )


def t_most_common(rng: random.Random) -> TaskSpec:
    pool = rng.sample(FRUITS, rng.randint(4, 7))
    counts = {fruit: rng.randint(1, 5) for fruit in pool}
    winner = pool[0]
    counts[winner] = max(counts.values()) + rng.randint(1, 2)
    rows = [fruit for fruit, c in counts.items() for _ in range(c)]
    rng.shuffle(rows)
    return TaskSpec(
        instruction=(
            "/app/items.txt lists one fruit per line. Which fruit appears most often? "
            f"{ANSWER_NOTE}\n"
        ),
        app={"items.txt": "\n".join(rows) + "\n"},
        check=answer_check(winner),
        solve=(
            "sort /app/items.txt | uniq -c | sort -rn | head -n 1 | awk '{print $2}' "
            "> /app/answer.txt\n"
        ),
        summary=f"{winner} x{counts[winner]}",
        metadata={"kind": "shell", "template": "most_common"},
    )


def _people_csv(rng: random.Random) -> tuple[list[str], list[dict[str, str]]]:
    header = ["name", "age", "city", "team"]
    rng.shuffle(header)
    people = [
        {"name": name, "age": str(rng.randint(18, 80)), "city": rng.choice(CITIES),
         "team": rng.choice(TEAMS)}
        for name in rng.sample(NAMES, rng.randint(5, 10))
    ]
    return header, people


def t_extract_column(rng: random.Random) -> TaskSpec:
    header, people = _people_csv(rng)
    column = rng.choice(["name", "city", "team"])
    csv = [",".join(header)] + [",".join(p[h] for h in header) for p in people]
    expected = [p[column] for p in people]
    return TaskSpec(
        instruction=(
            f"/app/people.csv is a comma-separated file with a header row. Write the values of "
            f"its `{column}` column to /app/column.txt, one per line, in the original order, "
            "without the header.\n"
        ),
        app={"people.csv": "\n".join(csv) + "\n"},
        check=lines_check("/app/column.txt", expected),
        solve=f"tail -n +2 /app/people.csv | cut -d, -f{header.index(column) + 1} > /app/column.txt\n",
        summary=f"column {column}",
        metadata={"kind": "shell", "template": "extract_column"},
    )


def t_sum_column(rng: random.Random) -> TaskSpec:
    header = ["item", "qty", "price"]
    column = rng.choice(["qty", "price"])
    rows = [(fruit, rng.randint(1, 40), rng.randint(1, 500))
            for fruit in rng.sample(FRUITS, rng.randint(4, 9))]
    csv = [",".join(header)] + [f"{item},{qty},{price}" for item, qty, price in rows]
    total = sum(qty if column == "qty" else price for _, qty, price in rows)
    index = header.index(column) + 1
    return TaskSpec(
        instruction=(
            f"/app/sales.csv is a comma-separated file with a header row. What is the sum of its "
            f"`{column}` column? {ANSWER_NOTE}\n"
        ),
        app={"sales.csv": "\n".join(csv) + "\n"},
        check=answer_check(str(total)),
        solve=f"awk -F, 'NR > 1 {{ s += ${index} }} END {{ print s }}' /app/sales.csv > /app/answer.txt\n",
        summary=f"sum of {column} = {total}",
        metadata={"kind": "shell", "template": "sum_column"},
    )


def t_create_file(rng: random.Random) -> TaskSpec:
    path = f"/app/{rng.choice(FOLDERS)}/{rng.choice(NAMES)}.txt"
    content = [f"{rng.choice(WORDS)}={rng.randint(0, 999)}" for _ in range(rng.randint(2, 4))]
    block = "\n".join(content)
    return TaskSpec(
        instruction=(
            f"Create the file {path} (and its directory) containing exactly these "
            f"{len(content)} lines:\n\n```\n{block}\n```\n"
        ),
        check=lines_check(path, content),
        solve=(f"mkdir -p {path.rsplit('/', 1)[0]}\n"
               f"printf '%s\\n' {' '.join(q(c) for c in content)} > {path}\n"),
        summary=f"create {path}",
        metadata={"kind": "shell", "template": "create_file"},
    )


def t_rename_ext(rng: random.Random) -> TaskSpec:
    stems = rng.sample(WORDS, rng.randint(5, 7))
    n_txt = len(stems) - 2
    contents = {stem: f"{stem} {rng.randint(100, 999)}" for stem in stems}
    app = {f"data/{s}.txt": contents[s] + "\n" for s in stems[:n_txt]}
    others = {f"data/{s}.{ext}": contents[s] + "\n"
              for s, ext in zip(stems[n_txt:], rng.sample(["csv", "log", "md.bak"], 2), strict=True)}
    app.update(others)
    check = "reward=1\n"
    for stem in stems[:n_txt]:
        check += f'[ ! -e /app/data/{stem}.txt ] || reward=0\n'
        check += f'[ "$(trimmed /app/data/{stem}.md)" = {q(contents[stem])} ] || reward=0\n'
    for rel, text in others.items():
        check += f'[ "$(trimmed /app/{rel})" = {q(text.strip())} ] || reward=0\n'
    return TaskSpec(
        instruction=(
            "Rename every file in /app/data whose name ends in `.txt` so that it ends in `.md` "
            "instead, keeping the rest of the name and the contents. Leave other files as they are.\n"
        ),
        app=dict(sorted(app.items())),
        check=check,
        solve='for f in /app/data/*.txt; do mv -- "$f" "${f%.txt}.md"; done\n',
        summary=f"rename {n_txt} .txt files",
        metadata={"kind": "shell", "template": "rename_ext"},
    )


def t_replace_word(rng: random.Random) -> TaskSpec:
    vocab = rng.sample(WORDS, 6)
    old, new = vocab[0], rng.choice(NEW_WORDS)
    rows = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 7)))
            for _ in range(rng.randint(4, 9))]
    rows[rng.randrange(len(rows))] += f" {old}"
    expected = [" ".join(new if w == old else w for w in row.split()) for row in rows]
    return TaskSpec(
        instruction=(
            f"Edit /app/message.txt in place: replace every occurrence of the word `{old}` "
            f"with `{new}`. Change nothing else.\n"
        ),
        app={"message.txt": "\n".join(rows) + "\n"},
        check=lines_check("/app/message.txt", expected),
        solve=f"sed -i 's/{old}/{new}/g' /app/message.txt\n",
        summary=f"{old} -> {new}",
        metadata={"kind": "shell", "template": "replace_word"},
    )


def t_extreme_number(rng: random.Random) -> TaskSpec:
    numbers = rng.sample(range(1, 10000), rng.randint(10, 25))
    largest = rng.random() < 0.5
    answer = max(numbers) if largest else min(numbers)
    word, tail = ("largest", "tail") if largest else ("smallest", "head")
    return TaskSpec(
        instruction=f"What is the {word} number in /app/numbers.txt (one integer per line)? {ANSWER_NOTE}\n",
        app={"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
        check=answer_check(str(answer)),
        solve=f"sort -n /app/numbers.txt | {tail} -n 1 > /app/answer.txt\n",
        summary=f"{word} = {answer}",
        metadata={"kind": "shell", "template": "extreme_number"},
    )


SHELL_TEMPLATES: list[Callable[[random.Random], TaskSpec]] = [
    t_count_level, t_count_word, t_sort_unique, t_most_common, t_extract_column,
    t_sum_column, t_create_file, t_rename_ext, t_replace_word, t_extreme_number,
]


def shell_tasks(rng: random.Random) -> Iterator[tuple[str, TaskSpec]]:
    for n in range(1, PER_SPLIT * len(SPLITS) + 1):
        yield f"sh-{n:04d}", SHELL_TEMPLATES[(n - 1) % len(SHELL_TEMPLATES)](rng)


# --------------------------------------------------------------------------- writing

POOLS: dict[str, Callable[[random.Random, list[tuple[str, TaskSpec]]], list[str]]] = {"arithmetic": arithmetic_pool}
"""Benchmarks that ship a training pool (``train.jsonl``, declared as ``[training] pool``): questions of
the benchmark's form, disjoint from every task, for agents to build training data from."""

BENCHMARKS: dict[str, tuple[str, Callable[[random.Random], Iterator[tuple[str, TaskSpec]]]]] = {
    "arithmetic": ("Two-digit subtraction questions (a - b with a > b); answer in /app/answer.txt.",
                   arithmetic_tasks),
    "shell": ("File and text-processing tasks solved with standard shell tools in /app.",
              shell_tasks),
}


def build(name: str) -> dict[str, str]:
    """All files of one benchmark, keyed by path relative to benchmarks/<name>/."""
    description, make_tasks = BENCHMARKS[name]
    rng = random.Random(f"{SEED}:{name}")
    tasks = list(make_tasks(rng))
    keys = Counter(spec.question_key() for _, spec in tasks)
    assert max(keys.values()) == 1, f"{name}: generated a repeated question"
    files = {"benchmark.toml": benchmark_toml(name, description, "1.0.0", pool=name in POOLS)}
    if name in POOLS:  # drawn after the tasks, from the same generator: the tasks do not move
        files[POOL_FILE] = "".join(json.dumps({"question": question}) + "\n" for question in POOLS[name](rng, tasks))
    for index, (task_id, spec) in enumerate(tasks):
        split = SPLITS[index // PER_SPLIT][0]
        for rel, text in render_task(name, task_id, spec).items():
            files[f"{split}/{task_id}/{rel}"] = text
    return files


def write(out: Path) -> None:
    for name in BENCHMARKS:
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
