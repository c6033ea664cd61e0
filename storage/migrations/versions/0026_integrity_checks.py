"""records: integrity checks run while a run is live (contamination at upload, provenance at submission)

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'integrity_checks',
        sa.Column('id', sa.String(length=40), primary_key=True),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('subject', sa.String(length=80), nullable=False),
        sa.Column('verdict', sa.String(length=16), nullable=False),
        sa.Column('hits', sa.Integer(), nullable=False),
        sa.Column('report', sa.JSON(), nullable=False),
        sa.Column('seconds', sa.Float(), nullable=False),
        sa.Column('created_at', UTCDateTime(), nullable=False),
    )
    op.create_index('ix_integrity_checks_run_created', 'integrity_checks', ['run_id', 'created_at'])


def downgrade() -> None:
    op.drop_index('ix_integrity_checks_run_created', table_name='integrity_checks')
    op.drop_table('integrity_checks')
