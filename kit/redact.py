"""Scrub provider secrets from anything the gym writes: log records and error text.

Logging is process-global, so the scrubber is too: :func:`install_log_redaction` installs a
log-record factory once, and every record — whatever logger or handler (uvicorn's, pytest's,
a library's) — is scrubbed when it is created, its traceback included.
"""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any

MASK = "[redacted]"


class Redactor:
    def __init__(self, secrets: list[str] | None = None):
        self._lock = threading.Lock()
        self._secrets: list[str] = []
        self.add(*(secrets or []))

    def add(self, *secrets: str) -> None:
        with self._lock:
            self._secrets = sorted({*self._secrets, *(s for s in secrets if s and len(s) >= 4)}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text


_redactor = Redactor()
_installed = False
_install_lock = threading.Lock()


def redact(text: str) -> str:
    return _redactor(text)


def install_log_redaction(*secrets: str) -> Redactor:
    """Register secrets to scrub and (once per process) hook log-record creation."""
    global _installed
    _redactor.add(*secrets)
    with _install_lock:
        if not _installed:
            previous = logging.getLogRecordFactory()

            def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
                record = previous(*args, **kwargs)
                try:
                    message = record.getMessage()
                except Exception:  # noqa: BLE001 - a broken format string must not break logging
                    message = str(record.msg)
                record.msg, record.args = _redactor(message), None
                if record.exc_info and record.exc_info[0] is not None:
                    record.exc_text = _redactor("".join(traceback.format_exception(*record.exc_info)))
                    record.exc_info = None
                return record

            logging.setLogRecordFactory(factory)
            _installed = True
    return _redactor
