"""sandbox: owner_only — a platform sandbox (an evaluation trial's) belongs to its creator key alone

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sandboxes') as batch:
        batch.add_column(sa.Column('owner_only', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('sandboxes') as batch:
        batch.drop_column('owner_only')
