"""A benchmark's ``[judge]`` table (services/evaluation/benchmarks.py) and what a judge door keeps
of what it is asked (services/sandbox/door.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.config import load_config
from services.evaluation.benchmarks import Judge, _read_header
from services.evaluation.registry import check_judge
from services.sandbox.door import JudgeCapture

HEADER = 'name = "b"\ndescription = "d"\nversion = "1"\n[splits.dev]\nhidden = false\n'


def _header(tmp_path: Path, judge: str) -> dict[str, object]:
    path = tmp_path / "benchmark.toml"
    path.write_text(judge + HEADER if not judge.startswith("[") else HEADER + judge)
    return _read_header(path)


def test_a_judge_is_read_with_its_max_tokens(tmp_path: Path) -> None:
    assert _header(tmp_path, "")["judge"] is None
    assert _header(tmp_path, '[judge]\nmodel = "judge"\nmax_tokens = 64\n')["judge"] == Judge("judge", 64)


@pytest.mark.parametrize("table, reason", [
    ("[judge]\nmax_tokens = 3\n", "[judge] model must name"),
    ('[judge]\nmodel = "j"\nmax_tokens = 0\n', "[judge] max_tokens must be"),
    ('[judge]\nmodel = "j"\nprompt = "x"\n', "[judge] prompt: unknown key"),
    ('judge = "j"\n', "[judge] must be a table"),
])
def test_a_bad_judge_table_is_refused_with_the_reason(tmp_path: Path, table: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        _header(tmp_path, table)


def test_the_judge_must_be_in_the_rollout_catalogue(tmp_path: Path) -> None:
    from services.evaluation.benchmarks import Benchmark

    catalogue = load_config(None).rollout  # the offline config: teacher and judge, stand-ins
    bench = Benchmark("b", "d", "1", tmp_path, {}, judge=Judge("judge"))
    check_judge(bench, catalogue)
    with pytest.raises(ValueError, match="not in the gym's rollout catalogue"):
        check_judge(Benchmark("b", "d", "1", tmp_path, {}, judge=Judge("gpt-x")), catalogue)
    with pytest.raises(ValueError, match="empty"):
        check_judge(bench, None)


def test_a_judge_door_keeps_model_and_messages_within_its_bound() -> None:
    capture = JudgeCapture(limit=400)
    body = {"model": "judge", "messages": [{"role": "user", "content": "what is 1 + 1?"}], "api_key": "not kept"}
    capture.add("/rollout/v1/chat/completions", json.dumps(body).encode())
    capture.add("/rollout/v1/chat/completions", json.dumps({**body, "messages": [{"content": "x" * 500}]}).encode())
    capture.add("/rollout/v1/chat/completions", b"not json")
    view = capture.view()
    assert view["calls"] == 3 and view["truncated"] is True
    assert view["prompts"] == [{"path": "/rollout/v1/chat/completions", "model": "judge",
                                "messages": body["messages"]}]
