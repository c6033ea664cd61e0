"""A generated benchmark's official answers are out of an agent's reach (issue 51, class 8).

The attack: an agent reads the whole repository — every file of the checkout and every version of
every file in its git history — and builds an answer key of every benchmark question it finds there,
then submits a harness that answers from the key (keyed by a hash of the question, so no benchmark
text shows in the harness). Up to version 1.0.0 the bundled benchmarks committed their official split:
the key held every official task, and the harness scored 1.0 on the hidden split without a model.

What holds now: the repository keeps the generator, the dev split and the training pool; the official
split is drawn at registration from a seed only the gym holds (services/evaluation/official_splits.py),
never one the repository published. So not one official question, input file or verifier is in the
repository, the same key that scores 1.0 on dev scores 0.0 on official, two gyms draw different
official splits, and one gym registering again draws the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import rsigym
from kit.settings import StoreSettings
from ops.cli.main import app as operator_cli
from services.evaluation.benchmarks import TaskRef
from services.evaluation.registry import BenchmarkRegistry
from services.evaluation.task_generators import public_draw, render_task
from storage.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN
from tests.fakes.live_gym import LiveGym, harness_archive, judged_gym, registered_tasks

REPO = Path(__file__).resolve().parents[2]
BUNDLED = ("arithmetic", "shell")
SKIP_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".demo"}
QUESTION = re.compile(r"what\s+is\s+(\d+)\s*[-\u2212]\s*(\d+)")
"""An arithmetic question in any spelling the contamination audit would also read as one."""
MIN_NEEDLE = 24
"""Shorter file contents (``river 123``) are not distinctive enough to look for in 35 MB of text."""


def _readable(data: bytes) -> str | None:
    return None if b"\0" in data else data.decode("utf-8", "replace").lower()


def repository_text() -> str:
    """Everything an agent that reads the repository reads, lower-cased: every file of the checkout
    (tracked, and untracked but not ignored) and every blob of its git history, binaries left out."""
    texts: dict[str, str] = {}
    if (REPO / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True).stdout.split(b"\0")
        paths = [REPO / rel.decode() for rel in listed if rel]
        # every object the repository holds, reachable or not: "<sha> <type> <size>\n<content>\n" each
        objects = subprocess.run(["git", "cat-file", "--batch", "--batch-all-objects"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        at = 0
        while at < len(objects):
            end = objects.index(b"\n", at)
            sha, kind, size = objects[at:end].split()
            content, at = objects[end + 1:end + 1 + int(size)], end + 2 + int(size)
            if kind == b"blob" and (text := _readable(content)) is not None:
                texts[sha.decode()] = text
    else:  # an unpacked source tree
        paths = []
        for parent, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            paths += [Path(parent) / name for name in files]
    for path in paths:
        if path.is_file() and (text := _readable(path.read_bytes())) is not None:
            texts.setdefault(str(path), text)
    return "\n\0".join(texts.values())


class Repository:
    """The repository's text and the set of its lines: a file it holds has every line among them."""

    def __init__(self, text: str):
        self.text = text
        self.lines = {line.strip() for line in text.split("\n")}
        self.questions = set(QUESTION.findall(text))

    def holds(self, content: str) -> bool:
        return all(line.strip() in self.lines for line in content.split("\n")) and content in self.text


@pytest.fixture(scope="module")
def corpus() -> Repository:
    text = repository_text()
    assert "what is 83 - 76?" in text and len(text) > 1_000_000  # the dev split and the history are in it
    return Repository(text)


def answer_key(corpus: Repository) -> dict[str, str]:
    """What the agent builds: question → answer for every arithmetic question the repository holds."""
    return {f"What is {a} - {b}?": str(int(a) - int(b)) for a, b in corpus.questions}


def distinctive_texts(task: TaskRef, public: set[str]) -> list[str]:
    """The files of a task that no public task has word for word (a shell task's instruction is often
    its template's; its inputs and verifier are its own), lower-cased and stripped."""
    out = []
    for path in sorted(p for p in task.path.rglob("*") if p.is_file() and p.name != "task.toml"):
        text = path.read_text().strip().lower()
        if len(text) >= MIN_NEEDLE and text not in public:
            out.append(text)
    return out


def found_in_repository(corpus: Repository, tasks: list[TaskRef], public: set[str]) -> list[str]:
    """What of ``tasks`` the repository holds: a question (any spelling), an input file, a verifier…"""
    found = []
    for task in tasks:
        asked = QUESTION.search((task.path / "instruction.md").read_text().lower())
        if asked and asked.groups() in corpus.questions:
            found.append(f"{task.id}: question {asked.group(0)!r}")
        found += [f"{task.id}: {text[:60]!r}" for text in distinctive_texts(task, public) if corpus.holds(text)]
    return found


@pytest.fixture(scope="module")
def gyms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, BenchmarkRegistry]]:
    """Two gyms' benchmark registries, each drawing with its own seed: ``a`` with both bundled
    benchmarks registered, ``b`` with arithmetic."""
    stores, registries = [], {}
    for label, names in (("a", BUNDLED), ("b", ("arithmetic",))):
        root = tmp_path_factory.mktemp(f"gym-{label}")
        store = Store(sqlite_url(root), StoreSettings())
        store.migrate()
        stores.append(store)
        registries[label] = BenchmarkRegistry(store, root / "benchmarks")
        for name in names:
            registries[label].register(REPO / "benchmarks" / name)
    yield registries
    for store in stores:
        store.dispose()


def _public_files() -> set[str]:
    """Every file of every task the repository publishes or once published (the dev split; the
    official split of 1.0.0, retired), lower-cased and stripped: template text is not an answer."""
    return {text.strip().lower() for name in BUNDLED for n, spec in enumerate((*public_draw(name).dev,
                                                                              *public_draw(name).retired))
            for text in render_task(name, f"t-{n}", spec).values()}


def test_no_file_of_the_repository_holds_an_official_task(corpus: Repository,
                                                          gyms: dict[str, BenchmarkRegistry]) -> None:
    public = _public_files()
    for label, registry in gyms.items():
        for row in registry.list():
            official = registry.load(row.name).splits["official"].tasks
            assert len(official) == 60 and row.splits["official"]["generated"]["seed"] == "gym"
            assert found_in_repository(corpus, official, public) == [], (label, row.name)
    # The search would have found a task the repository holds: the dev split's, in every piece.
    dev = gyms["a"].load("shell").splits["dev"].tasks[:10] + gyms["a"].load("arithmetic").splits["dev"].tasks[:10]
    assert len(found_in_repository(corpus, dev, set())) >= 20


def _questions(registry: BenchmarkRegistry, name: str) -> set[str]:
    return {(t.path / "instruction.md").read_text() for t in registry.load(name).splits["official"].tasks}


def test_two_gyms_draw_different_official_splits_and_one_gym_the_same_again(
        gyms: dict[str, BenchmarkRegistry]) -> None:
    drawn = {label: registry.get("arithmetic").splits["official"]["generated"] for label, registry in gyms.items()}
    questions = {label: _questions(registry, "arithmetic") for label, registry in gyms.items()}
    assert drawn["a"]["seed_fingerprint"] != drawn["b"]["seed_fingerprint"] and drawn["a"]["sha256"] != drawn["b"]["sha256"]
    assert len(questions["a"] & questions["b"]) < 20  # two draws of 60 from ~1,885 free questions share ~2
    again, _ = gyms["a"].register(REPO / "benchmarks" / "arithmetic", replace=True)
    assert again.splits["official"]["generated"] == drawn["a"] and _questions(gyms["a"], "arithmetic") == questions["a"]


def key_harness(key: dict[str, str]) -> str:
    """Answer from the key, looked up by a hash of the question (the harness holds no benchmark
    text); a question the key does not hold is left unanswered."""
    def h(question: str) -> str:
        return hashlib.sha256(" ".join(question.lower().split()).encode()).hexdigest()[:16]

    cases = "".join(f"  {h(q)}) echo {a} > /app/answer.txt ;;\n" for q, a in sorted(key.items()))
    return ('q="$(tr -s "[:space:]" " " < "$RSIGYM_TASK_INSTRUCTION_FILE" | tr "[:upper:]" "[:lower:]")"\n'
            'q="${q# }"; q="${q% }"\n'
            'case "$(printf "%s" "$q" | sha256sum | cut -c1-16)" in\n' + cases + "esac\nexit 0\n")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[LiveGym]:
    """A gym whose audits have a judge (the stand-in), so the clean control can be accepted."""
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    with judged_gym(tmp_path_factory.mktemp("gym"), tmp_path_factory.mktemp("bench"), standin[0],
                    teacher_secret) as served:
        yield served


def test_an_answer_key_read_from_the_repository_scores_nothing_on_the_official_split(
        live: LiveGym, corpus: Repository, monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator's side: mini's official split was drawn at registration, validated (oracle 1 and
    # empty answer 0 on every task, the drawn ones too), and is hidden from agents.
    mini = {b["name"]: b for b in live.http.get("/admin/v1/benchmarks").json()["data"]}["mini"]
    assert mini["status"] == "ready" and mini["validation"]["oracle_scored_1"] == mini["validation"]["tasks"] == 4
    assert mini["splits"]["official"]["generated"]["seed"] == "gym"
    official = registered_tasks(live.gym, "mini")
    assert found_in_repository(corpus, official, _public_files()) == []

    # The agent's side: the key of every question the repository holds, in a harness.
    key = answer_key(corpus)
    assert len(key) >= 2000  # the dev split, the training pool, the retired 1.0.0 official split...
    # ...which git history keeps: against the official split the repository committed, this key scored 1.0.
    assert {spec.instruction.strip() for spec in public_draw("arithmetic").retired} <= set(key)
    run = live.key(track="harness")
    agent = rsigym.Gym(base_url=live.url, api_key=run["key"], timeout=120)
    assert list({b.name: b for b in agent.evaluation.benchmarks()}["mini"].splits) == ["dev"]
    harness = agent.evaluation.upload_harness(harness_archive("answer-key", key_harness(key)))
    dev = agent.evaluation.wait(agent.evaluation.run("mini", model="tiny", split="dev", harness=harness.id).id,
                                timeout=300)
    assert dev.status == "succeeded" and dev.score == 1.0  # where the answers are in the repository, it works
    agent.submit(harness=harness.id)

    monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
    result = CliRunner().invoke(operator_cli, ["score", run["id"], "--benchmark", "mini", "--wait", "--json",
                                               "--poll", "0.5", "--url", live.url])
    assert result.exit_code == 0, result.output
    scored: dict[str, Any] = json.loads(result.stdout)
    row = next(r for r in scored["data"] if r["run_id"] == run["id"])
    print(f"\nanswer key of {len(key)} questions: dev {dev.score}, official avg@3 {row['score']}, "
          f"audit {scored['audit']['status']}")
    assert row["split"] == "official" and row["attempts"] == 3 and row["score"] == 0.0
    # The audit after scoring flags it too: a table of 2,000 hashed questions in a harness.
    audit = json.loads(CliRunner().invoke(operator_cli, ["audit", run["id"], "--json", "--url", live.url]).stdout)
    assert scored["audit_after_scoring"]["status"] == audit["status"] == "flagged"
    assert {c["name"]: c["verdict"] for c in audit["checks"]}["harness"] == "flag", audit["checks"]

    # A clean control of the same shape (a shell harness, submitted and scored the same way): it
    # computes the answer, scores on the official split as on dev, and is accepted.
    clean = live.key(track="harness")
    honest = rsigym.Gym(base_url=live.url, api_key=clean["key"], timeout=120)
    honest.submit(harness=honest.evaluation.upload_harness(harness_archive("compute", COMPUTE)).id)
    result = CliRunner().invoke(operator_cli, ["score", clean["id"], "--benchmark", "mini", "--wait", "--json",
                                               "--poll", "0.5", "--url", live.url])
    assert result.exit_code == 0, result.output
    controlled: dict[str, Any] = json.loads(result.stdout)
    [control] = [r for r in controlled["data"] if r["run_id"] == clean["id"]]
    assert control["score"] == 1.0 and controlled["audit_after_scoring"]["status"] == "accepted", controlled


COMPUTE = """q="$(cat "$RSIGYM_TASK_INSTRUCTION_FILE")"
set -- $(printf '%s' "$q" | grep -oE '[0-9]+ - [0-9]+' | head -n 1)
echo $(( $1 - $3 )) > /app/answer.txt
"""
