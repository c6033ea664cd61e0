"""Contamination audit speed: the numpy scanner against a plain-Python set-of-tuples baseline.

Generates (deterministically) ``--mb`` MB of synthetic training text — prose-like rows of words,
numbers and punctuation, with clean arithmetic ("What is 41 + 17? 58") mixed in — and
``--tasks`` benchmark tasks (long questions with short answers, and short "What is A - B?"
questions with their answers). A few rows are planted with task texts: verbatim, re-cased,
re-punctuated, re-spaced and wrapped in other text. The real scanner
(services/records/audits/contamination.py ``scan``) reads all of it; the baseline
(``scan_reference``: word tuples in Python sets) reads the first ``--baseline-mb`` MB, which hold
every planted row. Both must report exactly the planted tasks. Prints MB/s per core (CPU time of
this single-threaded process) for both and their ratio (goal: >= 50 MB/s/core and >= 5x).

    .venv/bin/python bench/contamination_audit.py [--mb 200] [--tasks 10000] [--baseline-mb 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # one core
    os.environ.setdefault(_var, "1")

if __package__ in (None, ""):  # run as a script: the project root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.records.audits.contamination import (  # noqa: E402
    Item,
    ScanReport,
    dataset_rows,
    scan,
    scan_reference,
)

N, THRESHOLD = 13, 0.5
PUNCT = [",", ".", ";", ":", "!", "?", " -", "(", ")", '"']


def vocabulary(rng: random.Random, size: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(size)})


def tasks(rng: random.Random, vocab: list[str], count: int) -> list[Item]:
    """``count`` tasks: 80% long questions (15-40 words) with 1-3 word answers, 20% short arithmetic."""
    items: list[Item] = []
    for t in range(count):
        tid = f"t-{t:05d}"
        split = "official" if t % 2 else "dev"
        if t % 5:
            words = rng.choices(vocab, k=rng.randint(15, 40))
            words[0] = words[0].capitalize()
            question = " ".join(words) + "?"
            answer = " ".join(rng.choices(vocab, k=rng.randint(1, 3)))
        else:
            a, b = rng.randint(100, 999), rng.randint(10, 99)
            question, answer = f"What is {a} - {b}?", str(a - b)
        items += [Item(tid, "synthetic", split, "question", question), Item(tid, "synthetic", split, "answer", answer)]
    return items


def prose_row(rng: random.Random, vocab: list[str], target_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < target_chars:
        if rng.random() < 0.05:
            a, b = rng.randint(0, 999), rng.randint(0, 99)
            sentence = f"What is {a} + {b}? {a + b}."
        else:
            words = rng.choices(vocab, k=rng.randint(6, 24))
            words[0] = words[0].capitalize()
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
            sentence = " ".join(words) + rng.choice(PUNCT)
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def disguise(rng: random.Random, text: str, how: str) -> str:
    if how == "recased":
        return text.upper()
    if how == "repunctuated":
        return text.replace("?", "!!").replace(" ", ", ", 3)
    if how == "respaced":
        return "\n  ".join(text.split(" "))
    return text


def corpus(rng: random.Random, vocab: list[str], items: list[Item], mb: float, baseline_mb: float,
           ) -> tuple[list[tuple[str, int, str]], set[str]]:
    """Rows of about 1 KB; the planted ones lie inside the first ``baseline_mb`` MB."""
    total, baseline = int(mb * 1e6), int(baseline_mb * 1e6)
    by_task: dict[str, dict[str, str]] = {}
    for it in items:
        by_task.setdefault(it.task, {})[it.field] = it.text
    task_ids = sorted(by_task)
    long_ids = [t for t in task_ids if len(by_task[t]["question"].split()) > 8]
    short_ids = [t for t in task_ids if len(by_task[t]["question"].split()) <= 8]
    planted_rows: dict[int, tuple[str, str]] = {}
    hows = ["verbatim", "recased", "repunctuated", "respaced", "verbatim", "recased"]
    for j, how in enumerate(hows):  # long questions, wrapped in other text
        t = long_ids[(j * 997) % len(long_ids)]
        planted_rows[50 + j * 997 % 5000] = (t, f"Here is one: {disguise(rng, by_task[t]['question'], how)} "
                                                f"Answer: {by_task[t]['answer']}")
    for j in range(4):  # short questions with their answers, as a chat row would hold them
        t = short_ids[(j * 389) % len(short_ids)]
        planted_rows[7 + j * 1511 % 6000] = (t, f"USER: {by_task[t]['question'].lower()}\nASSISTANT: {by_task[t]['answer']}")
    rows: list[tuple[str, int, str]] = []
    size = 0
    while size < total:
        n = len(rows)
        text = prose_row(rng, vocab, 1000)
        if n in planted_rows:
            text = text[:400] + " " + planted_rows[n][1] + " " + text[400:]
        rows.append(("bench-ds", n + 1, text))
        size += len(text)
    assert max(planted_rows) < len(rows) and sum(len(r[2]) for r in rows[:max(planted_rows) + 1]) < baseline
    return rows, {t for t, _ in planted_rows.values()}


def timed(fn: Callable[..., ScanReport], *args: Any) -> tuple[ScanReport, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    report = fn(*args)
    return report, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--baseline-mb", type=float, default=8)
    parser.add_argument("--jsonl-mb", type=float, default=50,
                        help="also time the audit's own path: this many MB as a JSONL chat dataset, parsed and scanned")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    vocab = vocabulary(rng, 20_000)
    items = tasks(rng, vocab, args.tasks)
    t0 = time.perf_counter()
    rows, planted = corpus(rng, vocab, items, args.mb, args.baseline_mb)
    text_mb = sum(len(r[2]) for r in rows) / 1e6
    print(f"generated {text_mb:.1f} MB in {len(rows)} rows, {args.tasks} tasks ({len(items)} items), "
          f"{len(planted)} planted tasks, in {time.perf_counter() - t0:.1f} s")

    subset, size = [], 0
    for r in rows:
        if size >= args.baseline_mb * 1e6:
            break
        subset.append(r)
        size += len(r[2])
    sub_mb = size / 1e6

    fast, fast_cpu, fast_wall = timed(scan, rows, items, N, THRESHOLD)
    fast_sub, sub_cpu, _ = timed(scan, subset, items, N, THRESHOLD)
    base, base_cpu, base_wall = timed(scan_reference, subset, items, N, THRESHOLD)

    jsonl_line = ""
    if args.jsonl_mb > 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "dataset.jsonl"
            with open(path, "w", encoding="utf-8") as fh:
                written = 0
                for _, _, text in rows:
                    if written >= args.jsonl_mb * 1e6:
                        break
                    q, _, a = text.partition(". ")
                    fh.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                      {"role": "assistant", "content": a}]}) + "\n")
                    written += len(text)
            file_mb = path.stat().st_size / 1e6
            via_jsonl, jsonl_cpu, _ = timed(scan, dataset_rows(path, "bench-ds"), items, N, THRESHOLD)
        jsonl_line = (f"JSONL path    : {file_mb:8.1f} MB file ({via_jsonl.bytes_scanned / 1e6:.1f} MB of text)  "
                      f"cpu {jsonl_cpu:7.2f} s  {file_mb / jsonl_cpu:7.1f} MB/s/core (json.loads per row included)")

    fast_rate, base_rate = text_mb / fast_cpu, sub_mb / base_cpu
    print(f"numpy scanner : {text_mb:8.1f} MB  cpu {fast_cpu:7.2f} s  wall {fast_wall:7.2f} s  "
          f"{fast_rate:7.1f} MB/s/core   (on the baseline's slice: {sub_mb / sub_cpu:.1f} MB/s/core)")
    print(f"set-of-tuples : {sub_mb:8.1f} MB  cpu {base_cpu:7.2f} s  wall {base_wall:7.2f} s  "
          f"{base_rate:7.1f} MB/s/core")
    if jsonl_line:
        print(jsonl_line)
    print(f"ratio         : {fast_rate / base_rate:.1f}x   (goal >= 5x; goal >= 50 MB/s/core: "
          f"{'met' if fast_rate >= 50 else 'NOT met'})")
    same = set(fast.contaminated) == set(base.contaminated) == set(fast_sub.contaminated) == {
        f"synthetic/{t.split('/')[-1]}" for t in planted}
    agree = all(abs(fast_sub.tasks[t].overlap - o.overlap) < 1e-12 for t, o in base.tasks.items())
    print(f"planted tasks : {sorted(planted)}")
    print(f"found (numpy) : {fast.contaminated}")
    print(f"found (base)  : {base.contaminated}")
    print(f"same planted tasks found: {same}; per-task overlaps agree on the slice: {agree}")
    if not (same and agree):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
