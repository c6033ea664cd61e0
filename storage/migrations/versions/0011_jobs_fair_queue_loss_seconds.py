"""fair job queues: training_jobs / evaluation_jobs queued_at and dispatched_at; training_steps.loss_s (custom-loss seconds)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

TABLES = ('training_jobs', 'evaluation_jobs')


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('queued_at', sa.DateTime(), nullable=True))
            batch.add_column(sa.Column('dispatched_at', sa.DateTime(), nullable=True))
    with op.batch_alter_table('training_steps') as batch:
        batch.add_column(sa.Column('loss_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_steps') as batch:
        batch.drop_column('loss_s')
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column('dispatched_at')
            batch.drop_column('queued_at')
