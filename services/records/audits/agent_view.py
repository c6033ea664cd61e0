"""What a run key may read of an audit: each finding's check, category and code, never its evidence.

An audit's findings name hidden-split tasks and quote their text (the contamination check's matched
n-grams and row numbers, the harness check's answer tables, the judge's quotes of training rows).
Read back by the agent under audit, that would make the audit an oracle: train on candidate rows,
read which hidden tasks they hit and what those tasks say, train on exactly those next time. So
everything of an audit that a run key can read — its experiments' ``reasons`` and the
``audit.result`` event on its chain — takes the forms below: per check its name and verdict, per
finding its category, code and a stable ``rule`` (``<check>.<category>``), one entry per distinct
(category, code), so that not even the number of tasks or rows hit shows. The operator's report
(``rsigym audit --json``, ``/admin/v1/audits``) keeps everything.

The records service applies the same forms again when a run key reads (they are idempotent), so
events and experiments written by an older audit leak nothing either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from services.records.audits.taxonomy import CATEGORY_IDS, CODES

LINEAGE = "lineage"
"""The source of what a link inherits from a flagged link it was trained from (its other reasons
name the audit's checks: ``contamination``, ``provenance``, …)."""
VERDICTS = ("pass", "flag", "inconclusive")
QUIET = ("NOT_OBSERVED", "NOT_APPLICABLE")
"""Codes left out of what a run key reads (nothing was found)."""
WITHHELD = "audit: details withheld (the operator's report has them)"
"""What a reason in any other form reads as (one written before this rule, say)."""

_NAME = re.compile(r"[a-z_]{1,40}")
"""A check's name (the platform's own words, never the agent's)."""
_REASON = re.compile(r"([a-z_]{1,40}): ([a-z_]+) \(([A-Z_]+)\)")
_PENDING = re.compile(r"[a-z_]{1,40} check inconclusive")


def rule(check: str, category: str) -> str:
    """The finding's stable code, e.g. ``contamination.test_set_contamination``."""
    return f"{check}.{category}"


def reason(check: str, category: str, code: str) -> str:
    """An experiment's reason as a run key reads it: ``"<check>: <category> (<CODE>)"``."""
    return f"{check}: {category} ({code})"


def reasons(items: Iterable[Any]) -> list[str]:
    """Experiment reasons cut to their ``check: category (CODE)`` head (a pending experiment's
    ``"<check> check inconclusive"`` as it is), duplicates dropped, anything else withheld."""
    out: list[str] = []
    for item in items:
        text = item if isinstance(item, str) else ""
        head = _REASON.match(text)
        if _PENDING.fullmatch(text):
            shown = text
        elif head and head.group(2) in CATEGORY_IDS and head.group(3) in CODES:
            shown = reason(*head.groups())
        else:
            shown = WITHHELD
        if shown not in out:
            out.append(shown)
    return out


def findings(check: str, items: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """A check's findings as a run key reads them: one entry per distinct (category, code)."""
    pairs = {(str(f.get("category")), str(f.get("code"))) for f in items if isinstance(f, Mapping)}
    return [{"category": category, "code": code, "rule": rule(check, category)}
            for category, code in sorted(pairs)
            if category in CATEGORY_IDS and code in CODES and code not in QUIET]


def checks(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checks (``CheckResult.view()`` dicts, or an ``audit.result`` event's) as a run key reads them."""
    out = []
    for c in items:
        if not isinstance(c, Mapping) or not _NAME.fullmatch(str(c.get("name"))):
            continue
        name = str(c["name"])
        out.append({"name": name, "verdict": c.get("verdict") if c.get("verdict") in VERDICTS else "inconclusive",
                    "findings": findings(name, c.get("findings") or [])})
    return out


def audit_result(data: Mapping[str, Any]) -> dict[str, Any]:
    """The data of an ``audit.result`` event: the audit's id, status, hacking rate and checks."""
    rate = data.get("hacking_rate")
    return {"audit_id": data.get("audit_id"), "status": data.get("status"),
            "hacking_rate": rate if isinstance(rate, (int, float)) else None,
            "checks": checks(data.get("checks") or [])}


def event(view: dict[str, Any]) -> dict[str, Any]:
    """An event's view as a run key reads it: an ``audit.result``'s data in the form above."""
    if view.get("kind") == "audit.result" and isinstance(view.get("data"), Mapping):
        return {**view, "data": audit_result(view["data"])}
    return view
