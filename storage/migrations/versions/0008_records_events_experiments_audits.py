"""records: hash-chained platform events and their heads, experiments and edges, agent annotations, audits

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'record_events',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=40), nullable=False),
        sa.Column('key_id', sa.String(length=40), nullable=True),
        sa.Column('experiment_id', sa.String(length=40), nullable=True),
        sa.Column('data', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('prev_hash', sa.String(length=64), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'seq', name=op.f('pk_record_events')),
    )
    op.create_index(op.f('ix_record_events_kind'), 'record_events', ['kind'])
    op.create_index(op.f('ix_record_events_key_id'), 'record_events', ['key_id'])
    op.create_index(op.f('ix_record_events_experiment_id'), 'record_events', ['experiment_id'])
    op.create_table(
        'record_heads',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.Column('mac', sa.String(length=64), nullable=False),
        sa.Column('updated_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', name=op.f('pk_record_heads')),
    )
    op.create_table(
        'experiments',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('owner_key_id', sa.String(length=40), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('implicit', sa.Boolean(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('reasons', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('audited_at', sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_experiments')),
    )
    op.create_index(op.f('ix_experiments_run_id'), 'experiments', ['run_id'])
    op.create_index('ix_experiments_run_owner', 'experiments', ['run_id', 'owner_key_id'])
    op.create_table(
        'experiment_edges',
        sa.Column('child_id', sa.String(length=40), nullable=False),
        sa.Column('parent_id', sa.String(length=40), nullable=False),
        sa.PrimaryKeyConstraint('child_id', 'parent_id', name=op.f('pk_experiment_edges')),
    )
    op.create_index(op.f('ix_experiment_edges_parent_id'), 'experiment_edges', ['parent_id'])
    op.create_table(
        'record_annotations',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('key_id', sa.String(length=40), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('experiment_ids', sa.JSON(), nullable=False),
        sa.Column('body', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_record_annotations')),
    )
    op.create_index(op.f('ix_record_annotations_key_id'), 'record_annotations', ['key_id'])
    op.create_index('ix_record_annotations_run_kind', 'record_annotations', ['run_id', 'kind'])
    op.create_table(
        'audits',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('hacking_rate', sa.Float(), nullable=True),
        sa.Column('report', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_audits')),
    )
    op.create_index(op.f('ix_audits_run_id'), 'audits', ['run_id'])
    for table in ('training_jobs', 'evaluation_jobs', 'checkpoints'):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('experiment_id', sa.String(length=40), nullable=True))
    with op.batch_alter_table('checkpoints') as batch:
        batch.create_index(op.f('ix_checkpoints_experiment_id'), ['experiment_id'])


def downgrade() -> None:
    with op.batch_alter_table('checkpoints') as batch:
        batch.drop_index(op.f('ix_checkpoints_experiment_id'))
    for table in ('training_jobs', 'evaluation_jobs', 'checkpoints'):
        with op.batch_alter_table(table) as batch:
            batch.drop_column('experiment_id')
    for table in ('audits', 'record_annotations', 'experiment_edges', 'experiments', 'record_heads', 'record_events'):
        op.drop_table(table)
