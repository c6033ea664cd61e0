"""A fresh PostgreSQL schema for one test or one bench run: created empty, dropped afterwards."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from sqlalchemy import create_engine, text


@contextlib.contextmanager
def fresh_schema(url: str, prefix: str) -> Iterator[str]:
    """A new, empty schema named ``prefix`` + random hex; dropped with all it holds, whatever happens."""
    schema = f"{prefix}{secrets.token_hex(6)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield schema
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
