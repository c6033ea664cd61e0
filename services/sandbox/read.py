"""What other packages may read of the sandbox service: whose a sandbox access token is (the
gateway authenticates a daemon call at the door with it; services/sandbox/tokens.py), and the
sandboxes as operators list them across runs (ops/admin_lists.py)."""

from __future__ import annotations

from services.sandbox import tokens
from services.sandbox.tables import SandboxRow
from storage.pages import listing


def token_holder(secret: str, token: str | None) -> tuple[str, str] | None:
    """(key id, sandbox id) of a valid sandbox access token, else None."""
    return tokens.verify(secret, token)


SANDBOXES = listing(SandboxRow, SandboxRow.started_at,
                    ("id", "run_id", "key_id", "template", "backend", "internet", "state", "end_reason",
                     "seconds", "cost_nusd", "sandbox_metadata", "started_at", "ended_at"),
                    SandboxRow.state)
