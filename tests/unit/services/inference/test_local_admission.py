"""Which waiting requests join a batch of the local engine. A new batch serves the oldest
request's adapter and takes every waiting request on it, so interleaved arrivals on a few
adapters still share forward passes; a running batch takes only while the oldest waiting request
is its own adapter's, so another adapter's request is served next, never starved."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.inference.backends import local
from services.inference.backends.base import Adapter, Sampling
from services.inference.backends.local import LocalEngine, _Batch, _Row

A, B = Adapter("ckpt_a", "/a"), Adapter("ckpt_b", "/b")


def row(adapter: Adapter | None) -> _Row:
    return _Row(ids=[1], adapter=adapter, sampling=Sampling(max_tokens=4), max_new=4, on_text=None, generator=None)


def waiting(*adapters: Adapter | None) -> SimpleNamespace:
    return SimpleNamespace(waiting=deque(row(x) for x in adapters))


def test_a_new_batch_takes_every_waiting_request_on_the_oldest_ones_adapter() -> None:
    loaded = waiting(A, B, None, A, A, B)
    before = list(loaded.waiting)
    joined = LocalEngine(Path("."))._admit(loaded, _Batch())
    assert joined == [before[0], before[3], before[4]]
    assert list(loaded.waiting) == [before[1], before[2], before[5]]  # the others keep their order


def test_a_new_batch_takes_no_more_than_the_batch_size() -> None:
    loaded = waiting(*[A] * 5, B)
    joined = LocalEngine(Path("."), max_batch=3)._admit(loaded, _Batch())
    assert len(joined) == 3
    assert [r.adapter_key for r in loaded.waiting] == ["ckpt_a", "ckpt_a", "ckpt_b"]


def test_a_running_batch_stops_admitting_once_another_adapter_is_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "_kv", lambda cache: [])  # a cache whose rows can be merged
    running = _Batch(rows=[row(A)], cache=object(), adapter_key="ckpt_a")
    loaded = waiting(A, B, A)
    first = loaded.waiting[0]
    assert LocalEngine(Path("."))._admit(loaded, running) == [first]
    assert [r.adapter_key for r in loaded.waiting] == ["ckpt_b", "ckpt_a"]  # B goes before the later A


def test_a_running_batch_whose_cache_cannot_merge_admits_no_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "_kv", lambda cache: None)
    running = _Batch(rows=[row(A)], cache=object(), adapter_key="ckpt_a")
    loaded = waiting(A, A)
    assert LocalEngine(Path("."))._admit(loaded, running) == []
    assert len(loaded.waiting) == 2
