"""platform schema: a lease on every unfinished rollout; seed jobs (a leased row per async seed)

A rollout runs as a chain of `seed.rollout` tasks, one batch of orgs each. The rollout row now
carries the lease the bulk email and embedding jobs have: `lease_expires_at` (renewed by every
batch), `dispatch_token` (carried in the task id; every batch moves it on, so a late duplicate of an
earlier message does nothing), `key_prefix` (the deployment whose reaper watches it) and `attempts`
(batch runs started without finishing). The rollout lease reaper (app.ops.rollout) sends a rollout
past its lease that no worker holds again, or fails it with the reason after JOB_MAX_ATTEMPTS runs.
Rollouts left pending/running by the previous release get an expired lease: the next reaper of a
deployment without CELERY_KEY_PREFIX resumes them from their cursor.
`seed_jobs`: one row per accepted asynchronous seed (`seed.org`), with the same lease columns and its
status and error, read by GET /internal/seed/{orgId} (`lastRequest`); its reaper sends a seed whose
worker was lost again, or fails it with the reason.
Additive (nullable / defaulted columns, a new table): the previous release ignores them.

Revision ID: o0002
Revises: o0001
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

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
    op.create_table(
        "seed_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(253), nullable=False),
        sa.Column("product", sa.String(40), nullable=False),
        sa.Column("body", JSONB, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("dispatch_token", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        schema=S,
    )
    op.create_index("ix_seed_jobs_org", "seed_jobs", ["org_id", "product", "created_at"], schema=S)
    op.create_index("ix_seed_jobs_lease", "seed_jobs", ["key_prefix", "lease_expires_at"], schema=S,
                    postgresql_where=sa.text("status IN ('queued', 'running')"))


def downgrade() -> None:
    op.drop_table("seed_jobs", schema=S)
    for column in ("attempts", "key_prefix", "dispatch_token", "lease_expires_at"):
        op.drop_column("rollouts", column, schema=S)
