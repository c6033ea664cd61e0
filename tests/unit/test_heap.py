"""A server's startup heap is frozen out of full collections, its garbage first
(services/core/heap.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.core.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite's process collects as before


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_garbage_is_collected_and_the_rest_frozen(unfrozen: None) -> None:
    kept = Node()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle nobody holds: garbage only a collection frees
    gone = weakref.ref(a)
    del a, b
    frozen = freeze_startup_heap()
    assert gone() is None  # collected, not kept forever in the permanent generation
    assert frozen > 0 and gc.get_freeze_count() > 0  # (other threads may free frozen objects meanwhile)
    assert any(obj is kept for obj in gc.get_objects()) is False  # frozen objects are not tracked by passes
