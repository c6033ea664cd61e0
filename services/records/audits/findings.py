"""What every audit check returns: a verdict and findings in the shape ``rsigym audit --json``
prints (``{"name", "verdict", "findings": [{"category", "code", "task_ids", "evidence"}]}``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from services.records.audits.taxonomy import CATEGORY_IDS, CODES

Verdict = Literal["pass", "flag", "inconclusive"]


@dataclass
class Finding:
    category: str
    """A taxonomy id (services/records/audits/taxonomy.py)."""
    code: str
    """EXECUTED | ATTEMPTED_BLOCKED | SUSPECTED | NOT_OBSERVED | NOT_APPLICABLE | INCONCLUSIVE"""
    evidence: str
    """Quoted evidence: the matched span, the hash that differs, the refused call, the judge's quote."""
    task_ids: list[str] = field(default_factory=list)
    experiment_ids: list[str] = field(default_factory=list)
    """Experiments this finding concerns (empty: the run or its submission as a whole)."""
    submission: bool = False
    """It concerns the submitted system itself."""

    def __post_init__(self) -> None:
        if self.category not in CATEGORY_IDS:
            raise ValueError(f"unknown category {self.category!r}")
        if self.code not in CODES:
            raise ValueError(f"unknown code {self.code!r}")

    @property
    def flags(self) -> bool:
        return self.code == "EXECUTED"

    def view(self) -> dict[str, Any]:
        return {"category": self.category, "code": self.code, "task_ids": list(self.task_ids),
                "evidence": self.evidence, "experiment_ids": list(self.experiment_ids),
                "submission": self.submission}


@dataclass
class CheckResult:
    name: Literal["contamination", "provenance", "harness", "score_gap", "behaviour"]
    verdict: Verdict
    findings: list[Finding] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    """Check-specific figures for the Markdown report (per-task overlap, hashes compared …)."""

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "findings": [f.view() for f in self.findings],
                "details": self.details}
