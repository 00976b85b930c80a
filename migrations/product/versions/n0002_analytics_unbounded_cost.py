"""analytics: aggregate cost columns without a precision cap

A message may cost up to 1e9 (the API's bound) and numeric(18,6) holds less than 1e12, so about a
thousand such messages in one chat, or one org/day/agent/channel, made the batch's UPDATE fail and the
whole batch (every org's events) was set aside. Sums are now unbounded `numeric`; relaxing a numeric
typmod rewrites nothing.

Revision ID: n0002
Revises: n0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "n0002"
down_revision = "n0001"
branch_labels = None
depends_on = None

TABLES = ("analytics_chats", "analytics_rollup", "analytics_usage")


def upgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "cost", type_=sa.Numeric(), existing_type=sa.Numeric(18, 6),
                        existing_nullable=False)


def downgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "cost", type_=sa.Numeric(18, 6), existing_type=sa.Numeric(), existing_nullable=False)
