"""Opaque identifiers. Nothing a user sees encodes order, owner or count."""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def new_request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def new_api_key() -> str:
    """A run key: 256 random bits; only its SHA-256 is ever stored."""
    return "rsk-" + secrets.token_urlsafe(32)


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()
