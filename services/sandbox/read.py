"""What other packages may read of the sandbox service: whose a sandbox access token is (the
gateway authenticates a daemon call at the door with it; services/sandbox/tokens.py)."""

from __future__ import annotations

from services.sandbox import tokens


def token_holder(secret: str, token: str | None) -> tuple[str, str] | None:
    """(key id, sandbox id) of a valid sandbox access token, else None."""
    return tokens.verify(secret, token)
