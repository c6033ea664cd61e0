"""scores: cell — a decomposition cell of a run's score (``rsigym score RUN --decompose``)

Where a run's gain came from: besides the initial system (the ``initial`` baseline, base model ×
minimal harness) and the submission (submitted model × submitted harness), ``--decompose`` scores
the submitted model with the minimal harness (cell ``model``) and the base model with the
submitted harness (cell ``harness``) on the same scope (services/evaluation/decompose.py). Those
rows keep the run's id and submission and name their cell; every score that is *the* run's score
has none (None on rows before this revision too), so readers of a run's score leave cells out.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-12
"""

import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scores') as batch:
        batch.add_column(sa.Column('cell', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scores') as batch:
        batch.drop_column('cell')
