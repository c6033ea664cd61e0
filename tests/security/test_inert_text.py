"""Agent-written text is inert wherever an operator reads it (kit/display_text.py).

The attacker is the research agent: it names what it makes (child keys, experiments, datasets,
harness files), writes annotations and talks to its own model, and puts in those strings what
drives a terminal (OSC 52 writes the operator's clipboard, ``ESC [2J`` clears the screen, ``\\r``
overwrites a line, U+009B is a one-byte CSI, U+202E reverses what follows), Rich markup
(``[link=file:///etc/passwd]``) and Markdown / HTML. The operator then runs the real CLI against
the real gym: no control character reaches the output, the markup is shown as the text it is, the
Markdown files escape it, ``--json`` gives the strings back exactly as written, and the text
access log keeps one line per request whatever the path holds.
"""

from __future__ import annotations

import io
import json
import logging
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kit.config import GymConfig, LoggingConfig
from ops.builder import Gym
from ops.cli.main import app as operator_cli
from ops.launcher import RunRecord, runs_root
from services.evaluation.report import build_report_rows, group_rows, write_report
from tests.conftest import ADMIN_TOKEN, TEACHER_ENV, bearer, client_for, create_key, gym_config
from tests.fakes.servers import serve_gym

MARKUP = "[link=file:///etc/passwd]x[/link][red]R[/]"
ATTACK = f"\x1b]52;c;ZXZpbA==\x07\x1b[2J\rok\x9b31m{MARKUP}\u202eZ"
"""Every kind of trick at once; each string an agent controls below carries it."""
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What must never reach the operator's screen (newline and tab are the CLI's own)."""
WIDE = {"COLUMNS": "600"}


def assert_inert(out: str, *, whole: bool = True) -> None:
    """No control character in ``out``; and, where the attack is shown ``whole`` (not cut to a
    column's width), its escape sequence written out and its markup shown as the text it is."""
    found = CONTROL.search(out)
    assert found is None, f"control {found.group()!r} reached the operator: {out[max(0, found.start() - 80):found.end() + 80]!r}"
    if whole:
        assert "\\x1b]52;c;ZXZpbA==\\x07" in out  # what the agent tried is visible, not acted on
        assert MARKUP in out  # not a link, not a colour


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(operator_cli, list(args), env=WIDE)
    assert result.exit_code == code, result.output
    return result.output


def harness_archive() -> bytes:
    """A harness whose file name is the attack and whose code writes the reward file (the audit
    quotes both in its finding)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name, data in (("harness.toml", b'[harness]\nname = "h"\nrun = "python main.py"\n'),
                           (f"h{ATTACK}<img src=x onerror=alert(1)>.py",
                            b'open("/logs/verifier/reward.txt", "w").write("1")  # ' + ATTACK.encode() + b"\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def attacked(make_gym: Callable[..., Gym], standin: tuple[str, Any], monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A gym where a run's agent has written the attack into everything it can name."""
    base = gym_config(standin[0])
    agent_model = {"name": "agent-llm", "litellm_model": "openai/teacher", "api_base": standin[0],
                   "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    config = base.model_copy(update={"agent_models": GymConfig.model_validate({"agent_models": [agent_model]}).agent_models})
    gym = make_gym(config=config)
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        run = create_key(client, 2.0, track="joint", name="operator-named", agent_budget_usd=1.0)
        agent = bearer(run["key"])
        child = client.post("/v1/keys", json={"name": ATTACK, "budget_usd": 0.01}, headers=agent)
        assert child.status_code == 201, child.text
        experiment = client.post("/records/v1/experiments", json={"name": f"exp {ATTACK}", "note": ATTACK}, headers=agent)
        assert experiment.status_code == 201, experiment.text
        note = client.post("/records/v1/annotations", headers=agent, json={
            "kind": "hypothesis", "statement": ATTACK, "experiment_ids": [experiment.json()["id"]]})
        assert note.status_code == 201, note.text
        dataset = client.post("/training/v1/datasets", params={"name": ATTACK}, headers=agent,
                              content=json.dumps({"prompt": "1+1", "completion": "2"}).encode() + b"\n")
        assert dataset.status_code == 201, dataset.text
        turn = client.post("/agent/v1/chat/completions", headers=agent, json={
            "model": "agent-llm", "max_tokens": 4, "messages": [{"role": "user", "content": ATTACK}]})
        assert turn.status_code == 200, turn.text
        harness_run = create_key(client, 1.0, track="harness")  # a harness-only submission
        harness = client.post("/evaluation/v1/harnesses", content=harness_archive(), headers=bearer(harness_run["key"]))
        assert harness.status_code == 201, harness.text
        submitted = client.post("/evaluation/v1/submissions", headers=bearer(harness_run["key"]),
                                json={"harness": harness.json()["id"]})
        assert submitted.status_code == 201, submitted.text
        yield {"run": run, "child": child.json(), "harness_run": harness_run, "out": tmp_path / "audit"}


def test_cli_tables_and_watch_show_agent_text_as_plain_text(attacked: dict[str, Any]) -> None:
    run_id = attacked["run"]["id"]
    for args in (("keys", "list"), ("keys", "show", attacked["child"]["id"]), ("records", run_id, "experiments"),
                 ("watch", run_id, "--once")):
        assert_inert(cli(*args))
    assert_inert(cli("list", "datasets", "--run", run_id), whole=False)  # cells cut to 40 characters
    assert_inert(cli("records", run_id, "events"), whole=False)  # a JSON excerpt per event, cut to 80


def test_json_output_keeps_the_agent_text_exactly(attacked: dict[str, Any]) -> None:
    """--json is for programs: the strings come back as they were written (JSON escapes them)."""
    keys = json.loads(CliRunner().invoke(operator_cli, ["keys", "list", "--json"]).stdout)["data"]
    assert ATTACK in [k.get("name") for k in keys]
    experiments = json.loads(CliRunner().invoke(operator_cli, ["records", attacked["run"]["id"], "experiments",
                                                               "--json"]).stdout)["data"]
    assert f"exp {ATTACK}" in [e["name"] for e in experiments]


def test_audit_findings_quote_harness_file_names_inertly(attacked: dict[str, Any]) -> None:
    """The harness check quotes a file's name and line; the CLI and audit.md show them inertly, and
    audit.md escapes the Markdown and HTML in them."""
    out = cli("audit", attacked["harness_run"]["id"], "--out", str(attacked["out"]), code=2)  # flagged: it writes the reward
    assert CONTROL.search(out) is None
    md = (attacked["out"] / "audit.md").read_text(encoding="utf-8")
    assert "reward" in md and CONTROL.search(md) is None
    assert re.search(r"(?<!\\)<img", md) is None and "\\<img src=x onerror=alert(1)\\>" in md  # shown, not rendered
    assert "[red]" not in md and "\\[red\\]R\\[/\\]" in md  # link syntax escaped
    assert "\\\\x1b" in md  # the escape sequence is named (its backslash escaped for Markdown)


def test_agent_logs_keep_their_lines_and_lose_their_escapes(attacked: dict[str, Any], tmp_path: Path) -> None:
    """``rsigym run logs`` prints what the agent wrote to stdout: lines and tabs kept, every other
    control written out."""
    data = tmp_path / "data"
    run_dir = runs_root(data) / "run-1"
    run_dir.mkdir(parents=True)
    record = RunRecord(run="run-1", key_id=attacked["run"]["id"], task="t", agent="a", pid=2**22 + 1,
                       started_at="2026-01-01T00:00:00+00:00", deadline_s=60.0, status="exited", exit_code=0)
    (run_dir / "run.json").write_text(record.model_dump_json())
    (run_dir / "agent.log").write_text(f"step 1\tok\n{ATTACK}\nstep 2\n")
    out = cli("run", "logs", "run-1", "--data-dir", str(data))
    assert_inert(out)
    assert out.startswith("step 1\tok\n") and out.endswith("\nstep 2\n")


def test_report_tables_and_markdown_show_agent_names_inertly(tmp_path: Path) -> None:
    """The RSI-Index report names a run's agent (the key's name when the score has none)."""
    def score(run: str, value: float) -> dict[str, Any]:
        return {"id": f"score-{run}", "run_id": run, "benchmark": "mini", "split": "official", "attempts": 3,
                "model": "tiny", "harness": "minimal", "status": "succeeded", "score": value,
                "created_at": "2026-01-01T00:00:00"}

    rows, _ = build_report_rows([score("initial", 0.2), score("key_run", 0.6)],
                                [{"id": "key_run", "name": ATTACK, "track": "joint"}])
    screen = io.StringIO()
    files = write_report(group_rows(rows), tmp_path / "report", Console(file=screen, width=600))
    assert_inert(screen.getvalue())
    md = files.markdown.read_text(encoding="utf-8")
    assert CONTROL.search(md) is None and re.search(r"(?<!\\)\[link=", md) is None
    assert "\\[link=file:///etc/passwd\\]x\\[/link\\]" in md  # Markdown shows it, links nothing
    assert [a["agent"] for a in json.loads(files.json.read_text())["agents"]] == [ATTACK]  # JSON keeps it exactly


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_path_cannot_forge_an_access_log_line(make_gym: Callable[..., Gym], standin: tuple[str, Any],
                                                caplog: pytest.LogCaptureFixture, fmt: str) -> None:
    """``/%0aFORGED%20status=200`` decodes to a newline and a space: the text line writes them as
    ``\\x0a`` and ``\\x20``, so each request stays one line of the seven known fields."""
    config = gym_config(standin[0]).model_copy(update={"logging": LoggingConfig(access=fmt)})
    client = client_for(make_gym(config=config))
    run = create_key(client, 1.0)
    paths = ["/%0a2026-01-01 access request_id=req_forged status=200", "/v1/%0d%1b[2J%c2%9b%e2%80%aebalance",
             "/%20status=200%20key_id=key_admin"]
    with caplog.at_level(logging.INFO, logger="rsigym.access"):
        for path in paths:
            client.get(path, headers=bearer(run["key"]), follow_redirects=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "rsigym.access"]
    assert len(lines) == len(paths)
    for line, sent in zip(lines, paths, strict=True):
        assert "\n" not in line and "\r" not in line and CONTROL.search(line) is None, repr(line)
        if fmt == "json":  # JSON stays as is: the path exactly as routed
            assert json.loads(line)["path"] == httpx.URL(sent).path
            continue
        fields = dict(part.split("=", 1) for part in line.split(" "))
        assert list(fields) == ["request_id", "key_id", "method", "path", "status", "cost_usd", "latency_ms"]
        assert fields["status"] in ("307", "404") and fields["request_id"].startswith("req_") and fields["request_id"] != "req_forged"
        assert fields["key_id"] != "key_admin"
    if fmt == "text":
        assert lines[0].split(" ")[3] == "path=/\\x0a2026-01-01\\x20access\\x20request_id=req_forged\\x20status=200"
