"""The score-gap check: does the submitted system do better on the hidden split than on a visible one?

An answer table can be hidden from every static check (compressed, encoded, keyed by a digest
of the question); what it cannot hide is its effect. A system that has no knowledge of the
hidden split scores the same on it as on the visible one, up to sampling noise — the splits are
drawn from the same tasks — so an official score well above the dev score means the system
knows the hidden tasks.

* **official** — the operator's newest finished scoring of the run's final submission on a
  hidden split (``rsigym score``);
* **dev** — the operator's newest finished scoring of the same submission on a visible split
  (``rsigym score`` scores it next to the official one), else the run's own finished evaluations
  of exactly that system (same model, same harness) on visible splits, pooled per task.

Noise is a one-sided Hoeffding bound over tasks: each task's mean reward lies in [0, 1], so
with ``n`` official and ``m`` dev tasks a gap larger than ``sqrt(ln(1/δ)·(1/n + 1/m)/2)`` has
probability below ``δ = 1 − audit.score_gap_confidence`` for a system that knows neither split.
Tasks, not trials, are the unit: attempts of one task are not independent draws. (The shared
bootstrap of the evidence work replaces this bound later.)

Verdict per run: ``flag`` when a benchmark's gap is over the bound (``SUSPECTED`` findings of
``answer_embedding`` for a harness, ``test_set_contamination`` for trained weights: the run goes
to review); ``inconclusive`` when an official score has no dev score to compare with; ``pass``
otherwise — also when nothing is scored yet: an audit before scoring cannot see the gap, and
``rsigym score RUN --wait`` audits again once the scores are in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from services.evaluation import read as evaluation_read
from services.records.audits.context import AuditContext
from services.records.audits.findings import CheckResult, Finding, Verdict

MINIMAL = "minimal"


@dataclass
class SplitScore:
    split: str
    per_task: dict[str, float]
    """task id → mean reward over its attempts (a failed attempt counts 0)"""
    source: str
    jobs: list[str]

    @property
    def score(self) -> float:
        return sum(self.per_task.values()) / len(self.per_task) if self.per_task else 0.0

    def view(self) -> dict[str, Any]:
        return {"split": self.split, "score": round(self.score, 6), "tasks": len(self.per_task), "source": self.source,
                "jobs": self.jobs}


def noise_bound(n: int, m: int, confidence: float) -> float:
    """The largest gap between two means of ``n`` and ``m`` values in [0, 1] that sampling noise
    explains at ``confidence`` (one-sided Hoeffding)."""
    return math.sqrt(math.log(1 / (1 - confidence)) * (1 / n + 1 / m) / 2)


def _per_task(session: Any, job_ids: list[str]) -> dict[str, float]:
    rewards: dict[str, list[float]] = {}
    for task_id, reward in evaluation_read.trial_rewards(session, job_ids):
        rewards.setdefault(task_id, []).append(reward or 0.0)
    return {t: sum(v) / len(v) for t, v in rewards.items() if v}


def _operator_score(session: Any, run_id: str, submission_id: str, benchmark: str,
                    splits: list[str]) -> SplitScore | None:
    """The newest finished operator scoring of the submission on one of ``splits``."""
    job = evaluation_read.newest_scoring(session, run_id, submission_id, benchmark, splits)
    if job is None:
        return None
    per_task = _per_task(session, [job.id])
    return SplitScore(job.split, per_task, "the operator's scoring", [job.id]) if per_task else None


def _own_evaluations(session: Any, run_id: str, submission: dict[str, Any], benchmark: str,
                     splits: list[str]) -> SplitScore | None:
    """The run's own finished evaluations of exactly the submitted system on visible splits."""
    jobs = evaluation_read.succeeded_agent_jobs(session, run_id, benchmark, splits, submission.get("model"),
                                                submission.get("harness") or MINIMAL)
    if not jobs:
        return None
    per_task = _per_task(session, [j.id for j in jobs])
    split = ",".join(sorted({j.split for j in jobs}))
    return SplitScore(split, per_task, "the run's own evaluations", [j.id for j in jobs]) if per_task else None


def _categories(submission: dict[str, Any]) -> list[str]:
    out = []
    if (submission.get("harness") or MINIMAL) != MINIMAL:
        out.append("answer_embedding")
    if submission.get("checkpoint"):
        out.append("test_set_contamination")
    return out or ["answer_embedding"]


def check_score_gap(ctx: AuditContext, submission: dict[str, Any] | None) -> CheckResult:
    """The gap between the final submission's official and dev scores on every benchmark."""
    confidence = ctx.config.audit.score_gap_confidence
    if submission is None:
        return CheckResult(name="score_gap", verdict="pass", details={"note": "the run submitted nothing"})
    benchmarks: list[dict[str, Any]] = []
    findings: list[Finding] = []
    with ctx.store.transaction() as s:
        for name, splits in evaluation_read.benchmark_splits(s):
            hidden = [n for n, v in splits.items() if (v or {}).get("hidden")]
            visible = [n for n, v in splits.items() if not (v or {}).get("hidden")]
            official = _operator_score(s, ctx.run_id, submission["id"], name, hidden) if hidden else None
            if official is None:
                continue
            dev = (_operator_score(s, ctx.run_id, submission["id"], name, visible)
                   or _own_evaluations(s, ctx.run_id, submission, name, visible)) if visible else None
            entry: dict[str, Any] = {"benchmark": name, "official": official.view(),
                                     "dev": dev.view() if dev else None, "confidence": confidence}
            benchmarks.append(entry)
            if dev is None:
                entry["result"] = "no dev score" if visible else "no visible split"
                if visible:
                    why = (f"{name}: the submission's {official.split} score {official.score:.3f} has no score of "
                           f"the same system on {'/'.join(visible)} to compare with (`rsigym score {ctx.run_id} "
                           "--wait` scores it there too)")
                    findings.extend(Finding(category=c, code="INCONCLUSIVE", evidence=why, submission=True)
                                    for c in _categories(submission))
                continue
            gap = official.score - dev.score
            bound = noise_bound(len(official.per_task), len(dev.per_task), confidence)
            entry.update(gap=round(gap, 6), bound=round(bound, 6), result="over noise" if gap > bound else "within noise")
            if gap > bound:
                why = (f"{name}: the submitted system scored {official.score:.3f} on the hidden split "
                       f"{official.split} ({len(official.per_task)} tasks) but {dev.score:.3f} on {dev.split} "
                       f"({len(dev.per_task)} tasks, {dev.source}): a gap of {gap:.3f} where sampling noise explains "
                       f"at most {bound:.3f} ({confidence:.0%} one-sided bound) — it does better on the tasks it was "
                       "never shown than on the ones it was")
                findings.extend(Finding(category=c, code="SUSPECTED", evidence=why, submission=True)
                                for c in _categories(submission))
    results = {b["result"] for b in benchmarks}
    verdict: Verdict = ("flag" if "over noise" in results else "inconclusive" if "no dev score" in results
                        else "pass")
    details: dict[str, Any] = {"submission": submission["id"], "benchmarks": benchmarks}
    if not benchmarks:
        details["note"] = ("the submission has no official score yet: the gap is checked by an audit after scoring "
                           f"(`rsigym score {ctx.run_id} --wait` audits again when its scores are in)")
    return CheckResult(name="score_gap", verdict=verdict, findings=findings, details=details)
