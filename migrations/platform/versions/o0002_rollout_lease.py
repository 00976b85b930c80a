"""platform schema: a lease on every unfinished rollout

A rollout runs as a chain of `seed.rollout` tasks, one batch of orgs each. The rollout row now
carries the lease the bulk email and embedding jobs have: `lease_expires_at` (renewed by every
batch), `dispatch_token` (carried in the task id; every batch moves it on, so a late duplicate of an
earlier message does nothing), `key_prefix` (the deployment whose reaper watches it) and `attempts`
(batch runs started without finishing). The rollout lease reaper (app.ops.rollout) sends a rollout
past its lease that no worker holds again, or fails it with the reason after JOB_MAX_ATTEMPTS runs.
Rollouts left pending/running by the previous release get an expired lease: the next reaper of a
deployment without CELERY_KEY_PREFIX resumes them from their cursor.
Additive (nullable / defaulted columns): the previous release ignores them.

Revision ID: o0002
Revises: o0001
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "o0002"
down_revision = "o0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True), schema=S)
    op.add_column("rollouts", sa.Column("dispatch_token", sa.Integer(), nullable=False, server_default="0"),
                  schema=S)
    op.add_column("rollouts", sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""), schema=S)
    op.add_column("rollouts", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"), schema=S)
    op.execute(f"UPDATE {S}.rollouts SET lease_expires_at = now() WHERE status IN ('pending', 'running')")


def downgrade() -> None:
    for column in ("attempts", "key_prefix", "dispatch_token", "lease_expires_at"):
        op.drop_column("rollouts", column, schema=S)
