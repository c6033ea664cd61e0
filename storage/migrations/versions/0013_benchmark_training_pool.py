"""benchmarks.training_pool: a registered benchmark's training pool (path, rows, sha256), if any

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('benchmarks') as batch:
        batch.add_column(sa.Column('training_pool', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('benchmarks') as batch:
        batch.drop_column('training_pool')
