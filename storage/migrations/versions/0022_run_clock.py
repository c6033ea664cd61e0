"""api_keys: when a launched run's agent started (started_at) and since when it is paused (paused_at)

A run minted by the launcher is ``created`` until its supervisor reports the agent started; a
paused run's wall clock stops: resuming pushes ``ends_at`` back by the pause's length
(access/keys.py, access/lifecycle.py). None on keys minted otherwise (and rows before this revision).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-11
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

COLUMNS = ('started_at', 'paused_at')


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
