"""core: keys, ledger, concurrency

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('api_keys',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('root_id', sa.String(length=40), nullable=False),
    sa.Column('parent_id', sa.String(length=40), nullable=True),
    sa.Column('depth', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('key_prefix', sa.String(length=16), nullable=False),
    sa.Column('track', sa.String(length=40), nullable=True),
    sa.Column('policy', sa.JSON(), nullable=False),
    sa.Column('budget_nusd', sa.BigInteger(), nullable=True),
    sa.Column('spent_nusd', sa.BigInteger(), nullable=False),
    sa.Column('reserved_nusd', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.Column('updated_at', UTCDateTime(), nullable=False),
    sa.CheckConstraint("status IN ('active', 'paused', 'revoked')", name=op.f('ck_api_keys_status_known')),
    sa.CheckConstraint('budget_nusd IS NULL OR spent_nusd + reserved_nusd <= budget_nusd', name=op.f('ck_api_keys_within_budget')),
    sa.CheckConstraint('reserved_nusd >= 0', name=op.f('ck_api_keys_reserved_nonneg')),
    sa.CheckConstraint('spent_nusd >= 0', name=op.f('ck_api_keys_spent_nonneg')),
    sa.ForeignKeyConstraint(['parent_id'], ['api_keys.id'], name=op.f('fk_api_keys_parent_id_api_keys')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_parent_id'), ['parent_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_api_keys_root_id'), ['root_id'], unique=False)

    op.create_table('concurrency_leases',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('service', sa.String(length=40), nullable=False),
    sa.Column('chain', sa.JSON(), nullable=False),
    sa.Column('expires_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_concurrency_leases'))
    )
    with op.batch_alter_table('concurrency_leases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_concurrency_leases_expires_at'), ['expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_concurrency_leases_key_id'), ['key_id'], unique=False)

    op.create_table('concurrency',
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('service', sa.String(length=40), nullable=False),
    sa.Column('in_flight', sa.Integer(), nullable=False),
    sa.CheckConstraint('in_flight >= 0', name=op.f('ck_concurrency_in_flight_nonneg')),
    sa.ForeignKeyConstraint(['key_id'], ['api_keys.id'], name=op.f('fk_concurrency_key_id_api_keys')),
    sa.PrimaryKeyConstraint('key_id', 'service', name=op.f('pk_concurrency'))
    )
    op.create_table('ledger',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('service', sa.String(length=40), nullable=False),
    sa.Column('operation', sa.String(length=80), nullable=False),
    sa.Column('ref_id', sa.String(length=80), nullable=True),
    sa.Column('request_id', sa.String(length=64), nullable=True),
    sa.Column('estimate_nusd', sa.BigInteger(), nullable=False),
    sa.Column('actual_nusd', sa.BigInteger(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.Column('expires_at', UTCDateTime(), nullable=False),
    sa.Column('settled_at', UTCDateTime(), nullable=True),
    sa.CheckConstraint("status IN ('reserved', 'settled', 'released', 'expired')", name=op.f('ck_ledger_status_known')),
    sa.CheckConstraint('actual_nusd IS NULL OR actual_nusd >= 0', name=op.f('ck_ledger_actual_nonneg')),
    sa.CheckConstraint('estimate_nusd >= 0', name=op.f('ck_ledger_estimate_nonneg')),
    sa.ForeignKeyConstraint(['key_id'], ['api_keys.id'], name=op.f('fk_ledger_key_id_api_keys')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger'))
    )
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ledger_key_id'), ['key_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ledger_ref_id'), ['ref_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ledger_run_id'), ['run_id'], unique=False)
        batch_op.create_index('ix_ledger_status_expires', ['status', 'expires_at'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_status_expires')
        batch_op.drop_index(batch_op.f('ix_ledger_run_id'))
        batch_op.drop_index(batch_op.f('ix_ledger_ref_id'))
        batch_op.drop_index(batch_op.f('ix_ledger_key_id'))

    op.drop_table('ledger')
    op.drop_table('concurrency')
    with op.batch_alter_table('concurrency_leases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_concurrency_leases_key_id'))
        batch_op.drop_index(batch_op.f('ix_concurrency_leases_expires_at'))

    op.drop_table('concurrency_leases')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_root_id'))
        batch_op.drop_index(batch_op.f('ix_api_keys_parent_id'))

    op.drop_table('api_keys')

