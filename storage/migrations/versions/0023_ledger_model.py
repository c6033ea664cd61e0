"""ledger: the model each row's call named (spend by model and by key, /metrics and the admin API)

None on rows before this revision and on work that names no model (sandboxes, evaluation).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-11
"""

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ledger') as batch:
        batch.add_column(sa.Column('model', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ledger') as batch:
        batch.drop_column('model')
