"""dashboard sessions kept server-side (dashboard_sessions) and failed-login counters (dashboard_login_failures)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'dashboard_sessions',
        sa.Column('id_hash', sa.String(length=64), nullable=False),
        sa.Column('csrf', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('last_seen', sa.DateTime(), nullable=False),
        sa.Column('expires_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id_hash', name=op.f('pk_dashboard_sessions')),
    )
    op.create_index(op.f('ix_dashboard_sessions_expires_at'), 'dashboard_sessions', ['expires_at'])
    op.create_table(
        'dashboard_login_failures',
        sa.Column('bucket', sa.String(length=80), nullable=False),
        sa.Column('window_no', sa.BigInteger(), nullable=False),
        sa.Column('failures', sa.Integer(), nullable=False),
        sa.CheckConstraint('failures >= 0', name=op.f('ck_dashboard_login_failures_failures_nonneg')),
        sa.PrimaryKeyConstraint('bucket', 'window_no', name=op.f('pk_dashboard_login_failures')),
    )


def downgrade() -> None:
    op.drop_table('dashboard_login_failures')
    op.drop_index(op.f('ix_dashboard_sessions_expires_at'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
