"""The heap a server built before it serves, kept out of the garbage collector's full passes.

A gym process builds everything it serves with (the apps, Harbor, litellm, the models' code:
~390,000 objects) before its first request, and keeps nearly all of it for its life. CPython's
full (generation 2) collection walks every tracked object: measured on the embedded gym while it
served process starts, one such pass took 209 ms — one request in about 1,500 waited that long
for it. :func:`freeze_startup_heap` collects once (so no garbage is kept) and moves what is left to
the permanent generation (``gc.freeze``), which later passes skip: after it the same run made no
full pass at all and its collections walked ~10,000 objects. What the process allocates later is
collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze what survived; called by each server right before it serves.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
