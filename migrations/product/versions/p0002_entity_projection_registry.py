"""entity projections: the registry the product schema's one dispatching trigger reads

Each typed projection (app.entities.projection) used to add three statement-level triggers of its own
on entity_records. Now one trigger set per product schema (`erp_dispatch_i/_u/_d`, created at run
time with the first projection) runs one function generated from this table: the projections being
maintained (built or ready) and the statements that maintain each after an INSERT / UPDATE / DELETE.

Revision ID: p0002
Revises: p0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "p0002"
down_revision = "p0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "entity_projections",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("definition_id", sa.String(64), nullable=False, index=True),
        sa.Column("on_insert", sa.Text, nullable=False),
        sa.Column("on_update", sa.Text, nullable=False),
        sa.Column("on_delete", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("entity_projections")
