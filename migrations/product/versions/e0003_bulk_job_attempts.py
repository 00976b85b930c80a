"""entity store: count the runs of an async bulk job that started without finishing

`entity_bulk_jobs.attempts`: every run a worker starts adds one. The bulk job lease reaper
(app.entities.bulk) re-queues a `running` job whose worker is gone (killed, or the task time limit)
until it has used JOB_MAX_ATTEMPTS runs, then fails it with the reason in `error` (GET /jobs/{id}),
instead of re-queuing a job that can never finish again and again.
Additive (a defaulted column): the previous release ignores it.

Revision ID: e0003
Revises: e0002
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "e0003"
down_revision = "e0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entity_bulk_jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("entity_bulk_jobs", "attempts")
