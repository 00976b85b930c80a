"""platform schema: transactional task outbox (issue 12: no accepted job is lost)

Revision ID: r0001
Revises: p0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "r0001"
down_revision = "p0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    op.create_table(
        "task_outbox",
        sa.Column("id", sa.String(64), primary_key=True),
        # CELERY_KEY_PREFIX of the deployment that accepted the task: its workers send it
        sa.Column("key_prefix", sa.String(100), nullable=False, server_default=""),
        sa.Column("task_name", sa.String(200), nullable=False),
        sa.Column("args", JSONB, nullable=False, server_default="[]"),
        sa.Column("kwargs", JSONB, nullable=False, server_default="{}"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        schema=S,
    )
    op.create_index("ix_task_outbox_key_prefix_created_at", "task_outbox", ["key_prefix", "created_at"], schema=S)


def downgrade() -> None:
    op.drop_table("task_outbox", schema=S)
