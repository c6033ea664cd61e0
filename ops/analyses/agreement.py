"""Cohen's kappa: agreement between two labellers beyond what chance gives, ``(po - pe) / (1 - pe)``
with ``po`` the observed agreement and ``pe`` the agreement expected from each labeller's own
label frequencies (Cohen 1960)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> dict[str, Any]:
    """``{"kappa", "observed", "expected", "n"}`` for two labellings of the same items, in order.
    ``kappa`` is None where it is undefined: no items, or both labellers used one and the same
    label for everything (``pe`` = 1)."""
    if len(a) != len(b):
        raise ValueError("the two labellings must cover the same items")
    n = len(a)
    if n == 0:
        return {"kappa": None, "observed": None, "expected": None, "n": 0}
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    expected = sum(ca[label] * cb[label] for label in ca) / (n * n)
    kappa = None if expected >= 1.0 else (observed - expected) / (1.0 - expected)
    return {"kappa": kappa, "observed": observed, "expected": expected, "n": n}
