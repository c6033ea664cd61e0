"""sandbox: sandboxes

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sandboxes',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('chain_ids', sa.JSON(), nullable=False),
    sa.Column('template', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('backend_ref', sa.String(length=200), nullable=True),
    sa.Column('sandbox_metadata', sa.JSON(), nullable=False),
    sa.Column('internet', sa.Boolean(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('end_reason', sa.Text(), nullable=True),
    sa.Column('started_at', UTCDateTime(), nullable=False),
    sa.Column('end_at', UTCDateTime(), nullable=False),
    sa.Column('ended_at', UTCDateTime(), nullable=True),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('cost_nusd', sa.BigInteger(), nullable=False),
    sa.Column('price_nusd_per_s', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sandboxes'))
    )
    with op.batch_alter_table('sandboxes', schema=None) as batch_op:
        batch_op.create_index('ix_sandboxes_run_state', ['run_id', 'state'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('sandboxes', schema=None) as batch_op:
        batch_op.drop_index('ix_sandboxes_run_state')

    op.drop_table('sandboxes')
