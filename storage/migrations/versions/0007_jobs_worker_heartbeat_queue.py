"""jobs: worker, heartbeat_at, queue, claims; evaluation_trial_claims — one job lifecycle for threads and Celery workers

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

QUEUES = {'training_jobs': 'training', 'evaluation_jobs': 'evaluation'}


def upgrade() -> None:
    for table, queue in QUEUES.items():
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('queue', sa.String(length=40), nullable=False, server_default=queue))
            batch.add_column(sa.Column('worker', sa.String(length=120), nullable=True))
            batch.add_column(sa.Column('heartbeat_at', sa.DateTime(), nullable=True))
            batch.add_column(sa.Column('claims', sa.Integer(), nullable=False, server_default='0'))
            batch.create_index(f'ix_{table}_status_queue', ['status', 'queue'])
    op.create_table(
        'evaluation_trial_claims',
        sa.Column('job_id', sa.String(length=40), nullable=False),
        sa.Column('task_id', sa.String(length=100), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('worker', sa.String(length=120), nullable=False),
        sa.Column('heartbeat_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('job_id', 'task_id', 'attempt', name=op.f('pk_evaluation_trial_claims')),
    )


def downgrade() -> None:
    op.drop_table('evaluation_trial_claims')
    for table in QUEUES:
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f'ix_{table}_status_queue')
            batch.drop_column('claims')
            batch.drop_column('heartbeat_at')
            batch.drop_column('worker')
            batch.drop_column('queue')
