"""Entity definitions: list, find, create, update (with the embeddings hook), delete, admin upsert."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import current_app, g
from marshmallow import ValidationError
from sqlalchemy import Integer, Text, bindparam, delete, func, literal, literal_column, select, tuple_, update
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from app.db import db, schema_for
from app.entities import budget as page_budget
from app.entities import cursor as keyset
from app.entities import hooks, indexes
from app.entities.fieldtypes import CompiledSchema, compile_definition_schema
from app.entities.models import EntityDefinition, EntityRecord, EntityView
from app.entities.projection import follow_schema
from app.entities.schemas import DefinitionInputSchema
from app.entities.services.common import (
    check_version,
    flatten_messages,
    flush_unique,
)
from app.entities.services.context import DefinitionContext, definition_context, filter_limits
from app.entities.services.records import (
    deactivate_relationships_of,
    delete_relationships_of,
)
from app.entities.services.views import owned_view
from app.errors import ApiError, Conflict, NotFound, ValidationFailed
from app.preconditions import etag, require_match
from app.tenancy import Tenant, current_org, tenant_select
from app.wire import iso, utcnow


def definition_to_wire(d: EntityDefinition) -> dict[str, Any]:
    return {
        "id": d.id, "name": d.name, "displayName": d.display_name, "module": d.module,
        "description": d.description, "schema": d.schema, "defaultViewId": d.default_view_id,
        "metadata": d.metadata_, "createdAt": iso(d.created_at), "updatedAt": iso(d.updated_at),
        "createdBy": d.created_by, "updatedBy": d.updated_by, "isActive": d.is_active, "version": d.version,
        "embeddingsConfig": d.embeddings_config, "artifactVersion": d.artifact_version,
        "forkedFromVersion": d.forked_from_version, "product": d.product, "source": d.source, "orgId": d.org_id,
    }


def etag_of(d: EntityDefinition) -> str:
    """The definition's entity tag (app.preconditions): its version, and its default view, which a view
    create or delete changes without a new version."""
    return etag(d.version if d.default_view_id is None else f"{d.version}.{d.default_view_id}")


def list_definitions(module: str | None = None, status: str | None = None) -> list[EntityDefinition]:
    """Definitions of the caller's org, optionally by module and status (active / inactive)."""
    stmt = tenant_select(EntityDefinition).order_by(EntityDefinition.name, EntityDefinition.created_at)
    if module is not None:
        stmt = stmt.where(EntityDefinition.module == module)
    if status is not None:
        stmt = stmt.where(EntityDefinition.is_active.is_(status == "active"))
    return list(db.session.scalars(stmt))


LIST_ID = "definitions"


def list_definitions_page(module: str | None = None, status: str | None = None, *, limit: int | None = None,
                          cursor: str | None = None) -> tuple[list[EntityDefinition], str | None]:
    """A page of `list_definitions` (by name, then creation, then id) and the cursor of the next page
    (None on the last). The cursor is the entity store's keyset cursor (app.entities.cursor), bound to
    the org, this list and its filters; its key is the last row's (name, createdAt)."""
    org = current_org()
    digest = keyset.query_digest({"filters": {"module": module, "status": status}})
    limit, budget, _servable = page_budget.bounds(limit, "ENTITY_LIST_DEFAULT_LIMIT", "ENTITY_LIST_MAX_BYTES")
    D = EntityDefinition
    stmt = (tenant_select(D).with_only_columns(D.id, D.name, D.created_at, (ROW_SIZE + page_budget.ITEM_FIXED_BYTES)
                                               .label("size"))
            .order_by(D.name, D.created_at, D.id).limit(limit + 1))
    if module is not None:
        stmt = stmt.where(D.module == module)
    if status is not None:
        stmt = stmt.where(D.is_active.is_(status == "active"))
    if cursor:
        position = keyset.decode(cursor, org, LIST_ID, digest, path="cursor", what="list")
        try:
            name, created = position.key
            created_at = datetime.fromisoformat(created)
        except (TypeError, ValueError):
            raise ValidationFailed("Invalid cursor: not a cursor of this list.",
                                   {"fields": {"cursor": ["not a cursor of this list"]}}) from None
        stmt = stmt.where(tuple_(D.name, D.created_at, D.id) > tuple_(literal(name), literal(created_at),
                                                                      literal(position.id)))
    rows, more = page_budget.page_rows(db.session, D, stmt, (D.name, D.created_at, D.id), limit, budget)
    if not more:
        return rows, None
    last = rows[-1]
    return rows, keyset.encode(org, LIST_ID, digest,
                               keyset.Position(0, [last.name, last.created_at.isoformat()], last.id))


def find_definition(name: str, *, include_inactive: bool = False, lock: bool = False, session: Session | None = None,
                    org_id: str | None = None) -> EntityDefinition:
    """The org's active definition named `name` (or, if asked, its latest soft-deleted one); else 404.
    Read with `session` for org `org_id` (a write's); by default the request's session and tenant."""
    stmt = tenant_select(EntityDefinition, org_id).where(EntityDefinition.name == name)
    if not include_inactive:
        stmt = stmt.where(EntityDefinition.is_active.is_(True))
    stmt = stmt.order_by(EntityDefinition.is_active.desc(), EntityDefinition.updated_at.desc()).limit(1)
    if lock:
        stmt = stmt.with_for_update()
    definition = (session or db.session).scalars(stmt).first()
    if definition is None:
        raise NotFound(f"Entity '{name}' not found.")
    return definition


_D = EntityDefinition.__table__
# What identifies one committed version of a definition row: its xmin (the transaction that wrote this
# row version: every UPDATE by any path, the projection pointer's too, writes a new one) and its
# version. A deleted row has none. Compared as text (DefinitionCache). Both operands cast to text: `text ||
# integer` is textanycat, an SQL-language function the planner inlines by parsing its body on every plan.
ROW_TOKEN = literal_column("entity_definitions.xmin::text || ':' || entity_definitions.version::text", Text)
# What a cached copy of the row holds, roughly (DefinitionCache weighs its entries by it): the characters
# of its unbounded columns (a schema of MAX_PROPERTIES described properties; `metadata`, any JSON up to
# the body limit), counted by the server beside the read (only a cache miss reads the row)
ROW_SIZE = literal_column(
    "octet_length(entity_definitions.schema::text)"
    " + coalesce(octet_length(entity_definitions.metadata::text), 0)"
    " + coalesce(octet_length(entity_definitions.embeddings_config::text), 0)"
    " + coalesce(octet_length(entity_definitions.description), 0)", Integer)
# find_definition(name) as one constant statement (db.read_first renders it once per product)
_ACTIVE_DEFINITION = (select(_D, ROW_TOKEN.label("row_token"), ROW_SIZE.label("row_size"))
                      .where(_D.c.org_id == bindparam("org"), _D.c.name == bindparam("name"), _D.c.is_active.is_(True))
                      .order_by(_D.c.updated_at.desc()).limit(1))
# the current token of definition `definition_token_id` (NULL once deleted): a scalar subquery a
# data statement selects beside its answer, so that both come from the same snapshot
TOKEN_OF = select(ROW_TOKEN).where(_D.c.id == bindparam("definition_token_id")).scalar_subquery()
_TOKEN_OF = select(TOKEN_OF.label("row_token"))
_ATTRIBUTES = [(prop.key, prop.columns[0].name) for prop in sa_inspect(EntityDefinition).column_attrs]


def _read_row(name: str) -> dict[str, Any]:
    """The org's active definition row `name` with its row token (one round trip), else 404."""
    row = db.read_first(_ACTIVE_DEFINITION, {"org": current_org(), "name": name})
    if row is None:
        raise NotFound(f"Entity '{name}' not found.")
    return row


DEFINITION_CACHE_MAX = 512  # definitions kept per app (least recently used dropped first)
# ... and at most this many characters of their rows (ROW_SIZE; their compiled forms come on top, a few
# times that): a tenant picks the size of its rows, the count alone bounds nothing
DEFINITION_CACHE_MAX_CHARS = 16_000_000


@dataclass(frozen=True)
class CachedDefinition:
    """A definition as read (`context`: the transient EntityDefinition, its compiled schema and filter
    context) with the row token it was read with. `cached`: it came from the cache, so it must be
    proven current (`token` equal to the row's in the data statement's snapshot, `is_current`)
    before its answer is given."""

    context: DefinitionContext
    token: str
    cached: bool
    size: int = 0  # ROW_SIZE of the row read


class DefinitionCache:
    """Per app and process: (product schema, org, name) → CachedDefinition, at most
    DEFINITION_CACHE_MAX of them and DEFINITION_CACHE_MAX_CHARS of their rows (`size`). Never trusted
    on its own: a reader proves an entry current against the database in the same snapshot as its
    answer (app.entities.query), so a change by another process (worker, app instance) is seen by the
    next request; a stale entry is dropped and read again."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[str, str, str], CachedDefinition] = OrderedDict()
        self.size = 0  # the entries' sizes
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                self.entries.move_to_end(key)
            return entry

    def put(self, key, entry: CachedDefinition) -> None:
        with self.lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self.size -= old.size
            if entry.size > DEFINITION_CACHE_MAX_CHARS:
                return  # alone over the budget: not kept (rather than emptying the cache for it)
            self.entries[key] = entry
            self.size += entry.size
            while len(self.entries) > DEFINITION_CACHE_MAX or self.size > DEFINITION_CACHE_MAX_CHARS:
                self.size -= self.entries.popitem(last=False)[1].size

    def drop(self, key, entry: CachedDefinition) -> None:
        with self.lock:
            if self.entries.get(key) is entry:
                del self.entries[key]
                self.size -= entry.size


def definition_cache() -> DefinitionCache:
    cache = current_app.extensions.get("entity_definition_cache")
    if cache is None:
        cache = current_app.extensions.setdefault("entity_definition_cache", DefinitionCache())
    return cache


def _cache_key(name: str) -> tuple[str, str, str]:
    return schema_for(db.context_product()), current_org(), name


def cached_definition(name: str) -> CachedDefinition | None:
    """The cache's entry for the org's definition `name`, unproven (None: not cached). Only read-only
    requests (db.reads_only: autocommit, every statement sees committed rows only) use the cache."""
    if not g.get("_db_reads_only"):
        return None
    entry = definition_cache().get(_cache_key(name))
    if entry is not None and entry.context.filters.limits != filter_limits():  # the app's limits changed
        return None
    return entry


def load_definition(name: str) -> CachedDefinition:
    """`find_definition(name)` for requests that only read: the org's active definition `name` read now
    (404 if none), one round trip through `db.read_first` (no ORM query, no BEGIN when the request has no
    transaction yet), as a transient EntityDefinition that is not in the session (callers must not
    change it or attach it to anything written), with its compiled context; kept in the cache when the
    request only reads (it was read outside any transaction: committed)."""
    row = _read_row(name)
    definition = EntityDefinition(**{key: row[column] for key, column in _ATTRIBUTES})
    entry = CachedDefinition(definition_context(definition), row["row_token"], False, row["row_size"] or 0)
    if g.get("_db_reads_only"):
        definition_cache().put(_cache_key(name), dataclasses.replace(entry, cached=True))
    return entry


def forget_definition(name: str, entry: CachedDefinition) -> None:
    """Drop `entry` (found stale) from the cache."""
    definition_cache().drop(_cache_key(name), entry)


def is_current(entry: CachedDefinition) -> bool:
    """Whether the definition row is still the version `entry` was read from (one round trip)."""
    row = db.read_first(_TOKEN_OF, {"definition_token_id": entry.context.definition.id})
    return row is not None and row["row_token"] == entry.token


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


def _apply_definition(session: Session, definition: EntityDefinition, data: dict, *, provenance: bool) -> None:
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
            owned_view(session, definition, data["defaultViewId"])
        except NotFound:
            raise ValidationFailed("defaultViewId does not name a view of this entity.",
                                   {"fields": {"defaultViewId": ["unknown view"]}}) from None
    if "defaultViewId" in data and definition.id is not None:  # keep the views' isDefault in step
        session.execute(update(EntityView).where(
            EntityView.org_id == definition.org_id, EntityView.entity_id == definition.id)
            .values(is_default=EntityView.id == data["defaultViewId"] if data["defaultViewId"] else False))


def create_definition(session: Session, tenant: Tenant, data: dict, *, provenance: bool = False) -> EntityDefinition:
    """A new definition of `tenant`'s org, added to `session` (flushed: the caller's unit of work commits
    it); the name is unique among the org's active ones (409)."""
    if not data.get("name"):
        raise ValidationFailed("Request validation failed.", {"fields": {"name": ["Missing data for required "
                                                                                 "field."]}})
    data = dict(data)
    data.setdefault("schema", {"type": "object", "properties": {}})
    data.pop("defaultViewId", None)  # no views exist yet
    definition = EntityDefinition(org_id=tenant.org_id, name=data["name"], display_name=data["name"],
                                  product=tenant.product, created_by=tenant.user_id, updated_by=tenant.user_id,
                                  is_active=True, version=1, created_at=utcnow())
    definition.updated_at = definition.created_at
    _apply_definition(session, definition, data, provenance=provenance)
    if definition.is_active is False:
        raise ValidationFailed("A definition is created active.", {"fields": {"isActive": ["must be true"]}})
    session.add(definition)
    flush_unique(session, f"An entity named '{definition.name}' already exists.")
    return definition


def update_definition(session: Session, tenant: Tenant, name: str, data: dict, *,
                      provenance: bool = False, if_match=None) -> EntityDefinition:
    """Apply a partial definition as `tenant`, in `session`; bumps `version`; a stale numeric `version` is 409,
    a stale If-Match 412 (compared with the locked row)."""
    definition = find_definition(name, include_inactive=True, lock=True, session=session, org_id=tenant.org_id)
    require_match(if_match, etag_of(definition), "definition")
    check_version(data.get("version"), definition.version, "definition")
    previous_embeddings, previous_schema = definition.embeddings_config, definition.schema
    _apply_definition(session, definition, data, provenance=provenance)
    definition.version += 1
    definition.updated_at = utcnow()
    definition.updated_by = tenant.user_id
    flush_unique(session, f"An entity named '{definition.name}' already exists.")
    changed = hooks.current().definition_changed
    if changed is not None:
        changed(session, tenant.product, definition, previous_embeddings)
    if definition.schema != previous_schema or "isActive" in data:
        follow_schema(definition)  # a projection of another schema stops answering queries now

        # per-field indexes follow the schema (built off the request path)
        indexes.schedule_sync(session, tenant.product, definition.id)
    # Records are not re-validated against a changed schema: they are checked when next written.
    return definition


def delete_definition(session: Session, tenant: Tenant, name: str, *, delete_records: bool = False,
                      hard_delete: bool = False, if_match=None) -> None:
    """Soft delete (isActive false) by default; `deleteRecords` deletes (or soft-deletes) the records
    too; `hardDelete` removes the definition row, and refuses (409) while records would be orphaned.
    A stale If-Match is 412."""
    definition = find_definition(name, include_inactive=hard_delete, lock=True, session=session, org_id=tenant.org_id)
    require_match(if_match, etag_of(definition), "definition")
    records = select(EntityRecord.id).where(EntityRecord.org_id == definition.org_id,
                                            EntityRecord.entity_id == definition.id)
    if hard_delete:
        if not delete_records and session.scalar(select(func.count()).select_from(records.subquery())):
            raise Conflict(f"Entity '{name}' still has records; pass deleteRecords=true to delete them too.")
        delete_relationships_of(records, session)
        session.execute(delete(EntityRecord).where(EntityRecord.org_id == definition.org_id,
                                                   EntityRecord.entity_id == definition.id))
        session.delete(definition)
    else:
        if delete_records:
            deactivate_relationships_of(records, session)
            session.execute(update(EntityRecord).where(
                EntityRecord.org_id == definition.org_id, EntityRecord.entity_id == definition.id,
                EntityRecord.is_active.is_(True)).values(is_active=False, updated_at=utcnow()))
        definition.is_active = False
        definition.projection = None
        definition.version += 1
        definition.updated_at = utcnow()
    indexes.schedule_sync(session, tenant.product, definition.id)  # drops the per-field indexes
    session.flush()


def upsert_definitions(session: Session, tenant: Tenant, items: list[dict]) -> dict[str, Any]:
    """Admin: create or update each definition by name, each in a savepoint of the caller's unit of work;
    one readable error per rejected one."""
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
            with session.begin_nested():
                exists = session.scalar(tenant_select(EntityDefinition, tenant.org_id).where(
                    EntityDefinition.name == data["name"], EntityDefinition.is_active.is_(True)))
                if exists:
                    update_definition(session, tenant, data["name"], data, provenance=True)
                    updated += 1
                else:
                    create_definition(session, tenant, data, provenance=True)
                    created += 1
        except ValidationError as exc:
            errors.append(f"{label}: {flatten_messages(exc.messages)}")
        except ApiError as exc:
            errors.append(f"{label}: {exc.message}" + (f" {flatten_messages(exc.details['fields'])}"
                                                       if exc.details and "fields" in exc.details else ""))
    return {"created": created, "updated": updated, "errors": errors}
