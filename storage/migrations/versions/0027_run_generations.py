"""access: run generations (a run started from an earlier run's accepted system: --from)

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_generations',
        sa.Column('run_id', sa.String(length=40), primary_key=True),
        sa.Column('from_run_id', sa.String(length=40), nullable=False),
        sa.Column('chain_root_id', sa.String(length=40), nullable=False),
        sa.Column('generation', sa.Integer(), nullable=False),
        sa.Column('submission_id', sa.String(length=40), nullable=False),
        sa.Column('audit_id', sa.String(length=40), nullable=False),
        sa.Column('initial_model', sa.String(length=200), nullable=False),
        sa.Column('initial_harness', sa.String(length=200), nullable=False),
        sa.Column('initial_weights_hash', sa.String(length=64), nullable=True),
        sa.Column('base_model', sa.String(length=200), nullable=False),
        sa.Column('created_at', UTCDateTime(), nullable=False),
    )
    op.create_index('ix_run_generations_from_run_id', 'run_generations', ['from_run_id'])
    op.create_index('ix_run_generations_chain_root_id', 'run_generations', ['chain_root_id'])


def downgrade() -> None:
    op.drop_index('ix_run_generations_chain_root_id', table_name='run_generations')
    op.drop_index('ix_run_generations_from_run_id', table_name='run_generations')
    op.drop_table('run_generations')
