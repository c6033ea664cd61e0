"""scores: subset, subset_seed, split_seed — the seeds that shaped a score

``rsigym score RUN --subset N --seed S`` scores a seeded subset of a split, the same for the
initial system, the reference system and every run (services/evaluation/subsets.py). A score row
records the subset's size and seed, and the seed that drew the split itself, by name; the
initial-system baseline is reused only on the same subset, seed and split seed. Rows written
before this revision scored whole splits: they have none.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('scores') as batch:
        batch.add_column(sa.Column('subset', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('subset_seed', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('split_seed', sa.String(length=120), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scores') as batch:
        batch.drop_column('split_seed')
        batch.drop_column('subset_seed')
        batch.drop_column('subset')
