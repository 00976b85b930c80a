"""The `entity_embeddings` table (product schema): one vector per entity record.

A row is *current* for a record when its `config_hash` equals the definition's present embedding
setup and its `record_version` equals the record's `version`; only current rows take part in
`$similar` (app.embeddings.search). Written by the Celery pipeline (app.embeddings.pipeline).
"""

from __future__ import annotations

from datetime import datetime

from pgvector.sqlalchemy import Vector
from sqlalchemy import BigInteger, Column, DateTime, ForeignKey, Integer, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase
from app.entities.models import utcnow

# dimensions → pgvector type of its partial HNSW index (migration v0001); other sizes are searched exactly.
# HNSW indexes `vector` up to 2 000 dimensions, `halfvec` up to 4 000.
INDEXED_DIMENSIONS = {384: "vector", 768: "vector", 1024: "vector", 1536: "vector", 3072: "halfvec"}


class EntityEmbedding(TenantBase):
    __tablename__ = "entity_embeddings"

    record_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_records.id", ondelete="CASCADE"),
                                           primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_definitions.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    dimensions: Mapped[int] = mapped_column(Integer)
    config_hash: Mapped[str] = mapped_column(String(64))
    content_hash: Mapped[str] = mapped_column(String(64))
    record_version: Mapped[int] = mapped_column(Integer)
    embedding: Mapped[list[float]] = mapped_column(Vector())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# Per (org, definition, embedding setup): how many active records are stamped with a current vector,
# as delta rows summed at read (migration v0004 keeps it in the writers' own transactions by triggers
# on entity_records; no primary key: rows are only inserted, and compacted by the writers).
EMBEDDED_COUNTS = Table(
    "entity_embedded_counts", TenantBase.metadata,
    Column("org_id", String(64), nullable=False),
    Column("entity_id", String(36), nullable=False),
    Column("embedded_hash", String(64), nullable=False),
    Column("n", BigInteger, nullable=False),
)
