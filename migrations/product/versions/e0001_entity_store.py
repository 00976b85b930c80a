"""entity store tables: definitions, views, records, relationships, bulk jobs

Revision ID: e0001
Revises: t0001
Create Date: 2026-11-22
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR

revision = "e0001"
down_revision = "t0001"
branch_labels = None
depends_on = None


def _audit() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("created_by", sa.String(64)),
        sa.Column("updated_by", sa.String(64)),
    ]


def upgrade() -> None:
    op.create_table(
        "entity_definitions",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("module", sa.String(100)),
        sa.Column("description", sa.Text),
        sa.Column("schema", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("default_view_id", sa.String(36)),
        sa.Column("metadata", JSONB),
        sa.Column("embeddings_config", JSONB),
        sa.Column("artifact_version", sa.Integer),
        sa.Column("forked_from_version", sa.Integer),
        sa.Column("product", sa.String(40)),
        sa.Column("source", sa.String(100)),
        sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        *_audit(),
    )
    # One active definition per name and org; soft-deleted ones keep their name free for reuse.
    op.create_index("uq_entity_definitions_org_name_active", "entity_definitions", ["org_id", "name"],
                    unique=True, postgresql_where=sa.text("is_active"))
    op.create_index("ix_entity_definitions_org_module", "entity_definitions", ["org_id", "module"])

    op.create_table(
        "entity_views",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("entity_id", sa.String(36),
                  sa.ForeignKey("entity_definitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("type", sa.String(20), nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("columns", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("filters", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("sort_by", sa.String(64)),
        sa.Column("sort_order", sa.Integer, nullable=False, server_default="-1"),
        sa.Column("page_size", sa.Integer),
        sa.Column("is_default", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("config", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        *_audit(),
    )
    op.create_index("ix_entity_views_org_entity", "entity_views", ["org_id", "entity_id"])

    op.create_table(
        "entity_records",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("entity_id", sa.String(36),
                  sa.ForeignKey("entity_definitions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("fields", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("tags", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("metadata", JSONB),
        sa.Column("search_vector", TSVECTOR, nullable=False, server_default=sa.text("''::tsvector")),
        sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        *_audit(),
    )

    op.create_table(
        "entity_relationships",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("from_entity_id", sa.String(36), nullable=False),
        sa.Column("from_record_id", sa.String(36),
                  sa.ForeignKey("entity_records.id", ondelete="CASCADE"), nullable=False),
        sa.Column("to_entity_id", sa.String(36), nullable=False),
        sa.Column("to_record_id", sa.String(36),
                  sa.ForeignKey("entity_records.id", ondelete="CASCADE"), nullable=False),
        sa.Column("relationship_type", sa.String(100), nullable=False),
        sa.Column("fields", JSONB),
        sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("created_by", sa.String(64)),
    )
    op.create_index("ix_entity_relationships_org_from", "entity_relationships", ["org_id", "from_record_id"])
    op.create_index("ix_entity_relationships_org_to", "entity_relationships", ["org_id", "to_record_id"])
    op.create_index("uq_entity_relationships_active_link", "entity_relationships",
                    ["org_id", "from_record_id", "to_record_id", "relationship_type"],
                    unique=True, postgresql_where=sa.text("is_active"))

    op.create_table(
        "entity_bulk_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("entity_id", sa.String(36), nullable=False),
        sa.Column("entity_name", sa.String(64), nullable=False),
        sa.Column("operation", sa.String(10), nullable=False),
        sa.Column("status", sa.String(10), nullable=False, server_default="pending"),
        sa.Column("payload", JSONB),
        sa.Column("result", JSONB),
        sa.Column("error", JSONB),
        sa.Column("user_id", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_entity_bulk_jobs_org_created", "entity_bulk_jobs", ["org_id", "created_at"])


def downgrade() -> None:
    op.drop_table("entity_bulk_jobs")
    op.drop_table("entity_relationships")
    op.drop_table("entity_records")
    op.drop_table("entity_views")
    op.drop_table("entity_definitions")
