"""The one submission rule, in one place.

A run may submit more than once; its latest submission before the run ends is its *final*
submission, the one that is audited and scored. Submissions close when the run ends (its
deadline, or the operator's scoring, which ends an open run first), so once the run has ended
its final submission cannot change: the audit that ``rsigym score`` runs then and the scoring
jobs it starts read the same row, and the score records that submission's id.

Ties on ``created_at`` (two submissions in the same microsecond) are broken by id, so every
reader names the same row. The rule in the one sentence operators are shown:
services/evaluation/submission_rule.py.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.evaluation.tables import SubmissionRow


def final_submission(s: Session, run_id: str) -> SubmissionRow | None:
    """The run's latest submission (the final one once the run has ended), or None."""
    return s.scalars(select(SubmissionRow).where(SubmissionRow.run_id == run_id)
                     .order_by(SubmissionRow.created_at.desc(), SubmissionRow.id.desc()).limit(1)).first()
