"""The operator CLI starts without the server stack: `rsigym keys list`, `rsigym run show` and the
rest only talk HTTP or read the data dir, and an operator (or a demo polling a run) pays the
CLI's imports on every call. fastapi and starlette were ~0.27 s of a 0.75 s start on this box
(through the error classes and the access-log helper); without them it is ~0.48 s. Checked in a
fresh interpreter, where nothing is imported yet: the import set, not a timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVER_STACK = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "torch", "transformers", "litellm")
PROBE = """
import sys
import ops.cli.main  # every command registered, as `rsigym --help` sees them
print(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_the_operator_cli_imports_no_server_stack() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    loaded = set(out.stdout.split())
    assert "typer" in loaded and "ops" in loaded  # control: the probe saw the CLI's own imports
    assert loaded.isdisjoint(SERVER_STACK), sorted(loaded & set(SERVER_STACK))


def test_an_error_still_becomes_the_standard_response() -> None:
    """The error factory imports its response class when first called."""
    from kit.errors import NotFound, error_response

    response = error_response(NotFound("no such key", param="key_id"), "req_1")
    assert response.status_code == 404 and response.headers["x-request-id"] == "req_1"
    assert b'"param":"key_id"' in response.body and b'"request_id":"req_1"' in response.body
