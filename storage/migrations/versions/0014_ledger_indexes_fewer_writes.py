"""ledger indexes a reservation writes fewer of: (run, key) for run_id and key_id; open holds only; refs only

Every reservation wrote five index entries (id, key_id, run_id, ref_id, (status, expires_at)) and
every settlement moved its (status, expires_at) entry. Now: the primary key, one (run_id, key_id)
entry, and an expires_at entry while the hold is open (the settlement deletes it); ref_id only
for rows that have one. The reads that used the old indexes use these (docs/performance.md,
"Ledger throughput").

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

OPEN_ROW = sa.text("status = 'reserved'")
HAS_REF = sa.text("ref_id IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table('ledger') as batch:
        batch.drop_index('ix_ledger_status_expires')
        batch.drop_index('ix_ledger_run_id')
        batch.drop_index('ix_ledger_ref_id')
        batch.drop_index('ix_ledger_key_id')
        batch.create_index('ix_ledger_run_key', ['run_id', 'key_id'], unique=False)
        batch.create_index('ix_ledger_open_expires', ['expires_at'], unique=False,
                           sqlite_where=OPEN_ROW, postgresql_where=OPEN_ROW)
        batch.create_index('ix_ledger_ref_id', ['ref_id'], unique=False,
                           sqlite_where=HAS_REF, postgresql_where=HAS_REF)


def downgrade() -> None:
    with op.batch_alter_table('ledger') as batch:
        batch.drop_index('ix_ledger_ref_id')
        batch.drop_index('ix_ledger_open_expires')
        batch.drop_index('ix_ledger_run_key')
        batch.create_index('ix_ledger_key_id', ['key_id'], unique=False)
        batch.create_index('ix_ledger_ref_id', ['ref_id'], unique=False)
        batch.create_index('ix_ledger_run_id', ['run_id'], unique=False)
        batch.create_index('ix_ledger_status_expires', ['status', 'expires_at'], unique=False)
