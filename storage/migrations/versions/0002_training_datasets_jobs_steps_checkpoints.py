"""training: datasets, jobs, steps, checkpoints

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('datasets',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('rows', sa.Integer(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_datasets')),
    sa.UniqueConstraint('run_id', 'sha256', name='uq_datasets_run_sha')
    )
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_datasets_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_datasets_sha256'), ['sha256'], unique=False)

    op.create_table('training_jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('base_model', sa.String(length=200), nullable=False),
    sa.Column('parent_checkpoint_id', sa.String(length=40), nullable=True),
    sa.Column('dataset_ids', sa.JSON(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('loss_module_hash', sa.String(length=64), nullable=True),
    sa.Column('total_steps', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('cost_nusd', sa.BigInteger(), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.Column('started_at', UTCDateTime(), nullable=True),
    sa.Column('finished_at', UTCDateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_jobs'))
    )
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_training_jobs_run_id'), ['run_id'], unique=False)
        batch_op.create_index('ix_training_jobs_status', ['status'], unique=False)

    op.create_table('checkpoints',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('base_model', sa.String(length=200), nullable=False),
    sa.Column('parent_checkpoint_id', sa.String(length=40), nullable=True),
    sa.Column('dataset_hashes', sa.JSON(), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('loss_module_hash', sa.String(length=64), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('weights_hash', sa.String(length=64), nullable=False),
    sa.Column('path', sa.String(length=500), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['training_jobs.id'], name=op.f('fk_checkpoints_job_id_training_jobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints'))
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoints_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_checkpoints_run_id'), ['run_id'], unique=False)

    op.create_table('training_steps',
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=False),
    sa.Column('lr', sa.Float(), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('grad_norm', sa.Float(), nullable=False),
    sa.Column('cost_nusd', sa.BigInteger(), nullable=False),
    sa.Column('cumulative_cost_nusd', sa.BigInteger(), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['training_jobs.id'], name=op.f('fk_training_steps_job_id_training_jobs')),
    sa.PrimaryKeyConstraint('job_id', 'step', name=op.f('pk_training_steps'))
    )



def downgrade() -> None:

    op.drop_table('training_steps')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_run_id'))
        batch_op.drop_index(batch_op.f('ix_checkpoints_job_id'))

    op.drop_table('checkpoints')
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_training_jobs_status')
        batch_op.drop_index(batch_op.f('ix_training_jobs_run_id'))

    op.drop_table('training_jobs')
    with op.batch_alter_table('datasets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_datasets_sha256'))
        batch_op.drop_index(batch_op.f('ix_datasets_run_id'))

    op.drop_table('datasets')

