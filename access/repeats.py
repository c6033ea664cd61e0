"""Repeated runs of one agent on one task (``rsigym run start --repeat N``): which runs were
started together, so that a report aggregates them (a mean with its interval) instead of
treating them as unrelated runs.

The group is carried in each run key's *name*, ``<task> <group>`` with the group an opaque
``rep_<hex>`` id, so every reader of keys (the admin API, ``rsigym keys list --json``, reports)
can group the runs with no column of its own. Only the group is there: the run's index in it
and its seed are operator-side facts in the launcher's ``run.json`` (``rsigym run list --json``),
because the run key's name is also what its agent reads (``GET /v1/key``); it learns that its
run is one of a group, never which one or how many.
"""

from __future__ import annotations

import re

from kit.ids import new_id

GROUP_PREFIX = "rep"
NAME_MAX = 200
"""The key name's limit (gateway/schemas.py CreateKey)."""
_GROUP = re.compile(r"(?:^|\s)(rep_[0-9a-f]{24})$")


def new_group() -> str:
    return new_id(GROUP_PREFIX)


def key_name(task: str, group: str) -> str:
    """The run key's name for a run of ``task`` in repeat ``group`` (the task's name shortened
    to fit, the group always whole)."""
    return f"{task[: NAME_MAX - len(group) - 1]} {group}"


def group_of(name: str | None) -> str | None:
    """The repeat group a run key's name carries, or None (a run started alone)."""
    found = _GROUP.search(name or "")
    return found.group(1) if found else None
