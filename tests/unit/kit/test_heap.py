"""A server's startup heap is frozen out of full collections, its garbage first, and young
passes made rarer (kit/heap.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from kit.heap import YOUNG_THRESHOLD, prepare_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()  # the rest of the suite's process collects as before
    gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_garbage_is_collected_and_the_rest_frozen(unfrozen: None) -> None:
    kept = Node()
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle nobody holds: garbage only a collection frees
    gone = weakref.ref(a)
    del a, b
    frozen = prepare_heap()
    assert gone() is None  # collected, not kept forever in the permanent generation
    assert frozen > 0 and gc.get_freeze_count() > 0  # (other threads may free frozen objects meanwhile)
    assert any(obj is kept for obj in gc.get_objects()) is False  # frozen objects are not tracked by passes


def test_young_passes_are_rarer_while_serving(unfrozen: None) -> None:
    gc.set_threshold(700, 10, 10)
    prepare_heap()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    gc.set_threshold(50_000, 10, 10)  # set higher by whoever runs the server: kept
    prepare_heap()
    assert gc.get_threshold() == (50_000, 10, 10)
    # A cycle is still collected, by the next young pass.
    gc.collect()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    keep = [Node() for _ in range(60_000)]  # tracked allocations past the threshold: a young pass runs
    assert gone() is None and keep
