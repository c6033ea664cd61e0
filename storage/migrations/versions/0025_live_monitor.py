"""records: the live monitor's per-run place (last judged turn, claim) and its alerts

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-12
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'monitor_state',
        sa.Column('run_id', sa.String(length=40), primary_key=True),
        sa.Column('last_seq', sa.BigInteger(), nullable=False),
        sa.Column('checked_at', UTCDateTime(), nullable=True),
        sa.Column('checks', sa.Integer(), nullable=False),
        sa.Column('lease_token', sa.String(length=40), nullable=True),
        sa.Column('lease_until', UTCDateTime(), nullable=True),
        sa.Column('last_error', sa.String(length=500), nullable=True),
    )
    op.create_table(
        'monitor_alerts',
        sa.Column('id', sa.String(length=40), primary_key=True),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('category', sa.String(length=64), nullable=False),
        sa.Column('code', sa.String(length=24), nullable=False),
        sa.Column('evidence', sa.String(length=2000), nullable=False),
        sa.Column('judge_model', sa.String(length=200), nullable=False),
        sa.Column('first_seq', sa.BigInteger(), nullable=False),
        sa.Column('last_seq', sa.BigInteger(), nullable=False),
        sa.Column('paused', sa.Boolean(), nullable=False),
        sa.Column('created_at', UTCDateTime(), nullable=False),
    )
    op.create_index('ix_monitor_alerts_run_created', 'monitor_alerts', ['run_id', 'created_at'])


def downgrade() -> None:
    op.drop_index('ix_monitor_alerts_run_created', table_name='monitor_alerts')
    op.drop_table('monitor_alerts')
    op.drop_table('monitor_state')
