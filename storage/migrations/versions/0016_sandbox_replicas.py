"""sandbox: replica, slot_lease; sandbox_replicas — each sandbox's owning replica and each replica's lease

A sandbox-service replica that starts (or reaps) ends only the sandboxes of replicas that are
dead — their lease ran out, or on the same host their process is gone — never a live one's
(services/sandbox/replicas.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sandboxes') as batch:
        batch.add_column(sa.Column('replica', sa.String(length=120), nullable=True))
        batch.add_column(sa.Column('slot_lease', sa.String(length=40), nullable=True))
        batch.create_index('ix_sandboxes_state_replica', ['state', 'replica'], unique=False)
    op.create_table(
        'sandbox_replicas',
        sa.Column('id', sa.String(length=120), nullable=False),
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('started_at', UTCDateTime(), nullable=False),
        sa.Column('heartbeat_at', UTCDateTime(), nullable=False),
        sa.Column('expires_at', UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_sandbox_replicas')),
    )


def downgrade() -> None:
    op.drop_table('sandbox_replicas')
    with op.batch_alter_table('sandboxes') as batch:
        batch.drop_index('ix_sandboxes_state_replica')
        batch.drop_column('slot_lease')
        batch.drop_column('replica')
