"""platform schema: artifact registry provenance per org, rollouts and their per-org outcomes

Revision ID: o0001
Revises: p0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "o0001"
down_revision = "p0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("position", sa.Integer, nullable=False, server_default="0"), schema=S)
    op.create_table(
        "org_artifacts",
        sa.Column("org_id", sa.String(64), primary_key=True),
        sa.Column("product", sa.String(40), primary_key=True),
        sa.Column("artifact_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("object_id", sa.String(200), nullable=False),
        sa.Column("artifact_version", sa.Integer, nullable=False),
        sa.Column("stamp", sa.String(64)),
        sa.Column("forked_from_version", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_index("ix_org_artifacts_artifact_id", "org_artifacts", ["artifact_id", "org_id"], schema=S)
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("artifact_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("artifact_version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("cursor_org", sa.String(64), nullable=False, server_default=""),
        sa.Column("cursor_product", sa.String(40), nullable=False, server_default=""),
        sa.Column("total", sa.Integer, nullable=False, server_default="0"),
        sa.Column("counts", JSONB, nullable=False, server_default="{}"),
        sa.Column("error", sa.Text),
        sa.Column("created_by", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        schema=S,
    )
    op.create_table(
        "rollout_outcomes",
        sa.Column("rollout_id", sa.String(64), sa.ForeignKey(f"{S}.rollouts.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("org_id", sa.String(64), primary_key=True),
        sa.Column("product", sa.String(40), primary_key=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("rollout_outcomes", schema=S)
    op.drop_table("rollouts", schema=S)
    op.drop_index("ix_org_artifacts_artifact_id", table_name="org_artifacts", schema=S)
    op.drop_table("org_artifacts", schema=S)
    op.drop_column("artifacts", "position", schema=S)
