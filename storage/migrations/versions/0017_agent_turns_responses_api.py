"""agent_turns: the OpenAI Responses API ('responses') is a known API of a turn

The agent route serves the Responses API (Codex speaks only it), and its turns are kept as the
others' are (services/records/agent_turns.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('agent_turns') as batch:
        batch.drop_constraint(op.f('ck_agent_turns_api_known'), type_='check')
        batch.create_check_constraint(op.f('ck_agent_turns_api_known'), "api IN ('openai', 'anthropic', 'responses')")


def downgrade() -> None:
    with op.batch_alter_table('agent_turns') as batch:
        batch.drop_constraint(op.f('ck_agent_turns_api_known'), type_='check')
        batch.create_check_constraint(op.f('ck_agent_turns_api_known'), "api IN ('openai', 'anthropic')")
