"""entity embeddings: a lease row per queued or running embedding job

`entity_embedding_jobs` holds one row per `embeddings.records` task (its record ids) and one per
`embeddings.backfill` walk (fingerprint and cursor), with a dispatch token (carried in the task id)
and a lease. The embedding lease reaper (app.embeddings.jobs) sends a job past its lease that no
worker holds (advisory lock) again under its current token: a worker killed mid-job is covered after the
lease instead of Redis' visibility timeout, and a message lost with Redis' memory is sent again.
Additive (a new table): the previous release ignores it, and its messages (no lease in their task id)
still run, unleased, as before.

Revision ID: v0005
Revises: v0004
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "v0005"
down_revision = "v0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "entity_embedding_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("entity_id", sa.String(36), nullable=False),
        sa.Column("record_ids", JSONB),
        sa.Column("fingerprint", sa.String(64)),
        sa.Column("after_id", sa.String(36)),
        sa.Column("dispatch_token", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_entity_embedding_jobs_lease", "entity_embedding_jobs", ["key_prefix", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_entity_embedding_jobs_lease", table_name="entity_embedding_jobs")
    op.drop_table("entity_embedding_jobs")
