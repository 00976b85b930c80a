"""entity store: count the runs of an async bulk job that started without finishing; its deployment

`entity_bulk_jobs.attempts`: every run a worker starts adds one. The bulk job lease reaper
(app.entities.bulk) re-queues a `running` job whose worker is gone (killed, or the task time limit)
until it has used JOB_MAX_ATTEMPTS runs, then fails it with the reason in `error` (GET /jobs/{id}),
instead of re-queuing a job that can never finish again and again.
`entity_bulk_jobs.key_prefix`: the deployment (CELERY_KEY_PREFIX) whose reaper watches the job, as for
the other leased jobs: deployments sharing a database no longer re-queue each other's jobs through
their own broker. Jobs of the previous release have '' (the deployment without a prefix reaps them;
a prefixed one adopts a job when its worker claims it).
Additive (defaulted columns): the previous release ignores them.

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
    op.add_column("entity_bulk_jobs", sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""))


def downgrade() -> None:
    op.drop_column("entity_bulk_jobs", "key_prefix")
    op.drop_column("entity_bulk_jobs", "attempts")
