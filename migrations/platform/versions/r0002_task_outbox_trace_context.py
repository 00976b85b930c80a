"""platform schema: the W3C trace context of an outbox task (traces run from the request into the task)

Revision ID: r0002
Revises: r0001
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "r0002"
down_revision = "r0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    # nullable, no default: adding it rewrites nothing, and a previous release's rows and inserts (which
    # do not name it) stay valid, so a rollback of the code alone keeps working
    op.add_column("task_outbox", sa.Column("trace_context", JSONB), schema=S)


def downgrade() -> None:
    op.drop_column("task_outbox", "trace_context", schema=S)
