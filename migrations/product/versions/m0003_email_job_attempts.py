"""email: count the slice runs of a bulk job that started without progress; a job-level error

`email_jobs.attempts`: every slice run a worker starts adds one, a slice that records deliveries
sets it back to 0. The email lease reaper (app.email.bulk) dispatches a job past its lease again
until it has used JOB_MAX_ATTEMPTS runs without progress, then ends it: its unsent recipients are
failed with the reason, which is also the job's `error` (GET /email/bulk-send/{id}).
Additive (a defaulted and a nullable column): the previous release ignores them.

Revision ID: m0003
Revises: m0002
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "m0003"
down_revision = "m0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("email_jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("email_jobs", sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("email_jobs", "error")
    op.drop_column("email_jobs", "attempts")
