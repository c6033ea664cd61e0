#!/usr/bin/env python3
"""The minimal harness: a small tool-calling agent that runs inside a trial sandbox.

Standard library only (runs under the sandbox's /usr/bin/python3, 3.11+, from a plain
directory copy). It asks an OpenAI-compatible ``/chat/completions`` endpoint with the bare
task instruction as the only message, executes the tool calls the model makes (bash,
read_file, write_file, finish), sends the results back, and repeats until the model calls
``finish``, replies without tool calls, or the turn limit is reached. It always writes an
ATIF trajectory (Harbor's ``Trajectory`` shape) and prints a one-line JSON summary.

Inputs are environment variables; see ``Config.from_env`` and README.md.
Exit codes: 0 ran to completion, 1 the model endpoint failed, 2 bad configuration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

AGENT_NAME = "minimal"
AGENT_VERSION = "0.1.0"
SCHEMA_VERSION = "ATIF-v1.6"

EXIT_OK = 0
EXIT_MODEL_ERROR = 1
EXIT_CONFIG_ERROR = 2

RETRY_STATUSES = (429, 503)
RESERVED_SAMPLING_KEYS = ("model", "messages", "tools", "stream")
ANSWER_KINDS = ("qa", "code")
"""Task kinds with an answer file the harness writes when the model only replies in text."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the working directory and return its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file and return its contents.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path of the file."}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file, creating parent directories and replacing any old contents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path of the file."},
                    "content": {"type": "string", "description": "The full new contents."},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Stop working. Give the final answer if the task asks a question.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The final answer, if any."}},
                "required": [],
            },
        },
    },
]


class ConfigError(Exception):
    """The environment does not describe a runnable task."""


class ModelError(Exception):
    """The model endpoint failed (after retries, where retrying made sense)."""


class Terminated(Exception):
    """SIGTERM arrived (e.g. the trial timed out); stop and still write the trajectory."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(f"terminated by signal {signum}")


def log(msg: str) -> None:
    print(f"[minimal] {msg}", file=sys.stderr, flush=True)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _env_int(env: dict[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from e
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def _env_float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError as e:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from e


def _env_json_object(env: dict[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object")
    return value


@dataclass
class Config:
    instruction_file: Path
    metadata: dict[str, Any]
    base_url: str
    api_key: str
    model: str
    sampling: dict[str, Any]
    max_turns: int
    trajectory_file: Path
    workdir: Path
    session_id: str
    bash_timeout_s: float = 120.0
    max_output_chars: int = 10_000
    http_timeout_s: float = 600.0
    http_retries: int = 3
    retry_backoff_s: float = 2.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Config:
        """Read the configuration; raise ConfigError on anything unusable.

        The trajectory file and session id are read first, so a caller can still write a
        trajectory when a later variable is bad (see ``partial_from_env``)."""
        partial = cls.partial_from_env(env)
        partial.metadata = _env_json_object(env, "RSIGYM_TASK_METADATA")
        partial.sampling = {
            k: v for k, v in _env_json_object(env, "RSIGYM_SAMPLING").items() if k not in RESERVED_SAMPLING_KEYS
        }
        partial.max_turns = _env_int(env, "RSIGYM_MAX_TURNS", 8, minimum=1)
        partial.bash_timeout_s = _env_float(env, "RSIGYM_BASH_TIMEOUT", 120.0)
        partial.max_output_chars = _env_int(env, "RSIGYM_MAX_OUTPUT_CHARS", 10_000, minimum=200)
        partial.http_timeout_s = _env_float(env, "RSIGYM_HTTP_TIMEOUT", 600.0)
        partial.http_retries = _env_int(env, "RSIGYM_HTTP_RETRIES", 3)
        partial.retry_backoff_s = _env_float(env, "RSIGYM_RETRY_BACKOFF", 2.0)
        if not partial.base_url:
            raise ConfigError("OPENAI_BASE_URL is not set")
        if not partial.model:
            raise ConfigError("RSIGYM_MODEL is not set")
        return partial

    @classmethod
    def partial_from_env(cls, env: dict[str, str]) -> Config:
        """The parts that cannot fail: paths, endpoint, model name, session id."""
        return cls(
            instruction_file=Path(env.get("RSIGYM_TASK_INSTRUCTION_FILE") or "/task/instruction.md"),
            metadata={},
            base_url=(env.get("OPENAI_BASE_URL") or "").strip().rstrip("/"),
            api_key=env.get("OPENAI_API_KEY") or "",
            model=(env.get("RSIGYM_MODEL") or "").strip(),
            sampling={},
            max_turns=8,
            trajectory_file=Path(env.get("RSIGYM_TRAJECTORY_FILE") or "/logs/agent/trajectory.json"),
            workdir=Path(env.get("RSIGYM_WORKDIR") or "/app"),
            session_id=env.get("RSIGYM_SESSION_ID") or str(uuid.uuid4()),
        )

    @property
    def chat_url(self) -> str:
        if self.base_url.endswith("/chat/completions"):
            return self.base_url
        return self.base_url + "/chat/completions"

    @property
    def answer_file(self) -> Path | None:
        """The answer file of a QA or code task (relative paths are under the workdir)."""
        if self.metadata.get("kind") not in ANSWER_KINDS or not self.metadata.get("answer_file"):
            return None
        return self.resolve(str(self.metadata["answer_file"]))

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.workdir / p


# ---------------------------------------------------------------------------------------
# Model endpoint
# ---------------------------------------------------------------------------------------


def _error_detail(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text[:500]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])[:500]
    return text[:500]


def _retry_after(headers: Any, fallback: float) -> float:
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return min(max(float(raw), 0.0), 60.0) if raw is not None else fallback
    except ValueError:
        return fallback


def chat_completion(cfg: Config, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """POST one chat completion; return (response JSON, retries used). Raise ModelError."""
    payload: dict[str, Any] = {"model": cfg.model, "messages": messages, "tools": TOOLS, **cfg.sampling}
    body = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    attempt = 0
    while True:
        req = urllib.request.Request(cfg.chat_url, data=body, headers=headers, method="POST")
        delay = cfg.retry_backoff_s * (2**attempt)
        try:
            with urllib.request.urlopen(req, timeout=cfg.http_timeout_s) as resp:
                raw = resp.read()
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ModelError(f"model endpoint returned invalid JSON: {raw[:200]!r}") from e
            if not isinstance(data, dict) or not data.get("choices"):
                raise ModelError(f"model endpoint returned no choices: {str(data)[:300]}")
            return data, attempt
        except urllib.error.HTTPError as e:
            detail = _error_detail(e.read())
            if e.code in RETRY_STATUSES and attempt < cfg.http_retries:
                delay = _retry_after(e.headers, delay)
                log(f"HTTP {e.code} from model endpoint, retrying in {delay:.1f}s: {detail}")
            else:
                raise ModelError(f"HTTP {e.code} from {cfg.chat_url}: {detail}") from e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            if attempt < cfg.http_retries:
                log(f"model endpoint unreachable ({reason}), retrying in {delay:.1f}s")
            else:
                raise ModelError(f"model endpoint unreachable at {cfg.chat_url}: {reason}") from e
        time.sleep(delay)
        attempt += 1


# ---------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n... [{dropped} characters truncated] ...\n{text[-tail:]}"


def _shell() -> list[str]:
    bash = shutil.which("bash")
    return [bash, "-c"] if bash else ["/bin/sh", "-c"]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bash(cfg: Config, command: str) -> str:
    proc = subprocess.Popen(
        [*_shell(), command],
        cwd=cfg.workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=cfg.bash_timeout_s or None)
        status = f"exit code: {proc.returncode}"
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        status = f"timed out after {cfg.bash_timeout_s:g}s (killed)"
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    text = out.decode("utf-8", "replace")
    return truncate(f"{status}\n{text}" if text else status, cfg.max_output_chars)


def read_file(cfg: Config, path: str) -> str:
    data = cfg.resolve(path).read_bytes()
    return truncate(data.decode("utf-8", "replace"), cfg.max_output_chars)


def write_file(cfg: Config, path: str, content: str) -> str:
    target = cfg.resolve(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    target.write_bytes(data)
    return f"wrote {len(data)} bytes to {target}"


def _require_str(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ValueError(f"argument '{name}' (string) is required")
    return value


def execute_tool(cfg: Config, name: str, args: dict[str, Any]) -> str:
    """Run one non-finish tool; errors come back as text for the model to read."""
    try:
        if name == "bash":
            return run_bash(cfg, _require_str(args, "command"))
        if name == "read_file":
            return read_file(cfg, _require_str(args, "path"))
        if name == "write_file":
            return write_file(cfg, _require_str(args, "path"), _require_str(args, "content"))
        known = ", ".join(t["function"]["name"] for t in TOOLS)
        return f"error: unknown tool '{name}' (available: {known})"
    except Exception as e:  # noqa: BLE001 - any tool failure is reported to the model
        return f"error: {type(e).__name__}: {e}"


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as a dict, plus an error message when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as e:
        return {"_raw": str(raw)}, f"error: arguments are not valid JSON: {e}"
    if not isinstance(value, dict):
        return {"_raw": str(raw)}, "error: arguments must be a JSON object"
    return value, None


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


@dataclass
class FileSnapshot:
    exists: bool
    mtime_ns: int = 0
    size: int = 0

    @classmethod
    def of(cls, path: Path | None) -> FileSnapshot:
        if path is None:
            return cls(False)
        try:
            st = path.stat()
        except OSError:
            return cls(False)
        return cls(True, st.st_mtime_ns, st.st_size)


@dataclass
class Run:
    cfg: Config
    steps: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_call_count: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    saw_usage: bool = False
    retries: int = 0
    stop_reason: str = "not_started"
    error: str | None = None
    finish_answer: str | None = None
    last_text: str = ""
    answer_written_by: str | None = None
    response_model: str | None = None

    def add_step(self, source: str, message: str, **fields: Any) -> dict[str, Any]:
        step = {"step_id": len(self.steps) + 1, "timestamp": now_iso(), "source": source, "message": message}
        step.update({k: v for k, v in fields.items() if v is not None})
        self.steps.append(step)
        return step

    def count_usage(self, usage: Any) -> dict[str, Any] | None:
        if not isinstance(usage, dict):
            return None
        metrics: dict[str, Any] = {}
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(pt, int):
            metrics["prompt_tokens"] = pt
            self.prompt_tokens += pt
        if isinstance(ct, int):
            metrics["completion_tokens"] = ct
            self.completion_tokens += ct
        if isinstance(cached, int):
            metrics["cached_tokens"] = cached
            self.cached_tokens += cached
        self.saw_usage = self.saw_usage or bool(metrics)
        return metrics or None

    def loop(self) -> None:
        cfg = self.cfg
        self.stop_reason = "max_turns"
        while self.turns < cfg.max_turns:
            self.turns += 1
            data, retries = chat_completion(cfg, self.messages)
            self.retries += retries
            if self.response_model is None and isinstance(data.get("model"), str):
                self.response_model = data["model"]
            choice = data["choices"][0]
            msg = choice.get("message") or {}
            content = msg.get("content")
            text = content if isinstance(content, str) else ""
            if text.strip():
                self.last_text = text
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            raw_calls = msg.get("tool_calls") or []

            assistant: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else None}
            calls: list[dict[str, Any]] = []
            for i, tc in enumerate(raw_calls):
                fn = tc.get("function") or {}
                call_id = tc.get("id") or f"call_{self.turns}_{i}"
                raw_args = fn.get("arguments")
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": fn.get("name") or "",
                            "arguments": raw_args if isinstance(raw_args, str) else json.dumps(raw_args or {}),
                        },
                    }
                )
            if calls:
                assistant["tool_calls"] = calls
            self.messages.append(assistant)

            step_tool_calls: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            finished = False
            for call in calls:
                name = call["function"]["name"]
                args, arg_error = parse_arguments(call["function"]["arguments"])
                step_tool_calls.append({"tool_call_id": call["id"], "function_name": name, "arguments": args})
                self.tool_call_count += 1
                if arg_error:
                    output = arg_error
                elif name == "finish":
                    output = self.finish(args)
                    finished = True
                else:
                    log(f"turn {self.turns}: {name} {json.dumps(args)[:200]}")
                    output = execute_tool(cfg, name, args)
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                results.append({"source_call_id": call["id"], "content": output})

            self.add_step(
                "agent",
                text,
                model_name=data.get("model") if isinstance(data.get("model"), str) else None,
                reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
                tool_calls=step_tool_calls or None,
                observation={"results": results} if results else None,
                metrics=self.count_usage(data.get("usage")),
                extra={"finish_reason": choice.get("finish_reason")} if choice.get("finish_reason") else None,
            )
            if finished:
                self.stop_reason = "finish"
                return
            if not calls:
                self.stop_reason = "no_tool_calls"
                return
        log(f"stopped after {cfg.max_turns} turns (RSIGYM_MAX_TURNS)")

    def finish(self, args: dict[str, Any]) -> str:
        answer = args.get("answer")
        if answer is None:
            return "finished"
        self.finish_answer = answer if isinstance(answer, str) else json.dumps(answer)
        target = self.cfg.answer_file
        if target is None:
            return "finished"
        try:
            write_answer(target, self.finish_answer, code=self.cfg.metadata.get("kind") == "code")
        except OSError as e:
            return f"finished, but writing the answer to {target} failed: {e}"
        self.answer_written_by = "finish"
        return f"finished; answer written to {target}"


def write_answer(path: Path, answer: str, code: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # code keeps its leading indentation (a completion continues the prompt's function)
    path.write_text(answer.rstrip() + "\n" if code else answer.strip(), encoding="utf-8")


def code_of(text: str) -> str:
    """A code task's answer in a plain reply: its last fenced block (```python … ```), else the whole text."""
    blocks = re.findall(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", text, flags=re.S)
    return blocks[-1] if blocks else text


def qa_fallback(run: Run, before: FileSnapshot) -> None:
    """For QA and code tasks: if the model neither finished with an answer nor wrote the answer
    file itself, write its last text reply there (a code task's: the code in it, :func:`code_of`)."""
    target = run.cfg.answer_file
    if target is None or run.answer_written_by is not None:
        return
    if FileSnapshot.of(target) != before:
        run.answer_written_by = "model"
        return
    answer = run.last_text.strip()
    if run.cfg.metadata.get("kind") == "code":
        answer = code_of(run.last_text).rstrip()
    if not answer:
        log(f"{run.cfg.metadata.get('kind')} task but no answer to write to {target}")
        return
    try:
        write_answer(target, answer, code=run.cfg.metadata.get("kind") == "code")
        run.answer_written_by = "fallback"
    except OSError as e:
        log(f"could not write the fallback answer to {target}: {e}")


def build_trajectory(run: Run, cfg: Config) -> dict[str, Any]:
    steps = run.steps or [
        {"step_id": 1, "timestamp": now_iso(), "source": "system", "message": f"error: {run.error or 'no steps'}"}
    ]
    final_metrics: dict[str, Any] = {"total_steps": len(steps)}
    if run.saw_usage:
        final_metrics.update(
            total_prompt_tokens=run.prompt_tokens,
            total_completion_tokens=run.completion_tokens,
            total_cached_tokens=run.cached_tokens,
        )
    final_metrics["extra"] = {"turns": run.turns, "tool_calls": run.tool_call_count, "http_retries": run.retries}
    extra: dict[str, Any] = {
        "stop_reason": run.stop_reason,
        "max_turns": cfg.max_turns,
        "task_metadata": cfg.metadata,
        "sampling": cfg.sampling,
        "answer_written_by": run.answer_written_by,
    }
    if run.finish_answer is not None:
        extra["answer"] = run.finish_answer
    if run.error:
        extra["error"] = run.error
    agent: dict[str, Any] = {"name": AGENT_NAME, "version": AGENT_VERSION, "tool_definitions": TOOLS}
    if cfg.model:
        agent["model_name"] = cfg.model
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": cfg.session_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": final_metrics,
        "extra": extra,
    }


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    cfg = Config.partial_from_env(env)
    run = Run(cfg)
    code = EXIT_OK
    before = FileSnapshot(False)
    try:
        cfg = run.cfg = Config.from_env(env)
        try:
            instruction = cfg.instruction_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(f"cannot read the instruction file {cfg.instruction_file}: {e}") from e
        if not instruction:
            raise ConfigError(f"the instruction file {cfg.instruction_file} is empty")
        if not cfg.workdir.is_dir():
            raise ConfigError(f"the working directory {cfg.workdir} does not exist")
        before = FileSnapshot.of(cfg.answer_file)
        run.messages = [{"role": "user", "content": instruction}]
        run.add_step("user", instruction)
        run.loop()
    except ConfigError as e:
        run.stop_reason, run.error, code = "config_error", str(e), EXIT_CONFIG_ERROR
    except ModelError as e:
        run.stop_reason, run.error, code = "model_error", str(e), EXIT_MODEL_ERROR
    except KeyboardInterrupt:
        run.stop_reason, run.error, code = "interrupted", "interrupted", 130
    except Terminated as e:
        run.stop_reason, run.error, code = "terminated", str(e), 143
    except Exception as e:  # noqa: BLE001 - a bug here must still leave a trajectory behind
        run.stop_reason, run.error, code = "internal_error", f"{type(e).__name__}: {e}", EXIT_MODEL_ERROR
    if run.error:
        log(run.error)
        if run.steps:
            run.add_step("system", f"error: {run.error}")
    if code in (EXIT_OK, EXIT_MODEL_ERROR):
        qa_fallback(run, before)

    summary: dict[str, Any] = {
        "status": "ok" if code == EXIT_OK else "error",
        "stop_reason": run.stop_reason,
        "turns": run.turns,
        "tool_calls": run.tool_call_count,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "answer_written_by": run.answer_written_by,
        "trajectory": str(cfg.trajectory_file),
        "error": run.error,
    }
    try:
        write_json_atomic(cfg.trajectory_file, build_trajectory(run, cfg))
    except OSError as e:
        log(f"could not write the trajectory to {cfg.trajectory_file}: {e}")
        summary["trajectory"] = None
        code = code or EXIT_MODEL_ERROR
    print(json.dumps(summary), flush=True)
    return code


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(main())
