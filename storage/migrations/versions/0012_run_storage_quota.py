"""storage quota: run_storage (a run's stored bytes, in total and by kind)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_COUNTERS = ('used_bytes', 'objects', 'datasets_bytes', 'harnesses_bytes', 'checkpoints_bytes',
             'trajectories_bytes', 'results_bytes')


def upgrade() -> None:
    op.create_table(
        'run_storage',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('used_bytes', sa.BigInteger(), nullable=False),
        sa.Column('objects', sa.Integer(), nullable=False),
        sa.Column('datasets_bytes', sa.BigInteger(), nullable=False),
        sa.Column('harnesses_bytes', sa.BigInteger(), nullable=False),
        sa.Column('checkpoints_bytes', sa.BigInteger(), nullable=False),
        sa.Column('trajectories_bytes', sa.BigInteger(), nullable=False),
        sa.Column('results_bytes', sa.BigInteger(), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        *(sa.CheckConstraint(f'{c} >= 0', name=op.f(f'ck_run_storage_{c}_nonneg')) for c in _COUNTERS),
        sa.PrimaryKeyConstraint('run_id', name=op.f('pk_run_storage')),
    )


def downgrade() -> None:
    op.drop_table('run_storage')
