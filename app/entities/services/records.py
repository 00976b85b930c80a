"""Records of a definition: wire shape, validation, CRUD, the write hook, and what deleting records does to
their relationships."""

from __future__ import annotations

import json
from typing import Any

from flask import current_app
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from app.db import db
from app.entities import hooks
from app.entities.fieldtypes import CompiledSchema, search_document
from app.entities.filters import SEARCH_CONFIG
from app.entities.models import EntityDefinition, EntityRecord, EntityRelationship
from app.entities.services.common import (
    check_version,
    unstorable_errors,
)
from app.entities.services.context import compiled_schema
from app.errors import NotFound, ValidationFailed
from app.preconditions import etag, require_match
from app.tenancy import Tenant, tenant_select
from app.wire import iso, new_id, utcnow

RECORD_COLUMNS = ("id", "entity_id", "name", "fields", "tags", "metadata", "created_at", "updated_at",
                  "created_by", "updated_by", "is_active", "version")


def record_to_wire(row: Any) -> dict[str, Any]:
    """An EntityRecord (ORM object, Core row or mapping with RECORD_COLUMNS)."""
    if isinstance(row, EntityRecord):
        get = lambda k: getattr(row, k)  # noqa: E731
    else:
        get = row.__getitem__ if isinstance(row, dict) else row._mapping.__getitem__
    metadata = row.metadata_ if isinstance(row, EntityRecord) else get("metadata")
    return {"id": get("id"), "entityId": get("entity_id"), "name": get("name"), "fields": get("fields"),
            "tags": get("tags") or [], "metadata": metadata, "createdAt": iso(get("created_at")),
            "updatedAt": iso(get("updated_at")), "createdBy": get("created_by"), "updatedBy": get("updated_by"),
            "isActive": get("is_active"), "version": get("version")}


def record_size_error(item: dict, text: str | None = None) -> str | None:
    """A record (name, fields, tags, metadata as JSON) may hold ENTITY_MAX_RECORD_BYTES (README).
    `text`: that JSON, when the caller has it already (`_record_json`)."""
    limit = current_app.config["ENTITY_MAX_RECORD_BYTES"]
    if text is None:
        parts = {key: item[key] for key in ("name", "fields", "tags", "metadata") if key in item}
        text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), default=str)
    size = len(text.encode("utf-8", "surrogatepass"))
    return f"a record may be at most {limit} bytes as JSON (this one is {size})" if size > limit else None


def _record_json(item: dict) -> tuple[str, str | None] | None:
    """The record's JSON as record_size_error measures it and the JSON of its `fields` (None when
    absent), or None when it holds a non-finite number (json raises with allow_nan=False). Dumped part
    by part: `{"name":…,"fields":…}` is exactly what one dump of the dict gives with these separators."""
    parts = {}
    try:
        for key in ("name", "fields", "tags", "metadata"):
            if key in item:
                parts[key] = json.dumps(item[key], ensure_ascii=False, separators=(",", ":"), default=str,
                                        allow_nan=False)
    except ValueError:
        return None
    return "{" + ",".join(f'"{key}":{value}' for key, value in parts.items()) + "}", parts.get("fields")


def record_errors(compiled: CompiledSchema, item: dict) -> dict[str, list[str]]:
    """Every problem of a record payload: non-finite numbers, size, then the definition's JSON Schema."""
    return checked_record(compiled, item)[0]


def checked_record(compiled: CompiledSchema, item: dict) -> tuple[dict[str, list[str]], str | None]:
    """`record_errors`, and the JSON text of a valid record's `fields` when it was dumped on the way
    (a bulk create COPYs it as it is). One JSON dump answers the storable and size checks for the usual
    record (`_record_json`); the exact walk names each place when it cannot."""
    errors: dict[str, list[str]] = {}
    dumped = _record_json(item)
    # what JSONB cannot store: a non-finite number (a NUL character never gets here: app.jsonbody)
    if dumped is None:
        for key in ("name", "fields", "tags", "metadata"):
            if key in item:
                unstorable_errors(item[key], key, errors)
        if errors:
            return errors, None
    size_error = record_size_error(item, dumped[0] if dumped else None)
    if size_error:
        return {"(record)": [size_error]}, None
    fields = item.get("fields", {})
    if not isinstance(fields, dict):
        return {"fields": ["must be an object"]}, None
    if not compiled.is_valid(fields):
        return compiled.errors_for(fields), None
    return {}, dumped[1] if dumped else None


def default_name(item: dict) -> str:
    if isinstance(item.get("name"), str):
        return item["name"]
    fields = item.get("fields") or {}
    for key in ("name", "title", "display_name", "subject"):
        if isinstance(fields.get(key), str):
            return fields[key]
    return ""


def find_record(definition: EntityDefinition, record_id: str, *, lock: bool = False,
                session: Session | None = None) -> EntityRecord:
    """The definition's active record `record_id` (404 otherwise), read with `session` (by default the
    request's)."""
    stmt = tenant_select(EntityRecord, definition.org_id).where(EntityRecord.id == record_id,
                                             EntityRecord.entity_id == definition.id,
                                             EntityRecord.is_active.is_(True))
    if lock:
        stmt = stmt.with_for_update()
    record = (session or db.session).scalars(stmt).first()
    if record is None:
        raise NotFound("Record not found.")
    return record


def create_record(session: Session, tenant: Tenant, definition: EntityDefinition, data: dict) -> EntityRecord:
    """Validate `fields` against the definition's schema (every violation listed) and store it."""
    compiled = compiled_schema(definition)
    errors = record_errors(compiled, data)
    if errors:
        raise ValidationFailed("Record does not match the entity schema.", {"fields": errors})
    name, fields = default_name(data), data.get("fields", {})
    now = utcnow()
    record = EntityRecord(id=new_id(), org_id=tenant.org_id, entity_id=definition.id, name=name, fields=fields,
                          created_at=now, updated_at=now,
                          tags=data.get("tags") or [], metadata_=data.get("metadata"), is_active=True, version=1,
                          created_by=tenant.user_id, updated_by=tenant.user_id)
    record.search_vector = func.to_tsvector(SEARCH_CONFIG, search_document(name, fields, compiled.catalog))
    session.add(record)
    records_written(session, tenant.product, definition, [record.id])
    session.flush()
    return record


def merge_fields(current: dict, patch: dict) -> dict:
    """Top-level merge: keys in `patch` replace, a null value removes the key (JSON merge patch)."""
    merged = dict(current or {})
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def update_record(session: Session, tenant: Tenant, definition: EntityDefinition, record_id: str,
                  data: dict, *, if_match=None) -> EntityRecord:
    """Merge `fields`, validate the whole result, bump `version`; a stale `version` is 409, a stale
    If-Match (`if_match`, app.preconditions) 412: both compared with the row locked for the update."""
    record = find_record(definition, record_id, lock=True, session=session)
    require_match(if_match, etag(record.version), "record")
    check_version(data.get("version"), record.version, "record")
    compiled = compiled_schema(definition)
    merged = dict(data)
    merged["fields"] = merge_fields(record.fields, data.get("fields") or {})
    errors = record_errors(compiled, merged)
    if errors:
        raise ValidationFailed("Record does not match the entity schema.", {"fields": errors})
    apply_record_update(record, merged, compiled, tenant.user_id)
    if data.get("isActive") is False:
        deactivate_relationships_of(select(EntityRecord.id).where(EntityRecord.id == record.id), session)
    records_written(session, tenant.product, definition, [record.id])
    session.flush()
    return record


def apply_record_update(record: EntityRecord, merged: dict, compiled: CompiledSchema, user_id: str) -> None:
    record.fields = merged["fields"]
    if "name" in merged:
        record.name = merged["name"]
    if "tags" in merged:
        record.tags = merged["tags"] or []
    if "metadata" in merged:
        record.metadata_ = merged["metadata"]
    if "isActive" in merged:
        record.is_active = merged["isActive"]
    record.search_vector = func.to_tsvector(SEARCH_CONFIG,
                                            search_document(record.name, record.fields, compiled.catalog))
    record.version += 1
    record.updated_at = utcnow()
    record.updated_by = user_id


def delete_record(session: Session, tenant: Tenant, definition: EntityDefinition, record_id: str, *,
                  hard_delete: bool = False, if_match=None) -> None:
    """Soft delete (hidden from reads, relationships deactivated) or, with hardDelete, remove both; a stale
    If-Match is 412."""
    record = find_record(definition, record_id, lock=True, session=session)
    require_match(if_match, etag(record.version), "record")
    ids = select(EntityRecord.id).where(EntityRecord.id == record.id)
    if hard_delete:
        delete_relationships_of(ids, session)
        session.delete(record)
    else:
        deactivate_relationships_of(ids, session)
        record.is_active = False
        record.updated_at = utcnow()
        record.updated_by = tenant.user_id
    session.flush()


def _touching(record_ids):
    return or_(EntityRelationship.from_record_id.in_(record_ids), EntityRelationship.to_record_id.in_(record_ids))


def deactivate_relationships_of(record_ids, session: Session) -> None:
    session.execute(update(EntityRelationship).where(
        _touching(record_ids), EntityRelationship.is_active.is_(True)).values(is_active=False))


def delete_relationships_of(record_ids, session: Session) -> None:
    session.execute(delete(EntityRelationship).where(_touching(record_ids)))


def records_written(session: Session, product: str, definition: EntityDefinition, record_ids: list[str]) -> None:
    """Tell the app's hook (app.entities.hooks) that these records were created or updated (before the commit)."""
    hook = hooks.current().records_written
    if hook is not None and record_ids:
        hook(session, product, definition, record_ids)
