"""run limits: api_keys.ends_at / ended_at (a run's wall-clock deadline) and per-key per-minute token counters

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('ends_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('ended_at', sa.DateTime(), nullable=True))
    op.create_table(
        'rate_counters',
        sa.Column('key_id', sa.String(length=40), nullable=False),
        sa.Column('minute', sa.BigInteger(), nullable=False),
        sa.Column('tokens', sa.BigInteger(), nullable=False),
        sa.CheckConstraint('tokens >= 0', name=op.f('ck_rate_counters_tokens_nonneg')),
        sa.PrimaryKeyConstraint('key_id', 'minute', name=op.f('pk_rate_counters')),
    )


def downgrade() -> None:
    op.drop_table('rate_counters')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('ended_at')
        batch.drop_column('ends_at')
