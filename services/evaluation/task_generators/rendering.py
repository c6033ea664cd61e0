"""One drawn task (:class:`TaskSpec`) and its files in Harbor's task format.

A task is rendered the same way whether it is a committed dev task (benchmarks/generate.py) or an
official task generated at registration (services/evaluation/official_splits.py): only the spec
differs. ``task.toml`` never holds the answer; only ``tests/`` and ``solution/`` do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

ORG = "rsigym"


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
        return question_key(self.instruction, {path: text.encode() for path, text in self.app.items()})


def question_key(instruction: str, app: dict[str, bytes]) -> str:
    """A digest of a question: its instruction in the contamination audit's normalisation (so that
    "What is 83 - 76?" and "what is 83 − 76 ?" are one question) and its input files, byte for byte."""
    from services.records.audits.contamination import normalise

    h = hashlib.sha256(normalise(instruction).encode())
    for path in sorted(app):
        h.update(b"\0" + path.encode() + b"\0" + app[path])
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
    """The task's files, keyed by path relative to its folder."""
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
