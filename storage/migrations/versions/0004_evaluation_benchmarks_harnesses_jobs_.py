"""evaluation: benchmarks, harnesses, jobs, results, submissions, scores

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from storage.tables import UTCDateTime

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('benchmarks',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('version', sa.String(length=40), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('splits', sa.JSON(), nullable=False),
    sa.Column('validation', sa.JSON(), nullable=False),
    sa.Column('registered_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_benchmarks'))
    )
    op.create_table('evaluation_jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('purpose', sa.String(length=16), nullable=False),
    sa.Column('benchmark', sa.String(length=100), nullable=False),
    sa.Column('split', sa.String(length=40), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('harness', sa.String(length=40), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('sampling', sa.JSON(), nullable=False),
    sa.Column('task_ids', sa.JSON(), nullable=False),
    sa.Column('gateway_url', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('trials_total', sa.Integer(), nullable=False),
    sa.Column('trials_done', sa.Integer(), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.Column('started_at', UTCDateTime(), nullable=True),
    sa.Column('finished_at', UTCDateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_evaluation_jobs'))
    )
    with op.batch_alter_table('evaluation_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluation_jobs_run_id'), ['run_id'], unique=False)
        batch_op.create_index('ix_evaluation_jobs_status', ['status'], unique=False)

    op.create_table('evaluation_results',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('task_id', sa.String(length=100), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('trajectory', sa.JSON(), nullable=True),
    sa.Column('verifier_output', sa.Text(), nullable=False),
    sa.Column('agent_output', sa.Text(), nullable=False),
    sa.Column('sandbox_id', sa.String(length=40), nullable=True),
    sa.Column('started_at', sa.String(length=40), nullable=True),
    sa.Column('finished_at', sa.String(length=40), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_evaluation_results')),
    sa.UniqueConstraint('job_id', 'task_id', 'attempt', name='uq_evaluation_results_trial')
    )
    with op.batch_alter_table('evaluation_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluation_results_job_id'), ['job_id'], unique=False)

    op.create_table('harnesses',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('files', sa.Integer(), nullable=False),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_harnesses')),
    sa.UniqueConstraint('run_id', 'sha256', name='uq_harnesses_run_sha')
    )
    with op.batch_alter_table('harnesses', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_harnesses_run_id'), ['run_id'], unique=False)

    op.create_table('scores',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('submission_id', sa.String(length=40), nullable=True),
    sa.Column('benchmark', sa.String(length=100), nullable=False),
    sa.Column('split', sa.String(length=40), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('harness', sa.String(length=40), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=24), nullable=False),
    sa.Column('agent', sa.String(length=200), nullable=True),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_scores'))
    )
    with op.batch_alter_table('scores', schema=None) as batch_op:
        batch_op.create_index('ix_scores_run_benchmark', ['run_id', 'benchmark'], unique=False)

    op.create_table('submissions',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('key_id', sa.String(length=40), nullable=False),
    sa.Column('track', sa.String(length=16), nullable=True),
    sa.Column('checkpoint_id', sa.String(length=40), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('harness', sa.String(length=40), nullable=False),
    sa.Column('created_at', UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_submissions'))
    )
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_submissions_run_id'), ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_submissions_run_id'))

    op.drop_table('submissions')
    with op.batch_alter_table('scores', schema=None) as batch_op:
        batch_op.drop_index('ix_scores_run_benchmark')

    op.drop_table('scores')
    with op.batch_alter_table('harnesses', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_harnesses_run_id'))

    op.drop_table('harnesses')
    with op.batch_alter_table('evaluation_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluation_results_job_id'))

    op.drop_table('evaluation_results')
    with op.batch_alter_table('evaluation_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_evaluation_jobs_status')
        batch_op.drop_index(batch_op.f('ix_evaluation_jobs_run_id'))

    op.drop_table('evaluation_jobs')
    op.drop_table('benchmarks')
