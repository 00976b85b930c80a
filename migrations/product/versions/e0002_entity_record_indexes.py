"""entity record indexes: listing order, JSONB containment, full-text search

- (org_id, entity_id, created_at, id): every record query starts with org + entity and the default
  order is created_at with an id tiebreak, so page 1 of an unfiltered listing is an index scan.
- GIN (fields jsonb_path_ops): equality / $in-on-arrays / $contains-on-arrays compile to `@>`.
- GIN (search_vector): `$search` (websearch_to_tsquery) matches.

Revision ID: e0002
Revises: e0001
Create Date: 2026-11-22
"""
from alembic import op

revision = "e0002"
down_revision = "e0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entity_records_org_entity_created", "entity_records",
                    ["org_id", "entity_id", "created_at", "id"])
    op.create_index("ix_entity_records_fields", "entity_records", ["fields"], postgresql_using="gin",
                    postgresql_ops={"fields": "jsonb_path_ops"})
    op.create_index("ix_entity_records_search", "entity_records", ["search_vector"], postgresql_using="gin")


def downgrade() -> None:
    op.drop_index("ix_entity_records_search", table_name="entity_records")
    op.drop_index("ix_entity_records_fields", table_name="entity_records")
    op.drop_index("ix_entity_records_org_entity_created", table_name="entity_records")
