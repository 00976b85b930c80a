"""entity embeddings: count the runs of an embedding job that started without finishing

`entity_embedding_jobs.attempts`: every run a worker starts adds one (Celery's own retries of a
transient error excepted), a backfill step that moves the walk on sets it back to 0. The embedding
lease reaper (app.embeddings.jobs) sends a job past its lease again until it has used
JOB_MAX_ATTEMPTS runs, then drops it and records why in platform.failed_tasks.
Additive (a defaulted column): the previous release ignores it.

Revision ID: v0006
Revises: v0005
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "v0006"
down_revision = "v0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entity_embedding_jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("entity_embedding_jobs", "attempts")
