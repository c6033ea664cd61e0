"""The garbage collector set for a server: the heap it built before it serves kept out of full
passes, and young passes made rarer.

A gym process builds everything it serves with (the apps, Harbor, litellm, the models' code:
~390,000 objects) before its first request, and keeps nearly all of it for its life. CPython's
full (generation 2) collection walks every tracked object: measured on the embedded gym while it
served process starts, one such pass took 209 ms — one request in about 1,500 waited that long
for it. :func:`prepare_heap` collects once (so no garbage is kept) and moves what is left to
the permanent generation (``gc.freeze``), which later passes skip: after it the same run made no
full pass at all and its collections walked ~10,000 objects. What the process allocates later is
collected as before.

A young (generation 0) pass runs after every 700 net allocations of tracked objects by default,
and walks every young object still alive. A server with many calls in flight keeps thousands of
them alive (each call's coroutine, futures, request objects), so most passes walk live objects
and free nothing: at 1,000 concurrent ledger calls this threshold brings the event loop's CPU a
call near what it is with the collector off, about half of it with CPython's defaults
(docs/performance.md, "Ledger throughput"). Refcounting frees everything
that is not in a cycle as soon as it is dropped, so a pass every :data:`YOUNG_THRESHOLD`
allocations instead only delays freeing garbage cycles, by at most that many objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations of tracked objects between young passes while serving (CPython's default: 700)."""


def prepare_heap() -> int:
    """Collect, then freeze what survived, and make young passes rarer; called by each server
    right before it serves. Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
    return gc.get_freeze_count()
