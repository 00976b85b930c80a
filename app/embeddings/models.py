"""The `entity_embeddings` table (product schema): one vector per entity record.

A row is *current* for a record when its `config_hash` equals the definition's present embedding
setup and its `record_version` equals the record's `version`; only current rows take part in
`$similar` (app.embeddings.search). Written by the Celery pipeline (app.embeddings.pipeline).
"""

from __future__ import annotations

from datetime import datetime

from pgvector.sqlalchemy import Vector
from sqlalchemy import BigInteger, Column, DateTime, ForeignKey, Integer, String, Table
from sqlalchemy.dialects.postgresql import JSONB
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


class EmbeddingJob(TenantBase):
    """The lease of one queued or running embedding job (migration v0005; app.embeddings.jobs).

    `records`: the ids of one `embeddings.records` task; the row goes when the task is done.
    `backfill`: one walk of a definition (`fingerprint`: the setup walked, `after_id`: its cursor);
    each step moves the cursor and the token on, the last one deletes the row.
    The message that may run the job is the one whose task id carries `dispatch_token`
    (app.tasks.lease_message_id); the lease reaper sends a job past `lease_expires_at` that no worker
    holds again, under the same token: the first of the two messages to run does the job, the other
    then does nothing."""

    __tablename__ = "entity_embedding_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    org_id: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str] = mapped_column(String(36))
    record_ids: Mapped[list[str] | None] = mapped_column(JSONB)
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    after_id: Mapped[str | None] = mapped_column(String(36))
    dispatch_token: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    key_prefix: Mapped[str] = mapped_column(String(100), default="")
    # runs started without finishing (v0006); past JOB_MAX_ATTEMPTS the reaper drops the job (failed_tasks)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
