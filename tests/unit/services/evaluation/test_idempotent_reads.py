"""Reads of a trial sandbox's files are tried again when the connection failed before an answer
(a reset keep-alive connection made Harbor's best-effort artifact collection score a correct
answer 0); an answer, error or not, is final."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.evaluation.harbor import sandbox_sdk
from services.evaluation.harbor.sandbox_sdk import READ_ATTEMPTS, idempotent


class Flaky:
    def __init__(self, failures: list[BaseException]):
        self.failures, self.calls = failures, 0

    async def __call__(self) -> bytes:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return b"6\n"


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_s: float) -> None:
        return None

    monkeypatch.setattr(sandbox_sdk.asyncio, "sleep", instant)


def test_a_reset_connection_is_read_again() -> None:
    read = Flaky([httpx.WriteError("Connection reset by peer (os error 104)")])
    assert asyncio.run(idempotent(read, "/app/answer.txt")) == b"6\n"
    assert read.calls == 2


def test_a_connection_that_keeps_failing_fails_after_the_last_attempt() -> None:
    read = Flaky([httpx.ConnectError("refused") for _ in range(READ_ATTEMPTS)])
    with pytest.raises(httpx.ConnectError):
        asyncio.run(idempotent(read, "/app/answer.txt"))
    assert read.calls == READ_ATTEMPTS


def test_an_answer_is_final() -> None:
    read = Flaky([FileNotFoundError("/app/answer.txt")])
    with pytest.raises(FileNotFoundError):
        asyncio.run(idempotent(read, "/app/answer.txt"))
    assert read.calls == 1
