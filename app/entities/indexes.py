"""Per-definition indexes on `entity_records`: what a hand-indexed typed table would have.

The generic indexes (migration e0002) answer the org/entity scope, JSONB containment (equality) and the
stored tsvector. Ranges, sorting and substring matches on a field compile to expressions over
`fields` (app.entities.filters.FieldResolver) that no generic index can answer, so every definition
with at least ENTITY_INDEX_MIN_RECORDS active records gets, for each scalar field of its schema:

- a b-tree on the field's sort expression (numbers, dates, datetimes: the *typed* expression that
  ranges also compile to; short text fields: `fields ->> name`, the sort key) — exactly the expression
  the compiler emits, rendered by the same FieldResolver, so PostgreSQL matches the query to the index;
- a pg_trgm GIN on `fields ->> name` for short text fields other than dropdowns (`$contains`,
  `$startsWith`, `$endsWith`, which compile to ILIKE).

Each index is partial (`WHERE entity_id = '<definition id>'`): it holds only that definition's rows
and costs nothing to other definitions' reads. Indexes are built with CREATE INDEX CONCURRENTLY by a
Celery task (`bulk.entity_indexes`, queue `bulk`) sent when a definition's schema or isActive changes,
when it is deleted and after a bulk create (or by `flask entities sync-indexes`), never on the request
path; once all planned indexes exist the task returns after two catalog lookups; indexes of fields that left the schema
are dropped (a definition keeps its indexes once built, even if it shrinks).
Names: `erx_<12 hex of the definition id>_<10 hex of the expression>`.

The definition also gets its own copies of the generic GINs (`fields jsonb_path_ops`, `search_vector`),
so equality and `$search` need not intersect the global GIN with the org index.

Long text (`text`, `stringMultiline`) gets no trigram index (large, slow to maintain); booleans,
lists and JSON fields are served by the generic GIN (containment).

Once the definition's typed projection (app.entities.projection, built by the same task) is ready,
its indexes here are all dropped: every query they served reads the projection (real columns,
index-only counts), and keeping both would make every write maintain two sets of per-definition
indexes. Queries that fall back (lists, JSON, `$exists`…) use the generic indexes, as do all queries
while a schema change rebuilds the projection.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from app.db import db, schema_for
from app.entities import projection
from app.entities.fieldtypes import (
    KIND_DATE,
    KIND_DATETIME,
    KIND_NUMBER,
    KIND_TEXT,
    FieldCatalog,
    compile_definition_schema,
)
from app.entities.filters import FieldResolver
from app.entities.models import EntityDefinition, EntityRecord
from app.entities.projection import _literal, _sql, definition_key  # one rendering for both
from app.tasks import enqueue_after_commit

log = logging.getLogger(__name__)
PREFIX = "erx_"
SYNC_TASK = "bulk.entity_indexes"  # app.entities.tasks.sync_definition_indexes, sent by name
LONG_TEXT = ("text", "stringMultiline")


@dataclass(frozen=True)
class PlannedIndex:
    name: str
    field: str
    method: str      # btree | gin
    definition: str  # what goes between ON <table> and WHERE

    def ddl(self, table: str, definition_id: str, *, concurrently: bool) -> str:
        return (f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {self.name} ON {table} "
                f"USING {self.method} {self.definition} WHERE entity_id = {_literal(definition_id)}")


def plan_indexes(definition_id: str, catalog: FieldCatalog, *, projected: bool = False) -> list[PlannedIndex]:
    """The indexes the definition should have (pure: no session). `projected`: the definition has a
    ready typed projection (app.entities.projection), which answers every query these per-field
    indexes and the tsvector copy served: none stay (the queries that fall back — lists, JSON,
    `$exists`… — use the generic indexes, as a small definition's do), so a write maintains one set
    of per-definition indexes, the projection's, not two."""
    resolver = FieldResolver(catalog)
    key = definition_key(definition_id)
    planned: list[PlannedIndex] = []
    # The generic GINs hold every org's rows: a query of one definition ANDs them with the org index
    # (100 000 entries for a 100 000-record definition). Its own copies skip that step.
    if projected:
        return planned
    for method, definition in (("gin", "(fields jsonb_path_ops)"), ("gin", "(search_vector)")):
        digest = hashlib.sha256(f"{method}{definition}".encode()).hexdigest()[:10]
        planned.append(PlannedIndex(f"{PREFIX}{key}_{digest}", "", method, definition))
    for name, spec in sorted(catalog.fields.items()):
        ref = resolver.resolve(name)  # how queries resolve the name (a system column has its own indexes)
        if ref.system:
            continue
        wanted: list[tuple[str, str]] = []
        if spec.kind in (KIND_NUMBER, KIND_DATE, KIND_DATETIME) or (
                spec.kind == KIND_TEXT and spec.field_type not in LONG_TEXT):
            # dates newest first: the common listing order (sorting always puts NULLs last)
            order = " DESC NULLS LAST" if spec.kind in (KIND_DATE, KIND_DATETIME) else ""
            wanted.append(("btree", f"(({_sql(resolver.sort_key(ref))}){order})"))  # = typed for ranges
        if spec.kind == KIND_TEXT and spec.field_type not in (*LONG_TEXT, "dropdown"):
            wanted.append(("gin", f"(({_sql(resolver.text(ref))}) public.gin_trgm_ops)"))
        for method, definition in wanted:
            digest = hashlib.sha256(f"{method}{definition}".encode()).hexdigest()[:10]
            planned.append(PlannedIndex(f"{PREFIX}{key}_{digest}", name, method, definition))
    return planned


def existing_indexes(conn: Connection, schema: str, definition_id: str) -> set[str]:
    pattern = f"{PREFIX}{definition_key(definition_id)}\\_%"
    return set(conn.scalars(text("SELECT indexname FROM pg_indexes WHERE schemaname = :schema "
                                 "AND tablename = 'entity_records' AND indexname LIKE :pattern"),
                            {"schema": schema, "pattern": pattern}))


def sync_indexes(conn: Connection, schema: str, definition_id: str, catalog: FieldCatalog | None, *,
                 active_records: int, min_records: int, concurrently: bool = True,
                 projected: bool = False) -> dict[str, list[str]]:
    """Create the missing planned indexes and drop this definition's stale ones.

    `conn` must be in autocommit mode (CREATE INDEX CONCURRENTLY cannot run in a transaction).
    A definition below `min_records` (or gone: `catalog` None) keeps no index. An index left invalid
    by an interrupted concurrent build is dropped and rebuilt.
    """
    table = f'"{schema}".entity_records'
    wanted = [] if catalog is None or active_records < min_records else plan_indexes(definition_id, catalog,
                                                                                      projected=projected)
    have = existing_indexes(conn, schema, definition_id)
    invalid = invalid_indexes(conn, schema, have)
    created, dropped = [], []
    keep = {p.name for p in wanted}
    word = "CONCURRENTLY " if concurrently else ""
    for name in sorted((have - keep) | (have & invalid)):
        conn.execute(text(f'DROP INDEX {word}IF EXISTS "{schema}".{name}'))
        dropped.append(name)
        have.discard(name)
    for planned in wanted:
        if planned.name in have:
            continue
        conn.execute(text(planned.ddl(table, definition_id, concurrently=concurrently)))
        created.append(planned.name)
    if created:
        conn.execute(text(f"ANALYZE {table}"))  # expression statistics: the planner's estimates use them
        log.info("entity indexes of %s in %s: created %s, dropped %s", definition_id, schema, created, dropped)
    return {"created": created, "dropped": dropped}


def schedule_sync(session, product: str, definition_id: str) -> None:
    """Send the index task for this definition once `session` commits (the caller's transaction). Sent by
    name: app.entities.tasks imports this module."""
    enqueue_after_commit(session, SYNC_TASK, product, definition_id)


def sync_definition(product: str, definition_id: str, *, concurrently: bool | None = None) -> dict[str, list[str]]:
    """Bring one definition's indexes in line with its schema and size (the Celery task's body).

    `concurrently` defaults to True except for in-process (eager) tasks, which run inside the request
    that sent them: a concurrent build would wait for that request's own snapshot."""
    celery = current_app.extensions.get("celery")
    eager = bool(celery and celery.conf.task_always_eager)
    schema = schema_for(product)
    sized = _sized(product, schema, definition_id)
    if sized is None:
        return {"created": [], "dropped": []}  # the usual case after a bulk create: nothing to count
    catalog, count = sized
    engine = db.engine_for(product)
    min_records = current_app.config["ENTITY_INDEX_MIN_RECORDS"]
    # The typed projection first (same rule: a definition past the threshold), then the indexes on
    # entity_records: the per-field ones only while the definition has no ready projection.
    plan = projection.plan_projection(definition_id, catalog) if catalog is not None and count >= min_records \
        else None
    concurrently = not eager if concurrently is None else concurrently
    built = projection.sync_projection(engine, schema, definition_id, plan, concurrently=concurrently)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("SET lock_timeout = '10s'"))
        result = sync_indexes(conn, schema, definition_id, catalog, active_records=count, min_records=min_records,
                              concurrently=concurrently, projected=built["ready"])
    result["created"] += built["created"]
    result["dropped"] += built["dropped"]
    return result


def _sized(product: str, schema: str, definition_id: str) -> tuple[FieldCatalog | None, int] | None:
    """The definition's catalog (None: gone or inactive) and the number of active records its indexes are
    sized for; None when its projection and indexes are already those of its schema (nothing to do)."""
    with db.product_session(product) as session:
        definition = session.get(EntityDefinition, definition_id)
        catalog, count = None, 0
        have = existing_indexes(session.connection(), schema, definition_id)
        if definition is not None and definition.is_active:
            catalog = compile_definition_schema(definition.schema or {}).catalog
            plan = projection.plan_for(definition, catalog)
            ready = definition.projection == plan.name
            if ready and have == {p.name for p in plan_indexes(definition_id, catalog, projected=True)} \
                    and not invalid_indexes(session.connection(), schema, have) \
                    and not projection.needs_upkeep(session.connection(), schema, plan):
                session.rollback()
                return None
            count = int(session.scalar(select(func.count()).select_from(EntityRecord).where(
                EntityRecord.org_id == definition.org_id, EntityRecord.entity_id == definition.id,
                EntityRecord.is_active.is_(True))) or 0)
            built = have or definition.projection or projection.existing(session.connection(), schema, definition_id)
            if built and count < current_app.config["ENTITY_INDEX_MIN_RECORDS"]:
                count = current_app.config["ENTITY_INDEX_MIN_RECORDS"]  # indexed once: keep (and follow the schema)
        session.rollback()
    return catalog, count


def invalid_indexes(conn: Connection, schema: str, names: set[str]) -> set[str]:
    """Those of `names` left INVALID (an interrupted CREATE INDEX CONCURRENTLY)."""
    return set(conn.scalars(text(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = :schema AND c.relname = ANY(:names) AND NOT i.indisvalid"),
        {"schema": schema, "names": sorted(names)}))
