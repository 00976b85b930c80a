"""image_usage: one usage line per image call (provider, model, tokens, latency, outcome)

Revision ID: i0001
Revises: t0001
Create Date: 2026-11-22
"""
import sqlalchemy as sa
from alembic import op

revision = "i0001"
down_revision = "t0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "image_usage",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128)),
        sa.Column("service", sa.String(64), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer, nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("total_tokens", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cost", sa.Numeric(14, 6)),
        sa.Column("latency_ms", sa.Integer, nullable=False),
        sa.Column("image_bytes", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_image_usage"),
    )
    op.create_index("ix_image_usage_org_created", "image_usage", ["org_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_image_usage_org_created", table_name="image_usage")
    op.drop_table("image_usage")
