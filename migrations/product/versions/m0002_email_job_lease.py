"""email: a lease on every unfinished bulk job (sliced sending, re-dispatched by a reaper)

A bulk job is sent in slices, one task each, the next chained through the outbox. The job row carries
the lease: `lease_expires_at` (renewed by every slice; a job past it that no worker holds is dispatched
again by the email lease reaper) and `dispatch_token` (the number of the one message that may run the
next slice; a reaped job gets a new number, so a late duplicate of the old message does nothing).
Jobs left `queued`/`sending` by the previous release get an expired lease: the reaper finishes them.
Additive (nullable / defaulted columns and a partial index): the previous release ignores them.

Revision ID: m0002
Revises: m0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "m0002"
down_revision = "m0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("email_jobs", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("email_jobs", sa.Column("dispatch_token", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("email_jobs", sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""))
    op.create_index("ix_email_jobs_lease_expires_at", "email_jobs", ["key_prefix", "lease_expires_at"],
                    postgresql_where=sa.text("status <> 'done'"))
    op.execute("UPDATE email_jobs SET lease_expires_at = now() WHERE status <> 'done'")


def downgrade() -> None:
    op.drop_index("ix_email_jobs_lease_expires_at", table_name="email_jobs")
    op.drop_column("email_jobs", "key_prefix")
    op.drop_column("email_jobs", "dispatch_token")
    op.drop_column("email_jobs", "lease_expires_at")
