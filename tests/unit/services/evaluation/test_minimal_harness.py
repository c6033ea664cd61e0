"""The minimal harness (agent_container/harness/minimal) against a scripted fake
OpenAI-compatible chat server.

The agent runs as it runs in a trial sandbox: /usr/bin/python3 on a plain copy of the harness
directory, here with ``-I -S`` so that anything beyond the standard library fails to import.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harbor.models.trajectories import Trajectory

HARNESS_DIR = Path(__file__).resolve().parents[4] / "agent_container" / "harness" / "minimal"
_SPEC = importlib.util.spec_from_file_location("minimal_agent", HARNESS_DIR / "minimal_agent.py")
assert _SPEC is not None and _SPEC.loader is not None
minimal_agent = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("minimal_agent", minimal_agent)  # its dataclasses look their module up
_SPEC.loader.exec_module(minimal_agent)
SANDBOX_PYTHON = Path("/usr/bin/python3")

pytestmark = pytest.mark.skipif(not SANDBOX_PYTHON.exists(), reason="/usr/bin/python3 is missing")

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}


# --------------------------------------------------------------------------- fake server


def tool_call(call_id: str, name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "tiny-test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": USAGE,
    }


@dataclass
class Status:
    """A scripted non-200 answer."""

    code: int
    message: str = "scripted failure"


@dataclass
class FakeChat:
    """Answers /chat/completions from a script; the last entry repeats once the script runs out."""

    script: list[dict[str, Any] | Status]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def next_answer(self) -> dict[str, Any] | Status:
        return self.script[min(len(self.requests) - 1, len(self.script) - 1)]

    def messages(self, i: int) -> list[dict[str, Any]]:
        return self.requests[i]["messages"]


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(script: list[dict[str, Any] | Status]) -> tuple[FakeChat, str]:
        fake = FakeChat(script)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                fake.requests.append(json.loads(body))
                fake.headers.append(dict(self.headers.items()))
                fake.paths.append(self.path)
                answer = fake.next_answer()
                if isinstance(answer, Status):
                    code = answer.code
                    data: dict[str, Any] = {
                        "type": "error",
                        "error": {"type": "server_error", "message": answer.message, "param": None},
                    }
                else:
                    code, data = 200, answer
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return fake, f"http://127.0.0.1:{server.server_address[1]}/inference/v1"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- running the agent


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    workdir: Path
    trajectory_file: Path

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads(self.stdout.strip().splitlines()[-1])

    def trajectory(self) -> Trajectory:
        return Trajectory.model_validate(json.loads(self.trajectory_file.read_text()))


@pytest.fixture
def run_agent(tmp_path: Path) -> Any:
    harness = tmp_path / "harness"
    shutil.copytree(HARNESS_DIR, harness, ignore=shutil.ignore_patterns("__pycache__"))
    workdir = tmp_path / "app"
    workdir.mkdir()
    instruction = tmp_path / "task" / "instruction.md"
    instruction.parent.mkdir()
    instruction.write_text("\n  Create the file out.txt.  \n\n")
    trajectory = tmp_path / "logs" / "agent" / "trajectory.json"

    def run(base_url: str, **overrides: str | None) -> Result:
        env = {
            "PATH": "/usr/bin:/bin",
            "RSIGYM_TASK_INSTRUCTION_FILE": str(instruction),
            "RSIGYM_TASK_METADATA": json.dumps({"kind": "task"}),
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "sk-test-key",
            "RSIGYM_MODEL": "tiny-test-model",
            "RSIGYM_SAMPLING": json.dumps({"temperature": 0.2, "top_p": 0.9, "max_tokens": 64, "seed": 7}),
            "RSIGYM_TRAJECTORY_FILE": str(trajectory),
            "RSIGYM_WORKDIR": str(workdir),
            "RSIGYM_RETRY_BACKOFF": "0",
        }
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        proc = subprocess.run(
            [str(SANDBOX_PYTHON), "-I", "-S", str(harness / "minimal_agent.py")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr, workdir, trajectory)

    run.instruction = instruction  # type: ignore[attr-defined]
    return run


def qa_metadata(workdir: Path) -> str:
    return json.dumps({"kind": "qa", "answer_file": str(workdir / "answer.txt")})


# --------------------------------------------------------------------------- tests


def test_harness_toml_describes_the_harness() -> None:
    config = tomllib.loads((HARNESS_DIR / "harness.toml").read_text())["harness"]
    assert config["name"] == "minimal"
    assert config["run"] == "/usr/bin/python3 /harness/minimal_agent.py"
    assert not config.get("install")  # nothing to install
    assert (HARNESS_DIR / "README.md").is_file()
    try:
        from services.evaluation.archives import HarnessManifest
    except ImportError:
        return
    HarnessManifest.model_validate(config)


def test_tools_run_and_results_go_back_with_their_call_ids(serve: Any, run_agent: Any) -> None:
    fake, url = serve(
        [
            reply(
                "Let me do it.",
                [
                    tool_call("call_a", "bash", {"command": "echo hi > out.txt && echo done"}),
                    tool_call("call_b", "write_file", {"path": "notes/x.txt", "content": "hello\n"}),
                ],
            ),
            reply(None, [tool_call("call_c", "finish", {})]),
        ]
    )
    result = run_agent(url)
    assert result.code == 0, result.stderr

    # The tools' effects are on disk, relative to the working directory.
    assert (result.workdir / "out.txt").read_text() == "hi\n"
    assert (result.workdir / "notes" / "x.txt").read_text() == "hello\n"

    # First request: the bare instruction, no system prompt, tools and sampling passed through.
    assert len(fake.requests) == 2
    assert fake.paths == ["/inference/v1/chat/completions"] * 2
    first = fake.requests[0]
    assert first["messages"] == [{"role": "user", "content": "Create the file out.txt."}]
    assert first["model"] == "tiny-test-model"
    assert {t["function"]["name"] for t in first["tools"]} == {"bash", "read_file", "write_file", "finish"}
    assert all(t["type"] == "function" for t in first["tools"])
    assert (first["temperature"], first["top_p"], first["max_tokens"], first["seed"]) == (0.2, 0.9, 64, 7)
    assert fake.headers[0]["Authorization"] == "Bearer sk-test-key"

    # Second request: the assistant turn, then one tool message per call with the right id.
    messages = fake.messages(1)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_a", "call_b"]
    assert messages[2]["tool_call_id"] == "call_a"
    assert messages[2]["content"] == "exit code: 0\ndone\n"
    assert messages[3]["tool_call_id"] == "call_b"
    assert "wrote 6 bytes" in messages[3]["content"]

    trajectory = result.trajectory()
    assert trajectory.agent.name == "minimal"
    assert trajectory.agent.model_name == "tiny-test-model"
    assert [s.source for s in trajectory.steps] == ["user", "agent", "agent"]
    assert trajectory.steps[0].message == "Create the file out.txt."
    agent_step = trajectory.steps[1]
    assert agent_step.message == "Let me do it."
    assert [c.tool_call_id for c in agent_step.tool_calls or []] == ["call_a", "call_b"]
    assert agent_step.tool_calls and agent_step.tool_calls[0].arguments == {"command": "echo hi > out.txt && echo done"}
    assert agent_step.observation is not None
    assert [r.source_call_id for r in agent_step.observation.results] == ["call_a", "call_b"]
    assert agent_step.metrics is not None and agent_step.metrics.prompt_tokens == 11
    assert trajectory.final_metrics is not None
    assert trajectory.final_metrics.total_prompt_tokens == 22
    assert trajectory.final_metrics.total_completion_tokens == 14
    assert trajectory.final_metrics.total_cached_tokens == 6
    assert trajectory.final_metrics.total_steps == 3
    assert trajectory.extra and trajectory.extra["stop_reason"] == "finish"

    summary = result.summary
    assert summary["status"] == "ok" and summary["stop_reason"] == "finish"
    assert summary["turns"] == 2 and summary["tool_calls"] == 3
    assert summary["prompt_tokens"] == 22 and summary["completion_tokens"] == 14


def test_qa_plain_text_answer_falls_back_to_the_answer_file(serve: Any, run_agent: Any, tmp_path: Path) -> None:
    fake, url = serve([reply("  42  \n")])
    run_agent.instruction.write_text("What is 6 * 7?\n")
    result = run_agent(url, RSIGYM_TASK_METADATA=qa_metadata(tmp_path / "app"))
    assert result.code == 0, result.stderr
    assert (result.workdir / "answer.txt").read_text() == "42"
    assert fake.messages(0) == [{"role": "user", "content": "What is 6 * 7?"}]
    assert result.summary["stop_reason"] == "no_tool_calls"
    assert result.summary["answer_written_by"] == "fallback"
    assert [s.source for s in result.trajectory().steps] == ["user", "agent"]


def test_code_plain_reply_falls_back_to_its_last_code_block(serve: Any, run_agent: Any, tmp_path: Path) -> None:
    """A code task (HumanEval's ``kind = "code"``): a model that answers with a fenced block and no
    tool call still gets scored — the block goes to the answer file, its indentation kept."""
    fake, url = serve([reply("Here it is:\n```python\n    return a + b\n```\nDone.")])
    metadata = json.dumps({"kind": "code", "answer_file": str(tmp_path / "app" / "completion.py")})
    result = run_agent(url, RSIGYM_TASK_METADATA=metadata)
    assert result.code == 0, result.stderr
    assert (result.workdir / "completion.py").read_text() == "    return a + b\n"
    assert result.summary["answer_written_by"] == "fallback"
    # a reply cut off inside its block (max_tokens) still gives the code so far; no block: the text
    assert minimal_agent.code_of("```py\n    x = 1\n    return x") == "    x = 1\n    return x"
    assert minimal_agent.code_of("    return 1") == "    return 1"


def test_qa_finish_answer_is_written(serve: Any, run_agent: Any, tmp_path: Path) -> None:
    _, url = serve([reply("thinking", [tool_call("c1", "finish", {"answer": " Paris "})])])
    result = run_agent(url, RSIGYM_TASK_METADATA=qa_metadata(tmp_path / "app"))
    assert result.code == 0, result.stderr
    assert (result.workdir / "answer.txt").read_text() == "Paris"
    assert result.summary["answer_written_by"] == "finish"
    trajectory = result.trajectory()
    assert trajectory.extra and trajectory.extra["answer"] == " Paris "


def test_qa_answer_written_by_the_model_is_kept(serve: Any, run_agent: Any, tmp_path: Path) -> None:
    _, url = serve(
        [
            reply(None, [tool_call("c1", "write_file", {"path": "answer.txt", "content": "7"})]),
            reply("The answer is 7."),
        ]
    )
    result = run_agent(url, RSIGYM_TASK_METADATA=qa_metadata(tmp_path / "app"))
    assert result.code == 0, result.stderr
    assert (result.workdir / "answer.txt").read_text() == "7"
    assert result.summary["answer_written_by"] == "model"


def test_max_turns_is_respected(serve: Any, run_agent: Any) -> None:
    fake, url = serve([reply(None, [tool_call("loop", "bash", {"command": "echo again >> log.txt"})])])
    result = run_agent(url, RSIGYM_MAX_TURNS="3")
    assert result.code == 0, result.stderr
    assert len(fake.requests) == 3
    assert (result.workdir / "log.txt").read_text() == "again\n" * 3
    assert result.summary["stop_reason"] == "max_turns"
    trajectory = result.trajectory()
    assert len(trajectory.steps) == 4
    assert trajectory.extra and trajectory.extra["max_turns"] == 3


def test_server_error_is_recorded_and_a_trajectory_written(serve: Any, run_agent: Any) -> None:
    fake, url = serve([Status(500, "engine exploded")])
    result = run_agent(url)
    assert result.code != 0
    assert len(fake.requests) == 1  # a 500 is not retried
    summary = result.summary
    assert summary["status"] == "error" and summary["stop_reason"] == "model_error"
    assert "HTTP 500" in summary["error"] and "engine exploded" in summary["error"]
    trajectory = result.trajectory()
    assert trajectory.extra and "HTTP 500" in trajectory.extra["error"]
    assert [s.source for s in trajectory.steps] == ["user", "system"]
    assert "engine exploded" in str(trajectory.steps[-1].message)


def test_429_and_503_are_retried(serve: Any, run_agent: Any, tmp_path: Path) -> None:
    fake, url = serve([Status(429), Status(503), reply("ok")])
    result = run_agent(url, RSIGYM_TASK_METADATA=qa_metadata(tmp_path / "app"))
    assert result.code == 0, result.stderr
    assert len(fake.requests) == 3
    assert (result.workdir / "answer.txt").read_text() == "ok"

    fake, url = serve([Status(503)])
    result = run_agent(url, RSIGYM_HTTP_RETRIES="2")
    assert result.code != 0
    assert len(fake.requests) == 3  # the first try and two retries
    assert "HTTP 503" in result.summary["error"]
    result.trajectory()


def test_unreachable_endpoint_still_writes_a_trajectory(run_agent: Any) -> None:
    result = run_agent("http://127.0.0.1:9/v1", RSIGYM_HTTP_RETRIES="0")
    assert result.code != 0
    assert "unreachable" in result.summary["error"]
    result.trajectory()


def test_bad_tool_calls_are_reported_to_the_model(serve: Any, run_agent: Any) -> None:
    fake, url = serve(
        [
            reply(
                None,
                [
                    tool_call("c1", "launch_rockets", {}),
                    tool_call("c2", "bash", "{not json"),
                    tool_call("c3", "read_file", {"path": "missing.txt"}),
                    tool_call("c4", "bash", {"command": "sleep 30"}),
                    tool_call("c5", "bash", {"command": "head -c 5000 /dev/zero | tr '\\0' x"}),
                ],
            ),
            reply("giving up"),
        ]
    )
    result = run_agent(url, RSIGYM_BASH_TIMEOUT="1", RSIGYM_MAX_OUTPUT_CHARS="300")
    assert result.code == 0, result.stderr
    tool_messages = {m["tool_call_id"]: m["content"] for m in fake.messages(1) if m["role"] == "tool"}
    assert set(tool_messages) == {"c1", "c2", "c3", "c4", "c5"}
    assert "unknown tool" in tool_messages["c1"]
    assert "not valid JSON" in tool_messages["c2"]
    assert "FileNotFoundError" in tool_messages["c3"]
    assert "timed out" in tool_messages["c4"]
    assert "truncated" in tool_messages["c5"] and len(tool_messages["c5"]) < 400
    trajectory = result.trajectory()
    assert trajectory.steps[1].tool_calls and trajectory.steps[1].tool_calls[1].arguments == {"_raw": "{not json"}


def test_bad_configuration_exits_nonzero_with_a_trajectory(run_agent: Any, tmp_path: Path) -> None:
    result = run_agent("http://127.0.0.1:9/v1", RSIGYM_TASK_INSTRUCTION_FILE=str(tmp_path / "nope.md"))
    assert result.code == 2
    assert result.summary["stop_reason"] == "config_error"
    trajectory = result.trajectory()
    assert len(trajectory.steps) == 1 and trajectory.steps[0].source == "system"

    result = run_agent("http://127.0.0.1:9/v1", RSIGYM_SAMPLING="[1, 2]")
    assert result.code == 2 and "RSIGYM_SAMPLING" in result.summary["error"]
    result.trajectory()


def test_agent_module_imports_only_the_standard_library() -> None:
    source = (HARNESS_DIR / "minimal_agent.py").read_text()
    top_level = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            top_level.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    assert top_level <= set(sys.stdlib_module_names) | {"__future__"}
