"""entity record embeddings (semantic search): one vector per record, HNSW cosine indexes per dimension

- One row per record (`record_id` PK, cascades with the record). `embedding` is an untyped `vector`
  so definitions can use different models; `dimensions` says its length.
- `config_hash` fingerprints the definition's embedding setup (model, requested dimensions, fields)
  and `record_version` the record version the text was read from: a query only serves rows whose
  both values are current, so a stale vector is never returned (docs/decisions.md, Semantic search).
- HNSW needs a fixed dimension, so there is one partial expression index per supported size:
  `(embedding::vector(N)) vector_cosine_ops WHERE dimensions = N`; above 2 000 dimensions (the limit
  of HNSW on `vector`) the index is on `halfvec(N)`. Other sizes are searched exactly.
- (entity_id, record_id) serves the backfill's keyset scan and exact searches of small definitions.

Revision ID: v0001
Revises: e0002
Create Date: 2026-11-22
"""
import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector

revision = "v0001"
down_revision = "e0002"
branch_labels = None
depends_on = None

# dimensions → pgvector type of the HNSW index (keep in sync with app.embeddings.models.INDEXED_DIMENSIONS)
INDEXED_DIMENSIONS = {384: "vector", 768: "vector", 1024: "vector", 1536: "vector", 3072: "halfvec"}
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64


def upgrade() -> None:
    op.create_table(
        "entity_embeddings",
        sa.Column("record_id", sa.String(36), sa.ForeignKey("entity_records.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("entity_id", sa.String(36), sa.ForeignKey("entity_definitions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dimensions", sa.Integer, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("record_version", sa.Integer, nullable=False),
        sa.Column("embedding", Vector(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("dimensions > 0 AND dimensions = vector_dims(embedding)", name="dimensions"),
    )
    op.create_index("ix_entity_embeddings_entity_record", "entity_embeddings", ["entity_id", "record_id"])
    for dims, kind in INDEXED_DIMENSIONS.items():
        op.execute(
            f"CREATE INDEX ix_entity_embeddings_hnsw_{dims} ON entity_embeddings "
            f"USING hnsw ((embedding::{kind}({dims})) {kind}_cosine_ops) "
            f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) WHERE dimensions = {dims}")


def downgrade() -> None:
    for dims in INDEXED_DIMENSIONS:
        op.execute(f"DROP INDEX IF EXISTS ix_entity_embeddings_hnsw_{dims}")
    op.drop_index("ix_entity_embeddings_entity_record", table_name="entity_embeddings")
    op.drop_table("entity_embeddings")
