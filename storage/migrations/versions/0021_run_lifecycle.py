"""api_keys: what a launched run is (task, agent, agent_version, agent_model) and how it ended
(end_reason, agent_exit)

The launcher records them on the run key (``rsigym run start``; the supervisor, when the agent
exits; ``rsigym run stop``): every view derives the run's lifecycle from them
(access/lifecycle.py), and reports group runs by the recorded agent instead of the key's name.
None on keys minted otherwise (and rows before this revision).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

COLUMNS = (
    ('task', sa.String(200)),
    ('agent', sa.String(200)),
    ('agent_version', sa.String(80)),
    ('agent_model', sa.String(200)),
    ('end_reason', sa.String(24)),
    ('agent_exit', sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
