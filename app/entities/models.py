"""Tables of the entity store (product schema).

- `entity_definitions`: one row per entity type of an org; `schema` is the caller's schema, compiled to
  plain JSON Schema at validation time (app.entities.fieldtypes).
- `entity_views`: saved views (table/kanban/…) of a definition.
- `entity_records`: the records. `fields` is JSONB; `search_vector` is the stored tsvector of the name
  and the text-like fields, written by the services (GIN-indexed).
- `entity_relationships`: directed, typed links between two records of the same org.
- `entity_bulk_jobs`: asynchronous bulk operations (`Prefer: respond-async`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase
from app.wire import new_id, utcnow

__all__ = ["BulkJob", "EntityDefinition", "EntityRecord", "EntityRelationship", "EntityView", "new_id", "utcnow"]


class Audited:
    """Who created / last changed a row, and when."""

    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))
    updated_by: Mapped[str | None] = mapped_column(String(64))


class EntityDefinition(Audited, TenantBase):
    __tablename__ = "entity_definitions"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64))
    display_name: Mapped[str] = mapped_column(String(200))
    module: Mapped[str | None] = mapped_column(String(100))
    description: Mapped[str | None] = mapped_column(Text)
    schema: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    default_view_id: Mapped[str | None] = mapped_column(String(36))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)
    embeddings_config: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    artifact_version: Mapped[int | None] = mapped_column(Integer)
    forked_from_version: Mapped[int | None] = mapped_column(Integer)
    product: Mapped[str | None] = mapped_column(String(40))
    source: Mapped[str | None] = mapped_column(String(100))
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # the READY typed projection table of this definition, if any (app.entities.projection)
    projection: Mapped[str | None] = mapped_column(String(63))


class EntityView(Audited, TenantBase):
    __tablename__ = "entity_views"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_definitions.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(20), default="table")
    description: Mapped[str | None] = mapped_column(Text)
    columns: Mapped[list[str]] = mapped_column(JSONB, default=list)
    filters: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    sort_by: Mapped[str | None] = mapped_column(String(64))
    sort_order: Mapped[int] = mapped_column(Integer, default=-1)
    page_size: Mapped[int | None] = mapped_column(Integer)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class EntityRecord(Audited, TenantBase):
    __tablename__ = "entity_records"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_definitions.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(Text, default="")
    fields: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)
    search_vector: Mapped[Any] = mapped_column(TSVECTOR, deferred=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # The config_hash / record_version of the record's entity_embeddings row (app.embeddings.pipeline
    # keeps them in step): current iff embedded_version = version and the hash is the definition's.
    embedded_hash: Mapped[str | None] = mapped_column(String(64))
    embedded_version: Mapped[int | None] = mapped_column(Integer)


class EntityRelationship(TenantBase):
    __tablename__ = "entity_relationships"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64))
    from_entity_id: Mapped[str] = mapped_column(String(36))
    from_record_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_records.id", ondelete="CASCADE"))
    to_entity_id: Mapped[str] = mapped_column(String(36))
    to_record_id: Mapped[str] = mapped_column(String(36), ForeignKey("entity_records.id", ondelete="CASCADE"))
    relationship_type: Mapped[str] = mapped_column(String(100))
    fields: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(64))


class BulkJob(TenantBase):
    """An asynchronous bulk create/update/delete; `payload` holds the request until the worker ran it."""

    __tablename__ = "entity_bulk_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str] = mapped_column(String(36))
    entity_name: Mapped[str] = mapped_column(String(64))
    operation: Mapped[str] = mapped_column(String(10))
    status: Mapped[str] = mapped_column(String(10), default="pending")
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    user_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # runs a worker started (e0003); the lease reaper fails the job after JOB_MAX_ATTEMPTS (app.entities.bulk)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    key_prefix: Mapped[str] = mapped_column(String(100), default="", server_default="")  # its deployment's reaper
