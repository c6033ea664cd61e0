"""Agreement between two label sets (e.g. the judge's and a human's): Cohen's kappa and raw
agreement, per category and overall (``rsigym audit agreement A.json B.json``).

A label set is any of:

* an ``rsigym audit --json`` object — ``{"run_id", "checks": [{"findings": [{"category", "code"}]}]}``;
  a category's label is the worst code of its findings over all checks (the audit unit is the
  run: repeats of one category count once);
* the judge's answer shape — ``{"categories": {category: {"code": ...}}}``;
* ``{"run_id": ..., "labels": {category: code}}`` or a plain ``{category: code}`` map (a value may
  also be ``{"code": ...}``);
* a list of any of these, one per run.

The unit is (run, category). Two single objects are paired as one run whatever their run ids
say; two lists are paired by ``run_id`` when every item of both has one, else by position.
Units present in only one set are counted (``only_in_a``/``only_in_b``), not compared.

Degenerate cases, where Cohen's kappa is 0/0: when both sets use one and the same label for
every unit (full agreement on a single label), kappa is reported as 1.0 (scikit-learn returns
NaN there); with no units at all, kappa and agreement are None.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kit.errors import Unprocessable
from services.records.audits.taxonomy import CATEGORY_IDS, CODES, worst

Unit = tuple[str, str]
"""(run key, category id)"""


def _code(value: Any, where: str) -> str:
    raw = value.get("code") if isinstance(value, dict) else value
    code = raw.strip().upper().replace(" ", "_").replace("-", "_") if isinstance(raw, str) else None
    if code not in CODES:
        raise Unprocessable(f"{where}: {raw!r} is not a verdict code ({', '.join(CODES)})")
    return code


def _category(name: Any, where: str) -> str:
    if name not in CATEGORY_IDS:
        raise Unprocessable(f"{where}: {name!r} is not a taxonomy category")
    return str(name)


def run_labels(obj: Any, where: str = "labels") -> dict[str, str]:
    """category → code of one run's label set (any of the shapes in the module docstring)."""
    if not isinstance(obj, dict):
        raise Unprocessable(f"{where}: a label set must be a JSON object or a list of them")
    if "checks" in obj:
        codes: dict[str, list[str]] = {}
        for i, check in enumerate(obj.get("checks") or []):
            for j, finding in enumerate((check or {}).get("findings") or []):
                at = f"{where}.checks[{i}].findings[{j}]"
                codes.setdefault(_category(finding.get("category"), at), []).append(_code(finding, at))
        return {cat: worst(found) for cat, found in codes.items()}
    inner = obj.get("categories", obj.get("labels", obj))
    if not isinstance(inner, dict):
        raise Unprocessable(f"{where}: categories must be an object")
    return {_category(cat, where): _code(value, f"{where}.{cat}") for cat, value in inner.items()}


def _units(value: Any, keys: list[str] | None, where: str) -> dict[Unit, str]:
    if isinstance(value, list):
        out: dict[Unit, str] = {}
        for key, item in zip(keys or [], value, strict=True):
            out.update({(key, cat): code for cat, code in run_labels(item, f"{where}[{key}]").items()})
        return out
    return {("", cat): code for cat, code in run_labels(value, where).items()}


def _run_keys(a: Any, b: Any) -> tuple[list[str] | None, list[str] | None]:
    if isinstance(a, list) != isinstance(b, list):
        raise Unprocessable("compare a list of runs with a list of runs, or one run with one run")
    if not isinstance(a, list) or not isinstance(b, list):
        return None, None

    def ids(items: list[Any]) -> list[str] | None:
        found = [item.get("run_id") if isinstance(item, dict) else None for item in items]
        return [str(x) for x in found] if all(found) and len(set(found)) == len(found) else None

    ids_a, ids_b = ids(a), ids(b)
    if ids_a is not None and ids_b is not None:
        return ids_a, ids_b
    return [str(i) for i in range(len(a))], [str(i) for i in range(len(b))]


def cohen_kappa(pairs: list[tuple[str, str]]) -> float | None:
    """Cohen's kappa of (label by A, label by B) pairs; see the module docstring for 0/0."""
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(1 for x, y in pairs if x == y)
    count_a, count_b = Counter(x for x, _ in pairs), Counter(y for _, y in pairs)
    chance = sum(count_a[k] * count_b[k] for k in count_a)  # × 1/n² is the expected agreement
    if chance == n * n:
        return 1.0  # one label used by both for every unit: they agree fully
    return (observed * n - chance) / (n * n - chance)


def _summary(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    n = len(pairs)
    return {"n": n, "agreement": (sum(1 for x, y in pairs if x == y) / n) if n else None,
            "kappa": cohen_kappa(pairs)}


def agreement(a: Any, b: Any) -> dict[str, Any]:
    """Per category and overall: units compared, raw agreement and Cohen's kappa, and the
    overall confusion counts ``{code by A: {code by B: n}}``."""
    keys_a, keys_b = _run_keys(a, b)
    units_a, units_b = _units(a, keys_a, "A"), _units(b, keys_b, "B")
    common = sorted(set(units_a) & set(units_b))
    pairs = [(units_a[u], units_b[u]) for u in common]
    per_category = {cat: _summary([(units_a[u], units_b[u]) for u in common if u[1] == cat])
                    for cat in CATEGORY_IDS if any(u[1] == cat for u in common)}
    confusion: dict[str, dict[str, int]] = {}
    for x, y in pairs:
        confusion.setdefault(x, {}).setdefault(y, 0)
        confusion[x][y] += 1
    return {"units": len(common), "only_in_a": len(set(units_a) - set(units_b)),
            "only_in_b": len(set(units_b) - set(units_a)), "overall": _summary(pairs),
            "per_category": per_category, "confusion": confusion}
