"""Entity store logic: definitions, views, records, relationships. No `flask.request` in here.

Every read starts from `tenant_select` (org of the token), records additionally from their
definition, so another org's or another entity's object is a 404. Writes commit here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import current_app
from marshmallow import ValidationError
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from app.db import db
from app.entities.fieldtypes import CompiledSchema, compile_definition_schema, search_document
from app.entities.filters import SEARCH_CONFIG, FieldResolver, FilterContext, FilterLimits, parse_filters
from app.entities.models import EntityDefinition, EntityRecord, EntityRelationship, EntityView, new_id
from app.errors import ApiError, Conflict, NotFound, ValidationFailed
from app.tenancy import current_tenant, tenant_select


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime | None) -> str | None:
    """ISO 8601 UTC with a Z (microseconds kept so values round-trip into filters)."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --- definitions ----------------------------------------------------------------------------------

def definition_to_wire(d: EntityDefinition) -> dict[str, Any]:
    return {
        "id": d.id, "name": d.name, "displayName": d.display_name, "module": d.module,
        "description": d.description, "schema": d.schema, "defaultViewId": d.default_view_id,
        "metadata": d.metadata_, "createdAt": iso(d.created_at), "updatedAt": iso(d.updated_at),
        "createdBy": d.created_by, "updatedBy": d.updated_by, "isActive": d.is_active, "version": d.version,
        "embeddingsConfig": d.embeddings_config, "artifactVersion": d.artifact_version,
        "forkedFromVersion": d.forked_from_version, "product": d.product, "source": d.source, "orgId": d.org_id,
    }


def list_definitions(module: str | None = None, status: str | None = None) -> list[EntityDefinition]:
    """Definitions of the caller's org, optionally by module and status (active / inactive)."""
    stmt = tenant_select(EntityDefinition).order_by(EntityDefinition.name, EntityDefinition.created_at)
    if module is not None:
        stmt = stmt.where(EntityDefinition.module == module)
    if status is not None:
        stmt = stmt.where(EntityDefinition.is_active.is_(status == "active"))
    return list(db.session.scalars(stmt))


def find_definition(name: str, *, include_inactive: bool = False, lock: bool = False) -> EntityDefinition:
    """The org's active definition named `name` (or, if asked, its latest soft-deleted one); else 404."""
    stmt = tenant_select(EntityDefinition).where(EntityDefinition.name == name)
    if not include_inactive:
        stmt = stmt.where(EntityDefinition.is_active.is_(True))
    stmt = stmt.order_by(EntityDefinition.is_active.desc(), EntityDefinition.updated_at.desc()).limit(1)
    if lock:
        stmt = stmt.with_for_update()
    definition = db.session.scalars(stmt).first()
    if definition is None:
        raise NotFound(f"Entity '{name}' not found.")
    return definition


def compiled_schema(definition: EntityDefinition) -> CompiledSchema:
    return compile_definition_schema(definition.schema or {})


def filter_limits() -> FilterLimits:
    config = current_app.config
    return FilterLimits(max_depth=config["ENTITY_FILTER_MAX_DEPTH"],
                        max_conditions=config["ENTITY_FILTER_MAX_CONDITIONS"],
                        max_list=config["ENTITY_FILTER_MAX_LIST"])


def filter_context(definition: EntityDefinition, compiled: CompiledSchema | None = None) -> FilterContext:
    """What filters of this definition are checked and compiled against."""
    compiled = compiled or compiled_schema(definition)
    embeddings = definition.embeddings_config or {}
    return FilterContext(compiled.catalog, embeddings_enabled=bool(embeddings.get("enabled")),
                         limits=filter_limits(), definition_id=definition.id, embeddings_config=embeddings)


def _check_embeddings_config(config: dict | None, compiled: CompiledSchema) -> None:
    if not config:
        return
    unknown = [f for f in config.get("fields", []) if compiled.catalog.get(f) is None and f != "name"]
    if unknown:
        raise ValidationFailed("Invalid embeddingsConfig.", {"fields": {
            "embeddingsConfig.fields": [f"unknown field(s): {', '.join(unknown)}"]}})


_DEFINITION_ATTRS = {"displayName": "display_name", "module": "module", "description": "description",
                     "defaultViewId": "default_view_id", "metadata": "metadata_",
                     "embeddingsConfig": "embeddings_config", "isActive": "is_active"}
_PROVENANCE_ATTRS = {"artifactVersion": "artifact_version", "forkedFromVersion": "forked_from_version",
                     "source": "source"}


def _apply_definition(definition: EntityDefinition, data: dict, *, provenance: bool) -> None:
    if "schema" in data:
        compiled = compile_definition_schema(data["schema"])
        definition.schema = data["schema"]
    else:
        compiled = compile_definition_schema(definition.schema or {})
    _check_embeddings_config(data.get("embeddingsConfig"), compiled)
    attrs = dict(_DEFINITION_ATTRS, **(_PROVENANCE_ATTRS if provenance else {}))
    for key, attr in attrs.items():
        if key in data:
            setattr(definition, attr, data[key])
    if "name" in data:
        definition.name = data["name"]
    if "defaultViewId" in data and data["defaultViewId"] is not None:
        try:
            _owned_view(definition, data["defaultViewId"])
        except NotFound:
            raise ValidationFailed("defaultViewId does not name a view of this entity.",
                                   {"fields": {"defaultViewId": ["unknown view"]}}) from None
    if "defaultViewId" in data and definition.id is not None:  # keep the views' isDefault in step
        db.session.execute(update(EntityView).where(
            EntityView.org_id == definition.org_id, EntityView.entity_id == definition.id)
            .values(is_default=EntityView.id == data["defaultViewId"] if data["defaultViewId"] else False))


def create_definition(data: dict, *, provenance: bool = False, commit: bool = True) -> EntityDefinition:
    """A new definition of the caller's org; the name is unique among the org's active ones (409)."""
    if not data.get("name"):
        raise ValidationFailed("Request validation failed.", {"fields": {"name": ["Missing data for required "
                                                                                 "field."]}})
    tenant = current_tenant()
    data = dict(data)
    data.setdefault("schema", {"type": "object", "properties": {}})
    data.pop("defaultViewId", None)  # no views exist yet
    definition = EntityDefinition(org_id=tenant.org_id, name=data["name"], display_name=data["name"],
                                  product=tenant.product, created_by=tenant.user_id, updated_by=tenant.user_id,
                                  is_active=True, version=1, created_at=utcnow())
    definition.updated_at = definition.created_at
    _apply_definition(definition, data, provenance=provenance)
    if definition.is_active is False:
        raise ValidationFailed("A definition is created active.", {"fields": {"isActive": ["must be true"]}})
    db.session.add(definition)
    _flush_unique(f"An entity named '{definition.name}' already exists.")
    if commit:
        db.session.commit()
    return definition


def update_definition(name: str, data: dict, *, provenance: bool = False, commit: bool = True) -> EntityDefinition:
    """Apply a partial definition; bumps `version`; a stale numeric `version` is 409."""
    definition = find_definition(name, include_inactive=True, lock=True)
    _check_version(data.get("version"), definition.version, "definition")
    previous_embeddings = definition.embeddings_config
    _apply_definition(definition, data, provenance=provenance)
    definition.version += 1
    definition.updated_at = utcnow()
    definition.updated_by = current_tenant().user_id
    _flush_unique(f"An entity named '{definition.name}' already exists.")
    if _write_hooks["definition_changed"] is not None:
        _write_hooks["definition_changed"](db.session, definition, previous_embeddings)
    # Records are not re-validated against a changed schema: they are checked when next written.
    if commit:
        db.session.commit()
    return definition


def delete_definition(name: str, *, delete_records: bool = False, hard_delete: bool = False) -> None:
    """Soft delete (isActive false) by default; `deleteRecords` deletes (or soft-deletes) the records
    too; `hardDelete` removes the definition row, and refuses (409) while records would be orphaned."""
    definition = find_definition(name, include_inactive=hard_delete, lock=True)
    records = select(EntityRecord.id).where(EntityRecord.org_id == definition.org_id,
                                            EntityRecord.entity_id == definition.id)
    if hard_delete:
        if not delete_records and db.session.scalar(select(func.count()).select_from(records.subquery())):
            raise Conflict(f"Entity '{name}' still has records; pass deleteRecords=true to delete them too.")
        delete_relationships_of(records)
        db.session.execute(delete(EntityRecord).where(EntityRecord.org_id == definition.org_id,
                                                      EntityRecord.entity_id == definition.id))
        db.session.delete(definition)
    else:
        if delete_records:
            deactivate_relationships_of(records)
            db.session.execute(update(EntityRecord).where(
                EntityRecord.org_id == definition.org_id, EntityRecord.entity_id == definition.id,
                EntityRecord.is_active.is_(True)).values(is_active=False, updated_at=utcnow()))
        definition.is_active = False
        definition.version += 1
        definition.updated_at = utcnow()
    db.session.commit()


def upsert_definitions(items: list[dict]) -> dict[str, Any]:
    """Admin: create or update each definition by name; one readable error per rejected one."""
    from app.entities.schemas import DefinitionInputSchema

    created = updated = 0
    errors: list[str] = []
    for index, raw in enumerate(items):
        label = f"definitions[{index}]"
        if isinstance(raw, dict) and isinstance(raw.get("name"), str):
            label += f" ({raw['name']})"
        try:
            data = DefinitionInputSchema().load(raw)
            if "name" not in data:
                raise ValidationFailed("name is required.", {"fields": {"name": ["Missing data for required "
                                                                                "field."]}})
            data.pop("version", None)
            with db.session.begin_nested():
                exists = db.session.scalar(tenant_select(EntityDefinition).where(
                    EntityDefinition.name == data["name"], EntityDefinition.is_active.is_(True)))
                if exists:
                    update_definition(data["name"], data, provenance=True, commit=False)
                    updated += 1
                else:
                    create_definition(data, provenance=True, commit=False)
                    created += 1
        except ValidationError as exc:
            errors.append(f"{label}: {_flatten(exc.messages)}")
        except ApiError as exc:
            errors.append(f"{label}: {exc.message}" + (f" {_flatten(exc.details['fields'])}"
                                                       if exc.details and "fields" in exc.details else ""))
    db.session.commit()
    return {"created": created, "updated": updated, "errors": errors}


def _flatten(messages: Any, prefix: str = "") -> str:
    if isinstance(messages, dict):
        return "; ".join(_flatten(v, f"{prefix}{k}: " if not prefix else f"{prefix[:-2]}.{k}: ")
                         for k, v in messages.items())
    if isinstance(messages, list):
        return prefix + ", ".join(str(m) for m in messages)
    return f"{prefix}{messages}"


def _check_version(sent: Any, current: int, what: str) -> None:
    if sent is not None and sent != current:
        raise Conflict(f"The {what} was changed by someone else (version {current}, you sent {sent}); "
                       "reload and retry.", {"currentVersion": current})


def _flush_unique(message: str) -> None:
    try:
        db.session.flush()
    except IntegrityError:
        raise Conflict(message) from None  # the request (or the upsert's savepoint) rolls back


# --- views ----------------------------------------------------------------------------------------

def view_to_wire(v: EntityView, definition: EntityDefinition) -> dict[str, Any]:
    return {"id": v.id, "entityId": v.entity_id, "entityName": definition.name, "name": v.name, "type": v.type,
            "description": v.description, "columns": v.columns, "filters": v.filters, "sortBy": v.sort_by,
            "sortOrder": v.sort_order, "pageSize": v.page_size, "isDefault": v.is_default, "config": v.config,
            "createdAt": iso(v.created_at), "updatedAt": iso(v.updated_at), "createdBy": v.created_by,
            "updatedBy": v.updated_by}


def list_views(definition: EntityDefinition) -> list[EntityView]:
    stmt = tenant_select(EntityView).where(EntityView.entity_id == definition.id).order_by(
        EntityView.created_at, EntityView.id)
    return list(db.session.scalars(stmt))


def _owned_view(definition: EntityDefinition, view_id: str) -> EntityView:
    view = db.session.scalar(tenant_select(EntityView).where(EntityView.id == view_id,
                                                             EntityView.entity_id == definition.id))
    if view is None:
        raise NotFound("View not found.")
    return view


def _check_view(definition: EntityDefinition, data: dict) -> None:
    """Columns, sort field and filters must make sense for the definition (400 naming the problem)."""
    ctx = filter_context(definition)
    resolver = FieldResolver(ctx.catalog)
    problems: dict[str, list[str]] = {}
    for column in data.get("columns") or []:
        try:
            resolver.resolve(column)
        except ValidationFailed:
            problems.setdefault("columns", []).append(f"unknown field '{column}'")
    if data.get("sortBy"):
        try:
            resolver.resolve(data["sortBy"])
        except ValidationFailed:
            problems.setdefault("sortBy", []).append(f"unknown field '{data['sortBy']}'")
    if problems:
        raise ValidationFailed("Invalid view.", {"fields": problems})
    if "filters" in data:
        parse_filters(data["filters"], ctx)


_VIEW_ATTRS = {"name": "name", "type": "type", "description": "description", "columns": "columns",
               "filters": "filters", "sortBy": "sort_by", "sortOrder": "sort_order", "pageSize": "page_size",
               "config": "config"}


def _apply_view(definition: EntityDefinition, view: EntityView, data: dict) -> None:
    _check_view(definition, data)
    for key, attr in _VIEW_ATTRS.items():
        if key in data:
            setattr(view, attr, data[key])
    view.updated_at = utcnow()
    view.updated_by = current_tenant().user_id
    if data.get("isDefault") is True:
        db.session.execute(update(EntityView).where(
            EntityView.org_id == definition.org_id, EntityView.entity_id == definition.id,
            EntityView.id != view.id).values(is_default=False))
        view.is_default = True
        definition.default_view_id = view.id
    elif data.get("isDefault") is False:
        view.is_default = False
        if definition.default_view_id == view.id:
            definition.default_view_id = None


def create_view(definition: EntityDefinition, data: dict) -> EntityView:
    """A saved view of the definition; `isDefault` makes it the definition's defaultViewId."""
    if not data.get("name"):
        raise ValidationFailed("Request validation failed.", {"fields": {"name": ["Missing data for required "
                                                                                 "field."]}})
    tenant = current_tenant()
    _check_view(definition, data)
    view = EntityView(id=new_id(), org_id=tenant.org_id, entity_id=definition.id, name=data["name"], type="table",
                      columns=[], filters={}, sort_order=-1, config={}, is_default=False, created_by=tenant.user_id,
                      created_at=utcnow())
    db.session.add(view)
    _apply_view(definition, view, data)
    db.session.commit()
    return view


def update_view(definition: EntityDefinition, view_id: str, data: dict) -> None:
    view = _owned_view(definition, view_id)
    _apply_view(definition, view, data)
    db.session.commit()


def delete_view(definition: EntityDefinition, view_id: str) -> None:
    view = _owned_view(definition, view_id)
    if definition.default_view_id == view.id:
        definition.default_view_id = None
    db.session.delete(view)
    db.session.commit()


# --- records --------------------------------------------------------------------------------------

RECORD_COLUMNS = ("id", "entity_id", "name", "fields", "tags", "metadata", "created_at", "updated_at",
                  "created_by", "updated_by", "is_active", "version")


def record_to_wire(row: Any) -> dict[str, Any]:
    """An EntityRecord (ORM object or a Core row with RECORD_COLUMNS)."""
    get = (lambda k: getattr(row, k)) if isinstance(row, EntityRecord) else row._mapping.__getitem__
    metadata = row.metadata_ if isinstance(row, EntityRecord) else get("metadata")
    return {"id": get("id"), "entityId": get("entity_id"), "name": get("name"), "fields": get("fields"),
            "tags": get("tags") or [], "metadata": metadata, "createdAt": iso(get("created_at")),
            "updatedAt": iso(get("updated_at")), "createdBy": get("created_by"), "updatedBy": get("updated_by"),
            "isActive": get("is_active"), "version": get("version")}


def unstorable_errors(value: Any, path: str, out: dict[str, list[str]]) -> None:
    """PostgreSQL text and JSONB cannot hold U+0000, JSONB no NaN/Infinity: name each place."""
    if isinstance(value, str):
        if "\x00" in value:
            out.setdefault(path, []).append("must not contain the NUL character")
    elif isinstance(value, float):
        if not math.isfinite(value):
            out.setdefault(path, []).append("must be a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                out.setdefault(path, []).append("keys must not contain the NUL character")
            unstorable_errors(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            unstorable_errors(item, f"{path}[{i}]", out)


def check_storable(payload: Any, what: str = "Request") -> None:
    """400 naming every NUL character or non-finite number in a payload (never a database error)."""
    errors: dict[str, list[str]] = {}
    unstorable_errors(payload, "", errors)
    if errors:
        raise ValidationFailed(f"{what} contains values that cannot be stored.", {"fields": errors})


def record_size_error(item: dict) -> str | None:
    """A record (name, fields, tags, metadata as JSON) may hold ENTITY_MAX_RECORD_BYTES (README)."""
    limit = current_app.config["ENTITY_MAX_RECORD_BYTES"]
    parts = {key: item[key] for key in ("name", "fields", "tags", "metadata") if key in item}
    size = len(json.dumps(parts, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8",
                                                                                             "surrogatepass"))
    return f"a record may be at most {limit} bytes as JSON (this one is {size})" if size > limit else None


def record_errors(compiled: CompiledSchema, item: dict) -> dict[str, list[str]]:
    """Every problem of a record payload: NUL characters, size, then the definition's JSON Schema."""
    errors: dict[str, list[str]] = {}
    for key in ("name", "fields", "tags", "metadata"):
        if key in item:
            unstorable_errors(item[key], key, errors)
    if errors:
        return errors
    size_error = record_size_error(item)
    if size_error:
        return {"(record)": [size_error]}
    fields = item.get("fields", {})
    if not isinstance(fields, dict):
        return {"fields": ["must be an object"]}
    return {} if compiled.is_valid(fields) else compiled.errors_for(fields)


def default_name(item: dict) -> str:
    if isinstance(item.get("name"), str):
        return item["name"]
    fields = item.get("fields") or {}
    for key in ("name", "title", "display_name", "subject"):
        if isinstance(fields.get(key), str):
            return fields[key]
    return ""


def find_record(definition: EntityDefinition, record_id: str, *, lock: bool = False) -> EntityRecord:
    stmt = tenant_select(EntityRecord).where(EntityRecord.id == record_id,
                                             EntityRecord.entity_id == definition.id,
                                             EntityRecord.is_active.is_(True))
    if lock:
        stmt = stmt.with_for_update()
    record = db.session.scalars(stmt).first()
    if record is None:
        raise NotFound("Record not found.")
    return record


def create_record(definition: EntityDefinition, data: dict) -> EntityRecord:
    """Validate `fields` against the definition's schema (every violation listed) and store it."""
    compiled = compiled_schema(definition)
    errors = record_errors(compiled, data)
    if errors:
        raise ValidationFailed("Record does not match the entity schema.", {"fields": errors})
    tenant = current_tenant()
    name, fields = default_name(data), data.get("fields", {})
    now = utcnow()
    record = EntityRecord(id=new_id(), org_id=tenant.org_id, entity_id=definition.id, name=name, fields=fields,
                          created_at=now, updated_at=now,
                          tags=data.get("tags") or [], metadata_=data.get("metadata"), is_active=True, version=1,
                          created_by=tenant.user_id, updated_by=tenant.user_id)
    record.search_vector = func.to_tsvector(SEARCH_CONFIG, search_document(name, fields, compiled.catalog))
    db.session.add(record)
    records_written(db.session, definition, [record.id])
    db.session.commit()
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


def update_record(definition: EntityDefinition, record_id: str, data: dict) -> EntityRecord:
    """Merge `fields`, validate the whole result, bump `version`; a stale `version` is 409."""
    record = find_record(definition, record_id, lock=True)
    _check_version(data.get("version"), record.version, "record")
    compiled = compiled_schema(definition)
    merged = dict(data)
    merged["fields"] = merge_fields(record.fields, data.get("fields") or {})
    errors = record_errors(compiled, merged)
    if errors:
        raise ValidationFailed("Record does not match the entity schema.", {"fields": errors})
    apply_record_update(record, merged, compiled, current_tenant().user_id)
    if data.get("isActive") is False:
        deactivate_relationships_of(select(EntityRecord.id).where(EntityRecord.id == record.id))
    records_written(db.session, definition, [record.id])
    db.session.commit()
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


def delete_record(definition: EntityDefinition, record_id: str, *, hard_delete: bool = False) -> None:
    """Soft delete (hidden from reads, relationships deactivated) or, with hardDelete, remove both."""
    record = find_record(definition, record_id, lock=True)
    ids = select(EntityRecord.id).where(EntityRecord.id == record.id)
    if hard_delete:
        delete_relationships_of(ids)
        db.session.delete(record)
    else:
        deactivate_relationships_of(ids)
        record.is_active = False
        record.updated_at = utcnow()
        record.updated_by = current_tenant().user_id
    db.session.commit()


def _touching(record_ids):
    return or_(EntityRelationship.from_record_id.in_(record_ids), EntityRelationship.to_record_id.in_(record_ids))


def deactivate_relationships_of(record_ids, session=None) -> None:
    (session or db.session).execute(update(EntityRelationship).where(
        _touching(record_ids), EntityRelationship.is_active.is_(True)).values(is_active=False))


def delete_relationships_of(record_ids, session=None) -> None:
    (session or db.session).execute(delete(EntityRelationship).where(_touching(record_ids)))


# Work that follows writes (embeddings, app.embeddings.pipeline) plugs in here. Both hooks run inside
# the writing transaction, before its commit, so they can queue Celery tasks with enqueue_after_commit.
RecordsWrittenHook = Callable[[Session, EntityDefinition, list[str]], None]
DefinitionChangedHook = Callable[[Session, EntityDefinition, dict | None], None]
_write_hooks: dict[str, Any] = {"records_written": None, "definition_changed": None}


def register_write_hooks(*, records_written: RecordsWrittenHook | None = None,
                         definition_changed: DefinitionChangedHook | None = None) -> None:
    """`records_written(session, definition, ids)` after records were created or updated (single or
    bulk, sync or async); `definition_changed(session, definition, previous_embeddings_config)` after
    a definition update."""
    _write_hooks["records_written"] = records_written
    _write_hooks["definition_changed"] = definition_changed


def records_written(session: Session, definition: EntityDefinition, record_ids: list[str]) -> None:
    """Tell the registered hook that these records were created or updated (before the commit)."""
    if _write_hooks["records_written"] is not None and record_ids:
        _write_hooks["records_written"](session, definition, record_ids)


# --- relationships --------------------------------------------------------------------------------

def create_relationship(definition: EntityDefinition, record_id: str, data: dict) -> dict[str, Any]:
    """Link a record to another record of the same org (both must exist and be active)."""
    source = find_record(definition, record_id)
    target_definition = find_definition(data["toEntityName"])
    target = find_record(target_definition, data["toRecordId"])
    errors: dict[str, list[str]] = {}
    unstorable_errors(data.get("fields"), "fields", errors)
    unstorable_errors(data["relationshipType"], "relationshipType", errors)
    if errors:
        raise ValidationFailed("Invalid relationship.", {"fields": errors})
    tenant = current_tenant()
    relationship = EntityRelationship(
        org_id=tenant.org_id, from_entity_id=definition.id, from_record_id=source.id,
        to_entity_id=target_definition.id, to_record_id=target.id, relationship_type=data["relationshipType"],
        fields=data.get("fields"), is_active=True, created_by=tenant.user_id, created_at=utcnow())
    db.session.add(relationship)
    _flush_unique("This relationship already exists.")
    db.session.commit()
    return relationship_to_wire(relationship, definition.name, target_definition.name)


def relationship_to_wire(r: EntityRelationship, from_name: str, to_name: str) -> dict[str, Any]:
    return {"id": r.id, "fromEntityName": from_name, "fromRecordId": r.from_record_id, "toEntityName": to_name,
            "toRecordId": r.to_record_id, "relationshipType": r.relationship_type, "fields": r.fields,
            "createdAt": iso(r.created_at), "isActive": r.is_active}


def list_relationships(definition: EntityDefinition, record_id: str, *, direction: str = "both",
                       relationship_type: str | None = None, target_entity: str | None = None) -> list[dict]:
    """Active relationships of a record; `targetEntity` names the entity on the other end."""
    record = find_record(definition, record_id)
    from_def, to_def = aliased(EntityDefinition), aliased(EntityDefinition)
    rel = EntityRelationship
    stmt = (select(rel, from_def.name, to_def.name)
            .join(from_def, from_def.id == rel.from_entity_id)
            .join(to_def, to_def.id == rel.to_entity_id)
            .where(rel.org_id == record.org_id, rel.is_active.is_(True)))
    outgoing = and_(rel.from_record_id == record.id, *([to_def.name == target_entity] if target_entity else []))
    incoming = and_(rel.to_record_id == record.id, *([from_def.name == target_entity] if target_entity else []))
    stmt = stmt.where({"outgoing": outgoing, "incoming": incoming, "both": or_(outgoing, incoming)}[direction])
    if relationship_type:
        stmt = stmt.where(rel.relationship_type == relationship_type)
    stmt = stmt.order_by(rel.created_at, rel.id)
    return [relationship_to_wire(r, f, t) for r, f, t in db.session.execute(stmt)]


def delete_relationship(definition: EntityDefinition, record_id: str, relationship_id: str) -> None:
    record = find_record(definition, record_id)
    relationship = db.session.scalar(tenant_select(EntityRelationship).where(
        EntityRelationship.id == relationship_id,
        or_(EntityRelationship.from_record_id == record.id, EntityRelationship.to_record_id == record.id)))
    if relationship is None:
        raise NotFound("Relationship not found.")
    db.session.delete(relationship)
    db.session.commit()
