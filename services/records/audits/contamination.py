"""Contamination audit: word n-gram overlap between training data and every benchmark task.

**Normalisation** (:func:`normalise`; one definition for task texts and training text alike):
Unicode NFKC, casefold, then per character: punctuation and symbols (categories ``P*``/``S*``),
separators (``Z*``) and control characters become spaces; format characters (``Cf``: soft hyphens,
zero-width spaces) are deleted so they cannot split a word. Two exceptions keep arithmetic
readable: a *math symbol* (``Sm``: ``+ = < > × ÷ …``) is a word of its own, and a dash (any ``Pd``
or U+2212) between two numbers (only spaces or punctuation between them) is the word ``-``. Without them
"What is 83 + 76?" and "What is 83 - 76?" would both read ``what is 83 76`` (clean addition data
would match a subtraction benchmark) and "12 + 7 = ?" would shrink to ``12 7``, which occurs
everywhere. Whitespace is then collapsed; the words are the maximal runs of non-space. Before the per-character
rules, the chat format's markup (``<|im_start|>``, ``<tool_call>`` …; services/models/chat_format.py)
and the JSON escapes ``\\n``, ``\\r``, ``\\t`` become spaces: training text is read as the model is
trained on it (services/models/training_text.py), with the template's turns and tool-call JSON
around the words, and neither may push an answer away from its question or glue two words
together (an escaped newline would otherwise join the lines of a script).

**Items** (:func:`benchmark_items`): per task of every split (hidden ones too) the instruction
(``question``) and the reference answer. For a task with an ``answer_file`` the answer is the
literal the oracle writes there (``echo 7 > /app/answer.txt`` → ``answer`` = "7"); otherwise the
oracle script itself (shebang and comments left out) is the task's ``solution``.

**Matching**, with ``n`` = ``GymConfig.audit.ngram`` and training rows never joined into one
another (no n-gram, span or pair crosses a row boundary):

* an item of at least ``n`` words: overlap = share of its n-gram positions whose n-gram occurs in
  the training data;
* a shorter item: matched whole, as a run of whole words (overlap 1.0 or 0.0);
* a short *answer* is matched only together with its task's question: it must start within ``n``
  words after an occurrence of the question (the whole question when it is short, else its last
  n-gram) in the same row. A bare "19" occurs in any text with numbers; "what is 26 - 7 … 19"
  does not;
* items with fewer than ``min_item_words`` words are not matched at all.

A task's overlap is the largest of its items'; it is contaminated when that reaches the threshold.

**Speed**: rows are joined into chunks (``\\x00`` between rows, which no normalised text
contains). A chunk is normalised with C-level string operations, then tokenised and hashed in
numpy: 64-bit polynomial hashes of each word's bytes, then of word windows via prefix sums, so a
window hash of any length costs three array operations. Membership is a byte-table prefilter and
``searchsorted`` against the sorted item hashes; only hits come back to Python, for evidence. A
hash collision can only add a match, never hide one (equal windows always hash equal).
:func:`scan_reference` is the plain-Python definition the fast scanner is tested against.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from services.evaluation.benchmarks import Benchmark, TaskRef, load_benchmark
from services.evaluation.read import registered_benchmark_paths
from services.models.chat_format import SPECIAL_TOKENS
from services.models.training_text import training_text
from services.records.audits.findings import CheckResult, Finding
from storage.store import Store

if TYPE_CHECKING:
    from services.records.audits.context import AuditContext

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

EVIDENCE_PER_ITEM = 3
"""Matches quoted per item (the overlap still counts every match)."""
CHUNK_CHARS = 2_000_000
"""Training text normalised and hashed at once (about 2 MB: the hash arrays stay in cache)."""
LONG_WORD_BYTES = 64
"""Words longer than this are hashed one by one (blake2b) instead of 8 bytes per numpy pass."""
ANCHOR_BITS = 20
EXCERPT_CONTEXT_WORDS = 6
EXCERPT_MAX_CHARS = 240


# --------------------------------------------------------------------------- normalisation

def _char_rule(ch: str) -> str:
    if ch == "-" or ch == "\u2212" or unicodedata.category(ch) == "Pd":
        return "-"
    cat = unicodedata.category(ch)
    if cat == "Sm":
        return f" {ch} "
    if cat[0] in "PSZ" or cat == "Cc":
        return " "
    if cat == "Cf":
        return ""
    return ch


class _CharTable(dict[int, str]):
    """``str.translate`` table built on demand from :func:`_char_rule`."""

    def __missing__(self, code: int) -> str:
        rule = self[code] = _char_rule(chr(code))
        return rule


_TABLE = _CharTable()
_OP_DASH = re.compile(r"([0-9]) *-(?= *[0-9])")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_OP_MARK = "\x01"  # never survives the table (a control character), so free as a placeholder
_BREAKS = re.compile("|".join(re.escape(t.casefold()) for t in SPECIAL_TOKENS) + r"|\\[nrt]")
"""The chat format's markup and JSON's whitespace escapes, matched after case folding: word breaks."""


def _fold(text: str) -> str:
    """NFKC, case folding, then markup and whitespace escapes as spaces (module docstring)."""
    return _BREAKS.sub(" ", unicodedata.normalize("NFKC", text).casefold())


def normalise(text: str) -> str:
    """The fixed normalisation of the audit (module docstring): words joined by single spaces."""
    t = _fold(text).translate(_TABLE)
    t = _OP_DASH.sub(r"\1 " + _OP_MARK + " ", t).replace("-", " ").replace(_OP_MARK, "-")
    return " ".join(t.split())


def words(text: str) -> list[str]:
    """The audit's tokenizer: the words of the normalised text."""
    return normalise(text).split()


# Byte classes of the chunk tokenizer (ASCII from the same rules; bytes >= 0x80 are word bytes
# because non-ASCII punctuation, symbols and spaces were translated before encoding).
_SPACE, _WORD, _SYM, _DASH, _SEP = 0, 1, 2, 3, 4


def _byte_classes() -> npt.NDArray[np.uint8]:
    lut = np.full(256, _WORD, dtype=np.uint8)
    for code in range(128):
        rule = _char_rule(chr(code))
        lut[code] = (_SEP if code == 0 else _DASH if rule == "-" else _SPACE if rule == " "
                     else _SYM if rule.strip() and rule != chr(code) else _WORD)
    return lut


_LUT = _byte_classes()
_CLASS_BYTES = _LUT.tobytes()  # a bytes.translate table: byte → its class


def _prepare_chunk(text: str) -> bytes:
    """NFKC, casefold, markup and escapes, the non-ASCII rules (C-level string work); ASCII is left
    to the byte pass."""
    t = _fold(text)
    if not t.isascii():
        t = _NON_ASCII.sub(lambda m: m.group().translate(_TABLE), t)
    return t.encode("utf-8")


# --------------------------------------------------------------------------- hashing

_M64 = (1 << 64) - 1
_Q = 0x9E3779B97F4A7C15  # word multiplier (odd, so invertible modulo 2**64)
_K = 0xD6E8FEB86659FD93  # folds the window length into its hash


def _inverse(a: int) -> int:
    x = a
    for _ in range(7):  # Newton: each step doubles the correct low bits
        x = (x * (2 - a * x)) & _M64
    return x


def _mix(z: U64) -> U64:
    """splitmix64's finaliser, in place on a fresh array."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


class _Powers:
    """x**i and x**-i modulo 2**64 for i < length, grown on demand."""

    def __init__(self, base: int) -> None:
        self.base, self.inv = base, _inverse(base)
        self.fwd: U64 = np.ones(1, dtype=np.uint64)
        self.back: U64 = np.ones(1, dtype=np.uint64)

    def ensure(self, length: int) -> None:
        if self.fwd.size >= length:
            return
        size = max(length, 2 * self.fwd.size)
        for name, base in (("fwd", self.base), ("back", self.inv)):
            arr = np.full(size, base, dtype=np.uint64)
            arr[0] = 1
            setattr(self, name, np.cumprod(arr, dtype=np.uint64))


@dataclass
class _Tokens:
    """One chunk, tokenised and hashed: word i is data[start[i]:end[i]]; ``sep`` marks row breaks."""

    data: bytes
    start: I64
    end: I64
    sep: npt.NDArray[np.bool_]
    word: U64  # hash of each word
    prefix: U64  # G[i] = sum_{j<i} word_hash[j] * Q**j
    seps_before: I64  # number of row breaks among words [0, i)

    @property
    def count(self) -> int:
        return int(self.start.size)

    def text(self, lo: int, hi: int) -> str:
        """The (casefolded) text of words [lo, hi), punctuation as it was, whitespace collapsed."""
        if hi <= lo:
            return ""
        return " ".join(self.data[int(self.start[lo]):int(self.end[hi - 1])].decode("utf-8", "replace").split())


class _Hasher:
    def __init__(self) -> None:
        self.q = _Powers(_Q)

    def tokens(self, data: bytes) -> _Tokens:
        """Split a prepared chunk into words and hash them (all in numpy, no per-word Python)."""
        padded = data + bytes(8)
        b = np.frombuffer(padded, dtype=np.uint8)[:len(data)]
        cls = np.frombuffer(data.translate(_CLASS_BYTES), dtype=np.uint8)
        special = np.flatnonzero(cls >= _SYM)  # single-byte words, row breaks and dashes: few
        c = np.empty(cls.size + 2, dtype=np.uint8)
        c[0] = c[-1] = _SPACE
        c[1:-1] = cls
        change = c[1:] != c[:-1]
        single = np.zeros(cls.size, dtype=np.bool_)
        single[special] = True
        is_word = cls != _SPACE
        start = np.flatnonzero(is_word & (change[:-1] | single))
        end = np.flatnonzero(is_word & (change[1:] | single)) + 1
        dashes = special[cls[special] == _DASH]
        if dashes.size:  # a dash is the word "-" between two numbers, else a space
            j = np.searchsorted(start, dashes)
            prev_digit = (j > 0) & _is_digit(b[end[np.maximum(j - 1, 0)] - 1])
            nxt = np.minimum(j + 1, start.size - 1)
            next_digit = (j + 1 < start.size) & _is_digit(b[start[nxt]])
            keep = np.ones(start.size, dtype=np.bool_)
            keep[j[~(prev_digit & next_digit)]] = False
            start, end = start[keep], end[keep]

        # word hash: its bytes read 8 at a time (unaligned little-endian loads), length folded in
        u8 = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
        length = (end - start).astype(np.uint64)
        wh = _mix(_first_bytes(u8, start, length) + length * np.uint64(_K))
        idx = np.flatnonzero(length > 8)
        off = 8
        while idx.size and off < LONG_WORD_BYTES:
            rest = length[idx] - np.uint64(off)
            wh[idx] = _mix(wh[idx] ^ _first_bytes(u8, start[idx] + off, rest))
            idx = idx[rest > 8]
            off += 8
        for k in idx.tolist():  # rare very long words: hashed whole in C, so no word costs a loop per 8 bytes
            digest = hashlib.blake2b(data[int(start[k]):int(end[k])], digest_size=8).digest()
            wh[k] = np.uint64(int.from_bytes(digest, "little"))

        t = wh.size
        self.q.ensure(t + 1)
        g = np.empty(t + 1, dtype=np.uint64)
        g[0] = 0
        np.cumsum(wh * self.q.fwd[:t], out=g[1:])
        sep = cls[start] == _SEP
        sb = np.zeros(t + 1, dtype=np.int64)
        np.cumsum(sep, out=sb[1:])
        return _Tokens(data, start.astype(np.int64, copy=False), end.astype(np.int64, copy=False), sep, wh, g, sb)

    def window(self, tok: _Tokens, pos: I64, k: int) -> U64:
        """Hashes of the k-word windows starting at ``pos`` (callers check they fit and cross no row)."""
        h = tok.prefix[pos + k] - tok.prefix[pos]
        h *= self.q.back[pos]
        h += np.uint64((_K * k) & _M64)  # word hashes are mixed already: a sum of them is uniform
        return h

    def valid_starts(self, tok: _Tokens, k: int) -> I64:
        """Starts of every k-word window inside one row."""
        if tok.count < k:
            return np.empty(0, dtype=np.int64)
        sb = tok.seps_before
        return np.flatnonzero(sb[k:] == sb[:-k]).astype(np.int64, copy=False)


def _first_bytes(u8: U64, at: I64, length: U64) -> U64:
    """The first min(length, 8) bytes at each position, as a little-endian integer."""
    shift = (np.uint64(8) - np.minimum(length, np.uint64(8))) * np.uint64(8)
    return (u8[at] << shift) >> shift


def _is_digit(v: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    return (v >= 48) & (v <= 57)


# --------------------------------------------------------------------------- benchmark items


@dataclass(frozen=True)
class Item:
    task_id: str
    benchmark: str
    split: str
    field: str
    """"question" (the instruction), "answer" (the literal the oracle writes) or "solution"."""
    text: str

    @property
    def task(self) -> str:
        """The task's id qualified by its benchmark (task ids are unique only within one)."""
        return f"{self.benchmark}/{self.task_id}"


_COMMENT = re.compile(r"^\s*#")


def _oracle_answer(script: str, answer_file: str) -> str | None:
    """The literal an oracle writes to ``answer_file`` (``echo X > F`` / ``printf X > F``), if any."""
    for line in script.splitlines():
        if _COMMENT.match(line) or answer_file not in line:
            continue
        try:
            parts = shlex.split(line, comments=True)
        except ValueError:
            continue
        if not parts or parts[0] not in ("echo", "printf") or len(parts) < 3:
            continue
        if parts[-2] not in (">", ">>") or parts[-1] != answer_file:
            continue
        args = parts[1:-2]
        if parts[0] == "echo":
            args = [a for a in args if a not in ("-n", "-e", "-E")]
        elif args and "%" in args[0]:
            args = args[1:]
        if any(ch in " ".join(args) for ch in "$`|;&"):
            return None  # computed, not a literal
        text = " ".join(args).replace("\\n", "\n").strip()
        return text or None
    return None


def task_items(benchmark: Benchmark) -> list[Item]:
    """The question and reference answer (or solution) of every task of every split."""
    items: list[Item] = []
    for split, task in benchmark.tasks():
        items.extend(_items_of(benchmark.name, split.name, task))
    return items


def _items_of(bench: str, split: str, task: TaskRef) -> list[Item]:
    out: list[Item] = []
    instruction = task.path / "instruction.md"
    if instruction.is_file():
        out.append(Item(task.id, bench, split, "question", instruction.read_text(encoding="utf-8", errors="replace")))
    solve = task.path / "solution" / "solve.sh"
    if solve.is_file():
        script = solve.read_text(encoding="utf-8", errors="replace")
        answer = _oracle_answer(script, task.answer_file) if task.answer_file else None
        if answer is not None:
            out.append(Item(task.id, bench, split, "answer", answer))
        else:
            body = "\n".join(ln for ln in script.splitlines() if ln.strip() and not _COMMENT.match(ln))
            if body:
                out.append(Item(task.id, bench, split, "solution", body))
    return out


@runtime_checkable
class BenchmarkSource(Protocol):
    """A registry of benchmarks (evaluation's ``BenchmarkRegistry``): its rows and each loaded."""

    def list(self) -> Sequence[Any]:
        """Rows with a ``name``."""
        ...

    def load(self, name: str) -> Benchmark: ...


def benchmark_items(source: Store | BenchmarkSource | Benchmark | Path | str | Iterable[Benchmark | Path | str],
                    ) -> list[Item]:
    """Items of every benchmark in ``source``: a Store or BenchmarkSource (every registered
    benchmark, from its registered copy), a Benchmark, a benchmark directory or ``.tar.gz``, a
    directory of benchmark directories (like ``benchmarks/``), or an iterable of these."""
    if isinstance(source, Store):
        return [i for p in registered_benchmark_paths(source) for i in task_items(load_benchmark(p))]
    if isinstance(source, BenchmarkSource):
        return [i for row in source.list() for i in task_items(source.load(row.name))]
    if isinstance(source, Benchmark):
        return task_items(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir() and not (path / "benchmark.toml").is_file():
            return [i for sub in sorted(path.iterdir()) if (sub / "benchmark.toml").is_file()
                    for i in task_items(load_benchmark(sub))]
        return task_items(load_benchmark(path))
    return [i for one in source for i in benchmark_items(one)]


# --------------------------------------------------------------------------- report


@dataclass
class Match:
    task: str
    """benchmark/task_id"""
    split: str
    field: str
    dataset_id: str
    row: int
    training_excerpt: str
    item_excerpt: str

    def view(self) -> dict[str, Any]:
        return {"task": self.task, "split": self.split, "field": self.field, "dataset_id": self.dataset_id,
                "row": self.row, "training_excerpt": self.training_excerpt, "item_excerpt": self.item_excerpt}


@dataclass
class TaskOverlap:
    task: str
    benchmark: str
    split: str
    overlap: float
    items: dict[str, float]
    """field → that item's overlap"""


@dataclass
class ScanReport:
    n: int
    threshold: float
    tasks: dict[str, TaskOverlap]
    matches: list[Match] = field(default_factory=list)
    bytes_scanned: int = 0
    rows_scanned: int = 0

    @property
    def contaminated(self) -> list[str]:
        """Contaminated tasks (``benchmark/task_id``), sorted."""
        return sorted(t for t, o in self.tasks.items() if o.overlap >= self.threshold)

    def matches_of(self, task: str) -> list[Match]:
        return [m for m in self.matches if m.task == task]


# --------------------------------------------------------------------------- the item index


@dataclass
class _Plan:
    """What is looked for, derived from the items once per scan."""

    n: int
    items: list[Item]
    item_words: list[list[str]]
    kind: list[str]  # "long" | "short" | "pair" | "skip" per item
    question_of: dict[int, int]  # pair answer item → its task's question item


def _plan(items: Sequence[Item], n: int, min_item_words: int) -> _Plan:
    item_words = [words(i.text) for i in items]
    questions = {(i.benchmark, i.task_id): k for k, i in enumerate(items) if i.field == "question"}
    kind: list[str] = []
    question_of: dict[int, int] = {}
    for k, (item, ws) in enumerate(zip(items, item_words, strict=True)):
        q = questions.get((item.benchmark, item.task_id))
        if not ws or len(ws) < min_item_words:
            kind.append("skip")
        elif len(ws) >= n:
            kind.append("long")
        elif item.field == "answer" and q is not None and item_words[q]:
            kind.append("pair")
            question_of[k] = q
        else:
            kind.append("short")
    return _Plan(n, list(items), item_words, kind, question_of)


def _finish(plan: _Plan, overlap: list[float], threshold: float, matches: list[Match], nbytes: int,
            nrows: int) -> ScanReport:
    tasks: dict[str, TaskOverlap] = {}
    for item, ov, kind in zip(plan.items, overlap, plan.kind, strict=True):
        t = tasks.get(item.task)
        if t is None:
            t = tasks[item.task] = TaskOverlap(item.task, item.benchmark, item.split, 0.0, {})
        if kind != "skip":
            t.items[item.field] = max(ov, t.items.get(item.field, 0.0))
            t.overlap = max(t.overlap, ov)
    return ScanReport(plan.n, threshold, tasks, matches, nbytes, nrows)


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_MAX_CHARS else text[:EXCERPT_MAX_CHARS - 1] + "…"


# --------------------------------------------------------------------------- fast scanner


class _Index:
    """Sorted hashes of every item window, and a byte table that rules most windows out at once."""

    def __init__(self, plan: _Plan, hasher: _Hasher) -> None:
        self.plan, self.hasher, n = plan, hasher, plan.n
        joined = "\x00".join(" ".join(ws) for ws in plan.item_words)
        tok = hasher.tokens(joined.encode("utf-8"))
        first = np.zeros(len(plan.items) + 1, dtype=np.int64)  # item k's words: [first[k], first[k+1]-1)
        first[1:] = np.cumsum([len(ws) + 1 for ws in plan.item_words])
        self.first = first

        # long items: every n-gram position, as (hash, item, position)
        sizes = np.array([len(ws) for ws in plan.item_words], dtype=np.int64)
        kinds = np.array(plan.kind)
        long_k = np.flatnonzero(kinds == "long").astype(np.int64, copy=False)
        counts = sizes[long_k] - n + 1
        self.ngram_item = np.repeat(long_k, counts)
        self.ngram_pos = np.arange(self.ngram_item.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        hashes = hasher.window(tok, first[self.ngram_item] + self.ngram_pos, n)
        order = np.argsort(hashes, kind="stable")
        self.ngram_hash, self.ngram_item, self.ngram_pos = hashes[order], self.ngram_item[order], self.ngram_pos[order]
        self.ngram_total = np.zeros(len(plan.items), dtype=np.int64)
        np.add.at(self.ngram_total, self.ngram_item, 1)
        self.table_bits = max(16, min(26, int(np.ceil(np.log2(max(1, self.ngram_hash.size) * 64)))))
        self.table = np.zeros(1 << self.table_bits, dtype=np.bool_)
        self.table[self.ngram_hash >> np.uint64(64 - self.table_bits)] = True

        # short items (whole) and questions of pairs: grouped by length, anchored on their first word
        self.short_items = [k for k, kind in enumerate(plan.kind) if kind == "short"]
        by_len: dict[int, list[int]] = {}
        for k in self.short_items:
            by_len.setdefault(len(plan.item_words[k]), []).append(k)
        self.short_groups: dict[int, tuple[U64, I64]] = {}
        for length, ks in by_len.items():
            karr = np.array(ks, dtype=np.int64)
            h = hasher.window(tok, first[karr], length)
            o = np.argsort(h, kind="stable")
            self.short_groups[length] = (h[o], karr[o])
        self.anchor = np.unique(tok.word[first[np.array(self.short_items, dtype=np.int64)]]) \
            if self.short_items else np.empty(0, dtype=np.uint64)
        self.anchor_table = np.zeros(1 << ANCHOR_BITS, dtype=np.bool_)
        self.anchor_table[self.anchor >> np.uint64(64 - ANCHOR_BITS)] = True

        # pairs: the answer's hash, and where its question ends (short question: whole; long: tail n-gram)
        self.pairs: dict[int, tuple[int, np.uint64]] = {}
        pair_k = np.array(sorted(plan.question_of), dtype=np.int64)
        for length in np.unique(sizes[pair_k]).tolist():
            ks = pair_k[sizes[pair_k] == length]
            self.pairs.update(zip(ks.tolist(), ((length, h) for h in hasher.window(tok, first[ks], length)),
                                  strict=True))
        self.answers_of_question: dict[int, list[int]] = {}
        for a, q in plan.question_of.items():
            self.answers_of_question.setdefault(q, []).append(a)
        tail_pos = np.full(len(plan.items), -1, dtype=np.int64)
        for qk in self.answers_of_question:
            if plan.kind[qk] == "long":
                tail_pos[qk] = len(plan.item_words[qk]) - n
        self.is_tail = tail_pos[self.ngram_item] == self.ngram_pos

    def anchored(self, tok: _Tokens) -> I64:
        """Positions whose word is the first word of some short item."""
        maybe = np.flatnonzero(self.anchor_table[tok.word >> np.uint64(64 - ANCHOR_BITS)])
        lo, hi = _lookup(self.anchor, tok.word[maybe])
        return maybe[hi > lo].astype(np.int64, copy=False)


def _lookup(keys: U64, queries: U64) -> tuple[I64, I64]:
    """For each query, the [lo, hi) range of equal keys (empty when absent)."""
    lo = np.searchsorted(keys, queries, side="left").astype(np.int64, copy=False)
    hi = np.searchsorted(keys, queries, side="right").astype(np.int64, copy=False)
    return lo, hi


def _expand(lo: I64, hi: I64) -> tuple[I64, I64]:
    """(query index, key index) for every key in every [lo, hi) range."""
    counts = hi - lo
    q = np.repeat(np.arange(lo.size, dtype=np.int64), counts)
    offsets = np.arange(q.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return q, lo[q] + offsets


class _Scanner:
    def __init__(self, items: Sequence[Item], n: int, threshold: float, min_item_words: int,
                 chunk_chars: int) -> None:
        self.hasher = _Hasher()
        self.chunk_chars = chunk_chars
        self.plan = _plan(items, n, min_item_words)
        self.index = _Index(self.plan, self.hasher)
        self.threshold = threshold
        self.found_ngram = np.zeros(self.index.ngram_hash.size, dtype=np.bool_)
        self.whole = np.zeros(len(self.plan.items), dtype=np.bool_)  # short and pair items found
        self.evidence: dict[int, int] = {}
        self.matches: list[Match] = []
        self.bytes = self.rows = 0

    # -- feeding
    def scan(self, rows: Iterable[tuple[str, int, str]]) -> ScanReport:
        batch: list[str] = []
        refs: list[tuple[str, int]] = []
        size = 0
        for dataset_id, row_no, text in rows:
            batch.append(text)
            refs.append((dataset_id, row_no))
            size += len(text)
            if size >= self.chunk_chars:
                self._chunk(batch, refs)
                batch, refs, size = [], [], 0
        if batch:
            self._chunk(batch, refs)
        return self.report()

    def report(self) -> ScanReport:
        idx, plan = self.index, self.plan
        found_per_item = np.zeros(len(plan.items), dtype=np.int64)
        np.add.at(found_per_item, idx.ngram_item[self.found_ngram], 1)
        # one n-gram position can stand under several hashes' entries only once: (item, pos) is unique
        overlap: list[float] = []
        for k, kind in enumerate(plan.kind):
            if kind == "long":
                overlap.append(float(found_per_item[k]) / float(idx.ngram_total[k]))
            else:
                overlap.append(1.0 if self.whole[k] else 0.0)
        return _finish(plan, overlap, self.threshold, self.matches, self.bytes, self.rows)

    def _chunk(self, texts: list[str], refs: list[tuple[str, int]]) -> None:
        if any("\x00" in t for t in texts):  # a row break inside a row would split it
            texts = [t.replace("\x00", " ") for t in texts]
        joined = "\x00".join(texts)
        self.rows += len(texts)
        data = _prepare_chunk(joined)
        self.bytes += (len(joined) if joined.isascii() else len(joined.encode("utf-8"))) - (len(texts) - 1)
        tok = self.hasher.tokens(data)
        self._long(tok, refs)
        if self.index.short_items:
            self._short(tok, refs)

    # -- long items: every n-gram of the chunk against the item n-grams
    def _long(self, tok: _Tokens, refs: list[tuple[str, int]]) -> None:
        idx, n = self.index, self.plan.n
        if not idx.ngram_hash.size:
            return
        starts = self.hasher.valid_starts(tok, n)
        if not starts.size:
            return
        h = self.hasher.window(tok, starts, n)
        maybe = idx.table[h >> np.uint64(64 - idx.table_bits)]
        starts, h = starts[maybe], h[maybe]
        lo, hi = _lookup(idx.ngram_hash, h)
        hit = hi > lo
        if not hit.any():
            return
        q, key = _expand(lo[hit], hi[hit])
        self.found_ngram[key] = True
        items, pos = idx.ngram_item[key], starts[hit][q]
        self._evidence(tok, refs, items, pos, n, idx.ngram_pos[key])
        tails = idx.is_tail[key]
        if tails.any():  # pairs whose question is long: its last n-gram, then the answer
            self._pairs(tok, refs, items[tails], pos[tails] + n)

    # -- short items: anchored on their first word, then the whole window
    def _short(self, tok: _Tokens, refs: list[tuple[str, int]]) -> None:
        idx = self.index
        cand = idx.anchored(tok)
        if not cand.size:
            return
        sb = tok.seps_before
        for length, (keys, karr) in idx.short_groups.items():
            c = cand[cand + length <= tok.count]
            c = c[sb[c + length] == sb[c]]
            if not c.size:
                continue
            lo, hi = _lookup(keys, self.hasher.window(tok, c, length))
            hit = hi > lo
            if not hit.any():
                continue
            q, key = _expand(lo[hit], hi[hit])
            items, pos = karr[key], c[hit][q]
            self.whole[items] = True
            self._evidence(tok, refs, items, pos, length, np.zeros(items.size, dtype=np.int64))
            self._pairs(tok, refs, items, pos + length)

    def _pairs(self, tok: _Tokens, refs: list[tuple[str, int]], questions: I64, ends: I64) -> None:
        """Answers of the questions found ending at ``ends``: starting within n words after, same row."""
        idx, n, sb = self.index, self.plan.n, tok.seps_before
        for qk in np.unique(questions).tolist():
            for a in idx.answers_of_question.get(qk, ()):
                if self.whole[a] and self.evidence.get(a, 0) >= EVIDENCE_PER_ITEM:
                    continue
                length, want = idx.pairs[a]
                e = ends[questions == qk]
                s = (e[:, None] + np.arange(n + 1, dtype=np.int64)[None, :]).ravel()
                row_of = np.repeat(sb[e], n + 1)
                ok = s + length <= tok.count
                s = s[ok][sb[s[ok] + length] == row_of[ok]]
                if not s.size:
                    continue
                got = np.flatnonzero(self.hasher.window(tok, s, length) == want)
                if got.size:
                    self.whole[a] = True
                    for p in s[got[:EVIDENCE_PER_ITEM]].tolist():
                        self._quote(a, tok, refs, p, p + length, 0)

    def _evidence(self, tok: _Tokens, refs: list[tuple[str, int]], items: I64, pos: I64, length: int,
                  item_pos: I64) -> None:
        """Quote the first hit in this chunk of every item that still wants evidence."""
        uniq, first = np.unique(items, return_index=True)
        for k, at in zip(uniq.tolist(), first.tolist(), strict=True):
            if self.evidence.get(k, 0) < EVIDENCE_PER_ITEM:
                p = int(pos[at])
                self._quote(k, tok, refs, p, p + length, int(item_pos[at]))

    def _quote(self, k: int, tok: _Tokens, refs: list[tuple[str, int]], lo: int, hi: int, item_pos: int) -> None:
        """Evidence for item k: words [lo, hi) of the chunk, with some context from their row."""
        if self.evidence.get(k, 0) >= EVIDENCE_PER_ITEM:
            return
        self.evidence[k] = self.evidence.get(k, 0) + 1
        sb = tok.seps_before
        row = int(sb[lo])
        row_lo = int(np.searchsorted(sb, row, side="left"))
        row_hi = int(np.searchsorted(sb, row + 1, side="left")) - 1 if row < int(sb[-1]) else tok.count
        a, b = max(lo - EXCERPT_CONTEXT_WORDS, row_lo), min(hi + EXCERPT_CONTEXT_WORDS, row_hi)
        before, match, after = tok.text(a, lo), tok.text(lo, hi), tok.text(hi, b)
        quoted = f"{'… ' if a > row_lo else ''}{before} «{match}» {after}{' …' if b < row_hi else ''}".strip()
        item = self.plan.items[k]
        ws = self.plan.item_words[k]
        span = " ".join(ws[item_pos:item_pos + (hi - lo)])
        dataset_id, row_no = refs[row]
        self.matches.append(Match(item.task, item.split, item.field, dataset_id, row_no, _excerpt(quoted),
                                  _excerpt(span)))


def scan(rows: Iterable[tuple[str, int, str]], items: Sequence[Item], n: int = 13, threshold: float = 0.5,
         *, min_item_words: int = 1, chunk_chars: int = CHUNK_CHARS) -> ScanReport:
    """Stream ``(dataset_id, row_no, text)`` rows against the benchmark items (module docstring)."""
    return _Scanner(items, n, threshold, min_item_words, chunk_chars).scan(rows)


# --------------------------------------------------------------------------- reference


def scan_reference(rows: Iterable[tuple[str, int, str]], items: Sequence[Item], n: int = 13,  # noqa: C901 - one pass over the reference texts with its early outs
                   threshold: float = 0.5, *, min_item_words: int = 1) -> ScanReport:
    """The plain-Python definition of :func:`scan` (sets of word tuples): slow, for tests and the bench."""
    plan = _plan(items, n, min_item_words)
    ngrams: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    short_by_first: dict[str, set[int]] = {}
    short: dict[tuple[str, ...], list[int]] = {}
    for k, (ws, kind) in enumerate(zip(plan.item_words, plan.kind, strict=True)):
        if kind == "long":
            for j in range(len(ws) - n + 1):
                ngrams.setdefault(tuple(ws[j:j + n]), []).append((k, j))
        elif kind == "short":
            short.setdefault(tuple(ws), []).append(k)
            short_by_first.setdefault(ws[0], set()).add(len(ws))
    answers_of: dict[int, list[int]] = {}
    for a, q in plan.question_of.items():
        answers_of.setdefault(q, []).append(a)
    found: set[tuple[int, int]] = set()
    whole: set[int] = set()
    nbytes = nrows = 0
    for _dataset, _row, text in rows:
        nrows += 1
        nbytes += len(text.encode("utf-8"))
        ws = words(text.replace("\x00", " "))
        ends: list[tuple[int, int]] = []  # (question item, end position)
        for i in range(len(ws)):
            if i + n <= len(ws):
                for k, j in ngrams.get(tuple(ws[i:i + n]), ()):
                    found.add((k, j))
                    if k in answers_of and j == len(plan.item_words[k]) - n:
                        ends.append((k, i + n))
            for length in short_by_first.get(ws[i], ()):
                for k in short.get(tuple(ws[i:i + length]), ()):
                    whole.add(k)
                    if k in answers_of:
                        ends.append((k, i + length))
        for q, end in ends:
            for a in answers_of[q]:
                aw = plan.item_words[a]
                if any(ws[s:s + len(aw)] == aw for s in range(end, end + n + 1)):
                    whole.add(a)
    overlap = []
    for k, kind in enumerate(plan.kind):
        if kind == "long":
            total = len(plan.item_words[k]) - n + 1
            overlap.append(sum(1 for j in range(total) if (k, j) in found) / total)
        else:
            overlap.append(1.0 if k in whole else 0.0)
    return _finish(plan, overlap, threshold, [], nbytes, nrows)


# --------------------------------------------------------------------------- datasets and the check


def row_text(row: dict[str, Any]) -> str:
    """The text of one training row: exactly what the model is trained on
    (services/models/training_text.py), tools list, decoded tool-call arguments and all."""
    return training_text(row)


def dataset_rows(path: Path, dataset_id: str) -> Iterator[tuple[str, int, str]]:
    """``(dataset_id, line number, text)`` for each row of a JSONL dataset blob, streamed. A line
    the trainer could not render (not JSON, or not a row) is scanned as it is: never skipped."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row_text(row)
            except (ValueError, TypeError, KeyError, AttributeError):
                text = line
            yield dataset_id, line_no, text


def check_contamination(ctx: AuditContext, datasets: Sequence[tuple[str, str]]) -> CheckResult:
    """Scan the lineage's datasets (``(dataset_id, sha256)``, chosen by the caller from the records)
    and the custom losses the run's jobs trained with (services/records/audits/loss_sources.py)
    against every registered benchmark; one EXECUTED finding per contaminated task. ``details``
    lists the losses (``label``: how matches name one, ``key``: ``loss:<sha256>``, their jobs and
    experiments) for the caller's attribution."""
    from services.records.audits.loss_sources import loss_rows, loss_tokenizer, run_losses

    cfg = ctx.config.audit
    try:
        items = benchmark_items(ctx.store)
    except ValueError as err:  # a registered copy that can no longer be read
        return CheckResult("contamination", "inconclusive", [Finding(
            "test_set_contamination", "INCONCLUSIVE", f"cannot read the registered benchmarks: {err}")])
    blobs = [(d, ctx.data_dir / "datasets" / f"{sha}.jsonl") for d, sha in datasets]
    missing = [d for d, p in blobs if not p.is_file()]
    details: dict[str, Any] = {"n": cfg.ngram, "threshold": cfg.contamination_threshold,
                               "datasets": [d for d, _ in blobs], "tasks_checked": len({i.task for i in items})}
    if missing:
        return CheckResult("contamination", "inconclusive", [Finding(
            "test_set_contamination", "INCONCLUSIVE",
            f"dataset blob(s) missing from the store: {', '.join(missing)}")], details)
    if not items:
        return CheckResult("contamination", "inconclusive", [Finding(
            "test_set_contamination", "INCONCLUSIVE", "no registered benchmark to compare against")], details)
    losses, unreadable = run_losses(ctx)
    tokenizers = {}
    for loss in losses:
        tokenizers[loss.sha256], problem = loss_tokenizer(ctx, loss)
        unreadable += [problem] if problem else []
    details["losses"] = [{"label": loss.label, "key": loss.key, "jobs": loss.jobs,
                          "experiments": sorted(loss.experiments)} for loss in losses]

    def rows() -> Iterator[tuple[str, int, str]]:
        for dataset_id, path in blobs:
            yield from dataset_rows(path, dataset_id)
        for loss in losses:
            yield from loss_rows(loss, tokenizers[loss.sha256])

    report = scan(rows(), items, cfg.ngram, cfg.contamination_threshold, min_item_words=cfg.min_item_words)
    details.update(bytes_scanned=report.bytes_scanned, rows_scanned=report.rows_scanned,
                   contaminated=report.contaminated,
                   overlap={t: round(o.overlap, 4) for t, o in sorted(report.tasks.items()) if o.overlap > 0},
                   matches=[m.view() for m in report.matches[:200]])
    findings = []
    for task in report.contaminated:
        o = report.tasks[task]
        quotes = "; ".join(f"{m.dataset_id} row {m.row}: \"{m.training_excerpt}\" ~ \"{m.item_excerpt}\""
                           for m in report.matches_of(task)[:EVIDENCE_PER_ITEM])
        findings.append(Finding("test_set_contamination", "EXECUTED",
                                f"{task} ({o.split}) overlap {o.overlap:.2f} >= {cfg.contamination_threshold}: "
                                f"{quotes}", task_ids=[task], submission=True))
    unread = [Finding("test_set_contamination", "INCONCLUSIVE", f"custom loss unread: {p}") for p in unreadable]
    if findings:
        return CheckResult("contamination", "flag", findings + unread, details)
    if unread:
        return CheckResult("contamination", "inconclusive", unread, details)
    top = max((o.overlap for o in report.tasks.values()), default=0.0)
    return CheckResult("contamination", "pass", [Finding(
        "test_set_contamination", "NOT_OBSERVED",
        f"{report.rows_scanned} rows ({report.bytes_scanned} bytes) of {len(blobs)} dataset(s)"
        f"{f' and {len(losses)} custom loss(es)' if losses else ''} against "
        f"{len(report.tasks)} tasks: highest overlap {top:.2f} < {cfg.contamination_threshold}")], details)
