"""entity embeddings: covering index for the "current vector" check

`$similar` counts (totalCount) and the backfill's "no current vector" scan test, for every record of a
definition, entity_id + config_hash + record_id + record_version (+ org_id, dimensions). The vector
rows are wide (1.5 KB at 384 dims, 6 KB at 1536), so reading them for that is a scan of the whole
table; this index answers it with an index-only scan (measured: a 100 000-record count went from
280 ms to 150 ms, the rest is the join with entity_records). It supersedes (entity_id, record_id).

Revision ID: v0002
Revises: v0001
Create Date: 2026-11-22
"""
from alembic import op

revision = "v0002"
down_revision = "v0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entity_embeddings_current", "entity_embeddings", ["entity_id", "config_hash", "record_id"],
                    postgresql_include=["org_id", "dimensions", "record_version"])
    op.drop_index("ix_entity_embeddings_entity_record", table_name="entity_embeddings")


def downgrade() -> None:
    op.create_index("ix_entity_embeddings_entity_record", "entity_embeddings", ["entity_id", "record_id"])
    op.drop_index("ix_entity_embeddings_current", table_name="entity_embeddings")
