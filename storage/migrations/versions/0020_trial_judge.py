"""evaluation_results: judge — what a judged task's verifier asked its judge

A judged benchmark (``[judge] model`` in benchmark.toml) lets its verifiers ask a rollout model
through a door of their own (services/sandbox/door.py); the door keeps the model and messages of
each request (bounded), and the trial's result records them with its reward, so an operator can
read what was asked. None on a trial of an unjudged benchmark (and rows before this revision).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluation_results') as batch:
        batch.add_column(sa.Column('judge', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluation_results') as batch:
        batch.drop_column('judge')
