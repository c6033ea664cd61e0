"""The contamination audit: normalisation, benchmark items, the fast scanner against the plain
reference, and the check's verdict on a real store (services/records/audits/contamination.py)."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit.config import AuditConfig, GymConfig
from kit.settings import StoreSettings
from services.evaluation.registry import BenchmarkRegistry
from services.models.synthetic import pretraining_corpus, subtraction
from services.records.audits import contamination as c
from services.records.audits.contamination import Item, benchmark_items, normalise, scan, scan_reference
from services.records.audits.context import AuditContext
from services.records.events import EventLog
from storage.store import Store, sqlite_url

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Item]]:
    """Items of the bundled benchmarks as a gym registers them: the repository's dev split and the
    official split the gym draws at registration (here from a fixed seed file, so runs agree)."""
    root = tmp_path_factory.mktemp("gym")
    (root / "seed").write_text("contamination-tests-" + "0" * 44)
    store = Store(sqlite_url(root), StoreSettings())
    store.migrate()
    registry = BenchmarkRegistry(store, root / "benchmarks")
    for name in ("arithmetic", "shell"):
        registry.register(SHIPPED / name, seed_file=root / "seed")
    yield benchmark_items(registry)
    store.dispose()


def question(items: list[Item], task: str) -> str:
    return next(i.text for i in items if i.task == task and i.field == "question")


def same_question(items: list[Item], task: str) -> set[str]:
    """Every task whose question reads like ``task``'s (the shell benchmark repeats some instructions)."""
    want = normalise(question(items, task))
    return {i.task for i in items if i.field == "question" and normalise(i.text) == want}


def rows(*texts: str) -> list[tuple[str, int, str]]:
    return [("ds_1", n, t) for n, t in enumerate(texts, start=1)]


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(("raw", "want"), [
    ("What is 83 - 76?", "what is 83 - 76"),
    ("WHAT   IS\t83-76 ?!", "what is 83 - 76"),
    ("what is 83 − 76", "what is 83 - 76"),          # U+2212 minus
    ("what is ８３ – ７６", "what is 83 - 76"),         # fullwidth digits (NFKC), en dash
    ("What is 83 + 76?", "what is 83 + 76"),          # a different question, not the same words
    ("12 + 7 = ?", "12 + 7 ="),
    ("state-of-the-art, re-cased", "state of the art re cased"),
    ("con\u00adtami\u200bnation", "contamination"),   # soft hyphen and zero-width space cannot split words
    ("Straße «quoted» … end", "strasse quoted end"),
    ("line one\nline two\u2028three", "line one line two three"),
])
def test_normalise(raw: str, want: str) -> None:
    assert normalise(raw) == want


_ALPHABET = st.sampled_from(list("ab9 7-–−+=?.,!\n\t\x00\u00adÄé×ß«»'\"$|\u2028\u3000ＡＢ１"))


@given(st.lists(st.text(_ALPHABET, max_size=30) | st.text(st.sampled_from("ab1"), min_size=60, max_size=90),
                min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_chunk_tokenizer_reads_every_row_like_normalise(texts: list[str]) -> None:
    """The numpy tokenizer and the plain normalisation agree word for word, rows kept apart."""
    clean = [t.replace("\x00", " ") for t in texts]
    tok = c._Hasher().tokens(c._prepare_chunk("\x00".join(clean)))
    got = [tok.data[int(s):int(e)].decode("utf-8") for s, e in zip(tok.start, tok.end, strict=True)]
    want: list[str] = []
    for k, t in enumerate(clean):
        want += (["\x00"] if k else []) + normalise(t).split()
    assert got == want


# --------------------------------------------------------------------------- benchmark items


def test_items_of_the_shipped_benchmarks_cover_every_split(shipped: list[Item]) -> None:
    by_field: dict[str, set[str]] = defaultdict(set)
    for it in shipped:
        by_field[it.field].add(it.task)
    assert len({i.task for i in shipped}) == 240
    assert {i.split for i in shipped} == {"dev", "official"}  # the hidden split too
    assert len(by_field["question"]) == 240
    arithmetic = [i for i in shipped if i.task == "arithmetic/sub-0001"]
    assert {i.field: i.text.strip() for i in arithmetic} == {"question": "What is 83 - 76?", "answer": "7"}
    shell = {i.field: i.text for i in shipped if i.task == "shell/sh-0030"}
    assert set(shell) == {"question", "solution"}  # the answer is computed: the oracle script stands for it
    assert "sort -n /app/numbers.txt" in shell["solution"] and "#" not in shell["solution"]


# --------------------------------------------------------------------------- flagging


LONG_TASK = "shell/sh-0002"  # a question of 20+ words


def disguise(text: str, how: str) -> str:
    if how == "recased":
        return text.upper()
    if how == "repunctuated":
        return text.replace("?", " !").replace(".", ";").replace("/", " / ").replace("(", "[").replace(")", "]")
    if how == "respaced":
        return "\n\n   ".join(text.split(" "))
    if how == "wrapped":
        return f"Some notes from a forum post. {text} Hope that helps, good luck with the homework!"
    return text


@pytest.mark.parametrize("how", ["verbatim", "recased", "repunctuated", "respaced", "wrapped"])
def test_long_question_in_training_data_is_flagged(shipped: list[Item], how: str) -> None:
    text = question(shipped, LONG_TASK)
    assert len(normalise(text).split()) >= 13
    data = rows("An unrelated first row about rivers and stones.", disguise(text, how))
    report = scan(data, shipped, 13, 0.5)
    exact = same_question(shipped, LONG_TASK)
    assert exact <= set(report.contaminated) and all(report.tasks[t].overlap == 1.0 for t in exact)
    # templated questions one word apart share half their 13-grams, so they reach 0.5 as well
    assert report.contaminated == scan_reference(data, shipped, 13, 0.5).contaminated
    assert {t for t in report.contaminated if t.startswith("arithmetic/")} == set()
    evidence = report.matches_of(LONG_TASK)
    assert evidence and evidence[0].dataset_id == "ds_1" and evidence[0].row == 2
    assert "«" in evidence[0].training_excerpt


@pytest.mark.parametrize("how", ["verbatim", "recased", "repunctuated", "respaced", "wrapped"])
def test_short_question_in_training_data_is_flagged(shipped: list[Item], how: str) -> None:
    text = question(shipped, "arithmetic/sub-0001")  # What is 83 - 76?
    assert len(normalise(text).split()) < 13
    report = scan(rows(disguise(text, how)), shipped, 13, 0.5)
    assert report.contaminated == ["arithmetic/sub-0001"]
    assert report.matches_of("arithmetic/sub-0001")[0].row == 1


def test_short_answers_count_only_with_their_question(shipped: list[Item]) -> None:
    chat = json.dumps({"messages": [{"role": "user", "content": "what is 83-76"},
                                    {"role": "assistant", "content": "The answer is 7."}]})
    text = c.row_text(json.loads(chat))
    report = scan(rows(text), shipped, 13, 0.5)
    assert report.tasks["arithmetic/sub-0001"].items == {"question": 1.0, "answer": 1.0}
    assert any(m.field == "answer" and "7" in m.training_excerpt for m in report.matches_of("arithmetic/sub-0001"))

    # "7" alone, or after another question, or in the next row, is not this task's answer
    bare = scan(rows("7", "What is 90 - 83? 7", "what is 83 - 76", "7"), shipped, 13, 0.5)
    assert bare.tasks["arithmetic/sub-0001"].items["answer"] == 0.0
    assert bare.tasks["arithmetic/sub-0001"].items["question"] == 1.0


def test_short_answer_after_a_long_question(tmp_path: Path) -> None:
    q = ("Read the report in the attached folder carefully and then tell me which of the listed "
         "cities had the warmest recorded night during the whole of last winter")
    items = [Item("t1", "weather", "official", "question", q), Item("t1", "weather", "official", "answer", "Oslo")]
    tail = " ".join(q.split()[-13:])  # only the question's last n-gram: overlap below the threshold
    found = scan(rows(f"{tail}? It was Oslo, surprisingly."), items, 13, 0.5)
    assert found.tasks["weather/t1"].items["answer"] == 1.0 and found.contaminated == ["weather/t1"]
    far = scan(rows(f"{tail}? " + "filler " * 20 + "Oslo"), items, 13, 0.5)
    assert far.tasks["weather/t1"].items["answer"] == 0.0 and far.contaminated == []


def test_clean_generated_data_passes(shipped: list[Item]) -> None:
    """The tiny model's pre-training mix, and addition questions on the very operands of the
    subtraction benchmark (which read the same once symbols are dropped)."""
    corpus = [c.row_text({"messages": m}) for m in pretraining_corpus(3000, seed=5)]
    operands = [normalise(i.text).split() for i in shipped if i.benchmark == "arithmetic" and i.field == "question"]
    corpus += [f"What is {w[2]} + {w[4]}? {int(w[2]) + int(w[4])}" for w in operands]
    report = scan(rows(*corpus), shipped, 13, 0.5)
    assert report.contaminated == []
    assert report.bytes_scanned == sum(len(t.encode()) for t in corpus)


def test_generated_subtraction_hitting_a_benchmark_question_is_flagged(shipped: list[Item]) -> None:
    """Random subtraction data is clean only where it misses the benchmark's questions."""
    rng = random.Random(3)
    rows_ = [subtraction(rng) for _ in range(400)]
    corpus = [c.row_text({"messages": m}) for m in rows_]  # the trained text: chat markup around the turns
    questions = {normalise(i.text): i.task for i in shipped if i.benchmark == "arithmetic" and i.field == "question"}
    expected = sorted({questions[q] for m in rows_ if (q := normalise(m[0]["content"])) in questions})
    assert scan(rows(*corpus), shipped, 13, 0.5).contaminated == expected


def synthetic_benchmark(root: Path) -> Path:
    """A small benchmark on disk in the shipped layout: one long question, one short one."""
    bench = root / "quiz"
    (bench / "dev").mkdir(parents=True)
    (bench / "benchmark.toml").write_text(
        'name = "quiz"\ndescription = "d"\nversion = "1"\n[splits.dev]\nhidden = false\n[splits.official]\nhidden = true\n')
    long_q = " ".join(f"w{k}" for k in range(24))  # 24 words: 12 thirteen-grams
    for split, tid, q, a in (("dev", "q-1", long_q, "done"), ("official", "q-2", "Capital of Peru?", "Lima")):
        task = bench / split / tid
        (task / "solution").mkdir(parents=True)
        (task / "instruction.md").write_text(q + "\n")
        (task / "task.toml").write_text('[metadata]\nkind = "qa"\nanswer_file = "/app/answer.txt"\n')
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n# Oracle.\necho '{a}' > /app/answer.txt\n")
    return bench


def test_threshold_is_honoured(tmp_path: Path) -> None:
    items = benchmark_items(synthetic_benchmark(tmp_path))
    assert {(i.task, i.field): i.text.strip() for i in items if i.field == "answer"} == {
        ("quiz/q-1", "answer"): "done", ("quiz/q-2", "answer"): "Lima"}
    half = " ".join(f"w{k}" for k in range(18))  # the first 18 words: 6 of the 12 n-grams
    for fn in (scan, scan_reference):
        assert fn(rows(half), items, 13, 0.4).contaminated == ["quiz/q-1"]
        assert fn(rows(half), items, 13, 0.6).contaminated == []
        assert fn(rows(half), items, 13, 0.6).tasks["quiz/q-1"].overlap == 0.5
    short = scan(rows("Q: capital of PERU!!"), items, 13, 0.5)
    assert short.contaminated == ["quiz/q-2"] and short.tasks["quiz/q-2"].items == {"question": 1.0, "answer": 0.0}


def test_min_item_words_leaves_tiny_items_out(tmp_path: Path) -> None:
    items = benchmark_items(synthetic_benchmark(tmp_path))
    assert scan(rows("capital of peru"), items, 13, 0.5, min_item_words=4).contaminated == []


def test_row_boundaries_do_not_join_ngrams(tmp_path: Path) -> None:
    items = [Item("t", "b", "dev", "question", " ".join(f"x{k}" for k in range(13)))]  # exactly one n-gram
    first, second = " ".join(f"x{k}" for k in range(6)), " ".join(f"x{k}" for k in range(6, 13))
    for fn in (scan, scan_reference):
        assert fn(rows(first, second), items, 13, 0.5).tasks["b/t"].overlap == 0.0
        assert fn(rows(first + " " + second), items, 13, 0.5).tasks["b/t"].overlap == 1.0
    # a short question split over two rows is not found either
    short = [Item("s", "b", "dev", "question", "what is 83 - 76")]
    assert scan(rows("what is 83", "- 76"), short, 13, 0.5).contaminated == []
    assert scan(rows("what is 83\x00- 76"), short, 13, 0.5).contaminated == ["b/s"]  # NUL inside a row is text


# --------------------------------------------------------------------------- fast == reference

_WORDS = ["alpha", "beta", "gamma", "Delta", "7", "12", "x", "é", "-", "+", "?", "...", "Straße",
          "supercalifragilistic", "supercalifragilistix", "lo" * 40, "lo" * 40 + "ng"]  # 9-64 bytes, and longer


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[Item], list[str], int]:
    n = draw(st.integers(3, 6))
    phrase = st.lists(st.sampled_from(_WORDS), min_size=1, max_size=14).map(" ".join)
    items: list[Item] = []
    for t in range(draw(st.integers(1, 5))):
        items.append(Item(f"t{t}", "r", "dev", "question", draw(phrase)))
        if draw(st.booleans()):
            items.append(Item(f"t{t}", "r", "dev", "answer", draw(phrase)))
    texts = draw(st.lists(st.lists(st.sampled_from(_WORDS + ["\n", ",", "  "]), max_size=60).map(" ".join),
                          min_size=1, max_size=8))
    # plant some item texts (or halves of them) so that matches happen
    for it in items:
        if draw(st.booleans()):
            k = draw(st.integers(0, len(texts) - 1))
            cut = draw(st.integers(0, len(it.text)))
            texts[k] = texts[k] + " " + (it.text if draw(st.booleans()) else it.text[cut:])
    return items, texts, n


@given(scenario(), st.sampled_from([0.3, 0.5, 1.0]), st.sampled_from([40, 10_000]))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_scanner_agrees_with_reference(case: tuple[list[Item], list[str], int], threshold: float,
                                            chunk: int) -> None:
    items, texts, n = case
    fast = scan(rows(*texts), items, n, threshold, chunk_chars=chunk)  # small chunks: many per scan
    ref = scan_reference(rows(*texts), items, n, threshold)
    assert {t: o.items for t, o in fast.tasks.items()} == {t: o.items for t, o in ref.tasks.items()}
    assert fast.contaminated == ref.contaminated
    assert fast.bytes_scanned == ref.bytes_scanned and fast.rows_scanned == ref.rows_scanned
    for m in fast.matches:  # every quoted match names a row that holds the item's words
        assert m.row in range(1, len(texts) + 1)


# --------------------------------------------------------------------------- the check on a store


def test_check_contamination_on_registered_benchmarks(store: Store, tmp_path: Path) -> None:
    registry = BenchmarkRegistry(store, tmp_path / "data" / "benchmarks")
    registry.register(SHIPPED / "arithmetic")
    registered = benchmark_items(Path(registry.get("arithmetic").path))  # with the official split drawn there
    assert benchmark_items(registry) == benchmark_items(store) == registered
    assert {i.split for i in registered} == {"dev", "official"}
    data_dir = tmp_path / "data"
    (data_dir / "datasets").mkdir(parents=True)

    def blob(lines: list[dict[str, object]]) -> str:
        raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
        sha = hashlib.sha256(raw).hexdigest()
        (data_dir / "datasets" / f"{sha}.jsonl").write_bytes(raw)
        return sha

    clean = blob([{"messages": m} for m in pretraining_corpus(200, seed=1)])
    dirty = blob([{"prompt": "Warm-up: what is 2 + 2?", "completion": "4"},
                  {"prompt": "WHAT IS 83-76", "completion": "7"}])
    ctx = AuditContext(store, GymConfig(audit=AuditConfig(ngram=13, contamination_threshold=0.5)), data_dir,
                       EventLog(store, secrets.token_hex(8)), "run_x")

    flagged = c.check_contamination(ctx, [("ds_clean", clean), ("ds_dirty", dirty)])
    assert flagged.verdict == "flag"
    assert [(f.category, f.code, f.task_ids) for f in flagged.findings] == [
        ("test_set_contamination", "EXECUTED", ["arithmetic/sub-0001"])]
    assert "ds_dirty row 2" in flagged.findings[0].evidence and "83 - 76" in flagged.findings[0].evidence
    assert flagged.details["overlap"] == {"arithmetic/sub-0001": 1.0}

    passed = c.check_contamination(ctx, [("ds_clean", clean)])
    assert passed.verdict == "pass" and [f.code for f in passed.findings] == ["NOT_OBSERVED"]
    assert passed.view()["findings"][0]["task_ids"] == []

    missing = c.check_contamination(ctx, [("ds_gone", "0" * 64)])
    assert missing.verdict == "inconclusive" and missing.findings[0].code == "INCONCLUSIVE"
