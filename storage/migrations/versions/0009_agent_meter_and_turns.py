"""agent model: api_keys.agent_meter_id (the run's agent-model meter key) and agent_turns (the research agent's trajectory)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('agent_meter_id', sa.String(length=40), nullable=True))
    op.create_table(
        'agent_turns',
        sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('key_id', sa.String(length=40), nullable=False),
        sa.Column('request_id', sa.String(length=64), nullable=True),
        sa.Column('api', sa.String(length=16), nullable=False),
        sa.Column('model', sa.String(length=200), nullable=False),
        sa.Column('stream', sa.Boolean(), nullable=False),
        sa.Column('request', sa.JSON(), nullable=False),
        sa.Column('response', sa.JSON(), nullable=False),
        sa.Column('usage', sa.JSON(), nullable=False),
        sa.Column('cost_nusd', sa.BigInteger(), nullable=False),
        sa.Column('truncated', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.CheckConstraint("api IN ('openai', 'anthropic')", name=op.f('ck_agent_turns_api_known')),
        sa.PrimaryKeyConstraint('seq', name=op.f('pk_agent_turns')),
    )
    op.create_index(op.f('ix_agent_turns_run_id'), 'agent_turns', ['run_id'])


def downgrade() -> None:
    op.drop_index(op.f('ix_agent_turns_run_id'), table_name='agent_turns')
    op.drop_table('agent_turns')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('agent_meter_id')
