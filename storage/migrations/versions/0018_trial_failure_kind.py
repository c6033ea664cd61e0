"""evaluation_results: failure_kind — whose failure a failed trial was (platform, verifier, agent)

A platform failure (the gateway trials call back on unreachable, the sandbox service down) or a
verifier that gave no reward is no score of the agent's: such trials are retried, and a job they
persist in fails without a score (services/evaluation/failures.py, services/evaluation/jobs.py).
Rows written before this revision have none; their kind is read from their error.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluation_results') as batch:
        batch.add_column(sa.Column('failure_kind', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluation_results') as batch:
        batch.drop_column('failure_kind')
