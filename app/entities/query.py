"""Record query and count: a plan chosen once, then one small executor per strategy.

1. `_reading`: the definition, its compiled schema and filter context (app.entities.services.context),
   from the per-process cache (services.definitions.DefinitionCache); a cached one is proven current
   by the request's count statement, which selects the definition row's token beside the count (same
   snapshot), else the answer is discarded and the definition read again (the stale-cache retry; a
   projection table dropped meanwhile is retried on entity_records alone);
2. `compile_request_filters`: parse the filters, resolve `$similar` through the app's similarity hook
   (embedding the query text is the only I/O; app.entities.similar), then compile (pure,
   app.entities.filters). When the definition has a ready typed projection (app.entities.projection)
   that covers the filter and the sort, the same compiler targets its columns instead (a
   `ProjectionResolver`);
3. `_plan`: every choice of the request, made once (`QueryPlan`): the compiled filter, the order, the
   keyset a cursor follows and the cursor's position, the page window, the fields to return, the
   lookups, and the strategy: the exact count and its page in one statement (`_counted_page`, over
   entity_records or the projection), or the count first (`_count`; a `$similar` counts by its own
   means, app.entities.similar) and then the page from one executor: `_projected_page` (the page's ids
   from the projection, then the records by id), `_plain_page` (sort order, OFFSET or keyset), or
   `similar.page` (exact distance, HNSW index walk, rank fusion);
4. `_answer`: shaping (field projection, `distance`), lookups, totals, the next cursor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import psycopg
from flask import current_app
from sqlalchemy import JSON, Integer, Text, bindparam, cast, func, literal_column, select, true
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from app.db import DriverRow, UnboundValues, db, json_compact, json_loads
from app.entities import cursor as cursors
from app.entities import hooks, projection, similar
from app.entities.counting import COUNT_MODES, counted, record_scope
from app.entities.filters import CompiledFilter, FieldResolver, FilterError, compile_request
from app.entities.models import EntityDefinition, EntityRecord
from app.entities.services import definitions
from app.entities.services.context import DefinitionContext
from app.entities.services.records import RECORD_COLUMNS, record_to_wire
from app.errors import ValidationFailed
from app.jsonbody import PreEncoded
from app.wire import iso

__all__ = ["COUNT_MODES", "compile_request_filters", "count_records", "query_records", "record_scope"]

T = EntityRecord.__table__
COUNT_WITH_PAGE = True  # a page and its exact count in one statement (False: two; for A/B benches)
SCAN_ONCE = True  # relevance order: count and page from one scan of the matches (False: two; A/B benches)
REUSE_SHAPES = True  # exact counts and pages reuse compiled filter shapes (False: compile each; A/B benches)
RECORD_JSON = True  # the page's records built by PostgreSQL (`_record_json`; False: from columns; A/B benches)
# ... and, when no shaping applies (no include/exclude, lookups or distance), read as text and answered as
# one app.jsonbody.PreEncoded array (app.db.json_compact: one orjson pass in C, not a dict per record
# decoded, checked and encoded again; False: decoded)
PRE_ENCODED = True
_LIMIT, _OFFSET = bindparam("page_limit", type_=Integer), bindparam("page_offset", type_=Integer)


# --- compiling the request's filter ------------------------------------------------------------------

def compile_request_filters(raw: Any, dctx: DefinitionContext, *, sort_by: str | None = None,
                            projected: bool = False, reuse: bool = False) -> CompiledFilter:
    """The request's filter compiled (filters.compile_request): against the definition's ready typed
    projection when `projected` and it answers the filter (and `sort_by`) exactly, else entity_records;
    `$similar` resolved through the app's similarity hook (embedding the query text: the only I/O).
    `reuse`: through the context's cache of compiled filter shapes (`dctx.shapes`): the result may carry
    its values apart (`CompiledFilter.values`), which every statement built from it must bind
    (db.execute_shaped `values`); for the exact count and the page, not for an estimate."""
    resolver = projection.resolver_for(dctx.definition, dctx.filters.catalog) if projected else None
    return compile_request(raw, dctx.filters, projection=resolver, sort_by=sort_by,
                           resolve_similar=lambda spec: similar.resolve(spec, dctx.filters,
                                                                        hooks.current().similarity),
                           shapes=dctx.shapes if reuse and REUSE_SHAPES else None)


# --- counting, and proving a cached definition current -----------------------------------------------

def _count(entry: definitions.CachedDefinition, compiled: CompiledFilter, mode: str) -> tuple[int, str]:
    """The count of a query, and how it was counted. For a cached definition (`entry.cached`) the
    count also proves the definition current: its row token from the count's own snapshot (or, on
    the paths that cannot select it, one round trip more); `_StaleDefinition` when it is not."""
    definition = entry.context.definition
    token_of = definition.id if entry.cached else None
    token = None
    by_clause = None
    if compiled.similarity is not None and not compiled.projected:  # a $similar's counter, or the projection
        by_clause = similar.count(db.session, compiled.count_total, compiled.count_projected, mode)
    if by_clause is not None:
        total, how = by_clause
    elif compiled.projected:  # the projection holds exactly the definition's active records
        table, where = (compiled.resolver.count_source(compiled.where) if mode == "exact"
                        else (compiled.table, compiled.where))
        total, how, token = counted([where], mode, table=table, token_of=token_of,
                                    token=definitions.TOKEN_OF, values=compiled.values)
    else:
        scope = record_scope(definition)
        total, how, token = counted([*scope, compiled.where], mode, [*scope, compiled.where_to_count],
                                    token_of=token_of, token=definitions.TOKEN_OF, values=compiled.values)
    _check_current(entry, token)
    return total, how


def _check_current(entry: definitions.CachedDefinition, token: str | None) -> None:
    """`_StaleDefinition` unless a cached `entry` is the definition row's current version: `token` is
    the row's token selected by the data statement (None: not selected, or the row is gone; then one
    round trip asks)."""
    if entry.cached and (token != entry.token if token is not None else not definitions.is_current(entry)):
        raise _StaleDefinition


class _StaleDefinition(Exception):  # noqa: N818 (a signal: the caller reads the definition again)
    """A cached definition was changed (or deleted) since it was read: the answer is discarded."""


def _projection_gone(exc: DBAPIError) -> bool:
    """The statement named a projection table that a rebuild dropped after this request read its
    definition (the definition is read in its own statement, before the query's)."""
    return isinstance(exc.orig, psycopg.errors.UndefinedTable) and (
        projection.PREFIX in str(exc.orig) or projection.SIDE_PREFIX in str(exc.orig))


def _without_vanished_projection(run):
    """`run(projected=True)`; if the definition's projection vanished meanwhile (a rebuild finished
    between reading the definition and querying), the same question again on entity_records alone."""
    try:
        return run(True)
    except DBAPIError as exc:
        if not _projection_gone(exc):
            raise
        db.session.rollback()  # a read-only request: nothing of it is lost
        return run(False)


def _reading(name: str, run):
    """`run(entry, projected)` with the org's active definition `name` (404 if none).

    A cached definition (definitions.DefinitionCache) saves the definition's round trip and its
    compilation; the count every run makes proves it current (`_count`). When it is stale, or when
    the run fails in any way (a 400 for a field only the new schema has, a dropped projection table,
    …) and the definition is no longer the cached one, that answer is discarded and the question is
    asked again with the definition read now, as without a cache."""
    entry = definitions.cached_definition(name)
    if entry is not None:
        try:
            return _without_vanished_projection(lambda projected: run(entry, projected))
        except _StaleDefinition:
            pass
        except Exception as exc:
            if isinstance(exc, DBAPIError):
                db.session.rollback()
            if definitions.is_current(entry):
                raise
        definitions.forget_definition(name, entry)
    entry = definitions.load_definition(name)
    return _without_vanished_projection(lambda projected: run(entry, projected))


def count_records(name: str, filters: Any, count_mode: str = "exact") -> tuple[int, str]:
    """How many active records of the org's definition `name` match `filters`, and how that number
    was counted."""
    def run(reuse: bool):
        return _reading(name, lambda entry, projected: _count(
            entry, compile_request_filters(filters, entry.context, projected=projected, reuse=reuse), count_mode))
    return _unless_unbound(run, count_mode)


def query_records(name: str, params: dict[str, Any], count_mode: str = "exact") -> dict[str, Any]:
    """One page of records of the org's definition `name` matching the filters, as a PaginatedResult
    (`countMode` says how `totalCount` was counted: exact unless the caller preferred otherwise)."""
    return _unless_unbound(lambda reuse: _reading(
        name, lambda entry, projected: _execute(_plan(entry, params, count_mode, projected, reuse))), count_mode)


def _unless_unbound(run, count_mode: str):
    """`run(reuse)`: with reused filter shapes for an exact count; if one of its statements cannot bind
    them (db.UnboundValues: a statement that runs through SQLAlchemy), asked again compiled afresh (a
    read-only request: nothing of the first try is kept)."""
    if count_mode != "exact" or not REUSE_SHAPES:
        return run(False)
    try:
        return run(True)
    except UnboundValues:
        db.session.rollback()
        return run(False)


# --- the plan --------------------------------------------------------------------------------------

@dataclass
class QueryPlan:
    """Every choice one page query makes, made once (`_plan`); the executors only read it."""

    entry: definitions.CachedDefinition
    compiled: CompiledFilter
    count_mode: str
    page: int
    page_size: int
    order: list              # [(expression, descending, nulls last)]
    keyset: tuple | None     # (sort key, descending) a cursor can follow; None for relevance orders
    position: Any            # the decoded cursor (cursors.Position), or None
    digest: str              # the query's digest (cursors bind to it)
    include: set[str] | None
    exclude: set[str] | None
    lookups: list[dict]
    where: list              # the scope and the filter, over `compiled.table`
    by_similarity: bool      # the page is ordered by `$similar` (no sortBy)

    @property
    def definition(self) -> EntityDefinition:
        return self.entry.context.definition

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.page_size

    @property
    def skip(self) -> int:
        """OFFSET of the page statement: none after a cursor (its keyset condition starts the page)."""
        return 0 if self.position is not None else self.offset

    @property
    def page_where(self) -> list:
        """`where`, and after a cursor the keyset condition (no OFFSET to walk, stable under writes)."""
        if self.position is None:
            return self.where
        return [*self.where, cursors.after(self.keyset[0], self.compiled.table.c.id, self.keyset[1], self.position)]

    @property
    def counted_with_page(self) -> bool:
        """The exact count and the page in one statement (one round trip, one snapshot), unless a
        `$similar` orders or counts (its own statements) or the count is an estimate (the page is
        fetched whatever it says)."""
        return self.count_mode == "exact" and self.compiled.similarity is None and COUNT_WITH_PAGE

    @property
    def scan_once(self) -> bool:
        """The count and the page read one materialized scan of the matches (`_counted_page(once=True)`):
        for a page in relevance order (`$search` without sortBy) on the projection. Such a page ranks
        every match anyway (a top-N sort over all of them), so its own scan would find and recheck the
        matches the count already found. Orders an index walks (sortBy, newest first) keep two scans:
        the page stops after its rows, and materializing every match would cost more (for a substring
        match on the default order, measured: 1.76 against 1.63 ms of PostgreSQL CPU)."""
        return SCAN_ONCE and self.compiled.projected and self.keyset is None and self.position is None


def _plan(entry: definitions.CachedDefinition, params: dict[str, Any], count_mode: str,
          projected: bool, reuse: bool = False) -> QueryPlan:
    """The request's plan; every 400 of a page query is raised here, in the order the parameters are read."""
    dctx = entry.context
    page_size = _page_size(params.get("pageSize", 20))
    sort_by, sort_order = params.get("sortBy"), params.get("sortOrder")
    compiled = compile_request_filters(params.get("filters") or {}, dctx, sort_by=sort_by, projected=projected,
                                       reuse=reuse and count_mode == "exact")
    resolver = compiled.resolver  # entity_records, or the projection: where, order and cursor key alike
    order = _order_spec(resolver, compiled, sort_by, sort_order)
    keyset = _keyset(resolver, compiled, sort_by, sort_order)
    digest = cursors.query_digest(params)
    position = _position(dctx.definition, params, keyset, digest)
    include = _projection(dctx.filters.catalog, params.get("include"), "include")
    exclude = _projection(dctx.filters.catalog, params.get("exclude"), "exclude")
    lookups = _lookup_specs(dctx.schema.catalog, params.get("includeLookups") or [])
    where = [compiled.where] if compiled.projected else [*record_scope(dctx.definition), compiled.where]
    page = position.page if position is not None else params.get("page") or 1
    return QueryPlan(entry, compiled, count_mode, page, page_size, order, keyset, position, digest, include,
                     exclude, lookups, where, compiled.similarity is not None and not sort_by)


def _page_size(page_size: int) -> int:
    max_page_size = current_app.config["ENTITY_MAX_PAGE_SIZE"]
    if page_size > max_page_size:
        raise ValidationFailed(f"pageSize is at most {max_page_size}.",
                               {"fields": {"query.pageSize": [f"must be between 1 and {max_page_size}"]}})
    return page_size


# --- the executors ---------------------------------------------------------------------------------

def _execute(plan: QueryPlan) -> dict[str, Any]:
    if plan.counted_with_page:
        total, how, rows = _run_counted_page(plan)
    else:
        total, how = _count(plan.entry, plan.compiled, plan.count_mode)
        # an estimate may be low: the page is fetched whatever it says
        wanted = plan.position is not None or plan.offset < total or how != "exact"
        rows = _run_page(plan, total) if wanted else []
    return _answer(plan, total, how, rows)


def _run_counted_page(plan: QueryPlan) -> tuple[int, str, list]:
    compiled = plan.compiled
    count_table = None
    if compiled.projected and not plan.scan_once:  # a substring table, when it answers the count alone
        count_table, where = compiled.resolver.count_source(compiled.where)
        count_where = [where]
    else:
        count_where = plan.where if compiled.projected else [*record_scope(plan.definition), compiled.where_to_count]
    total, token, rows = _counted_page(compiled.table, count_where, plan.page_where, plan.order, plan.keyset,
                                       plan.skip, plan.page_size, plan.definition.id if plan.entry.cached else None,
                                       once=plan.scan_once, values=compiled.values, count_table=count_table)
    _check_current(plan.entry, token)
    return total, "exact", rows


def _run_page(plan: QueryPlan, total: int) -> list:
    """The page alone (after `_count`), from the executor of its strategy."""
    compiled = plan.compiled
    if compiled.projected:
        return _projected_page(compiled.table, plan.page_where, plan.order, plan.keyset, plan.skip, plan.page_size,
                               compiled.values)
    columns = [T.c[name] for name in RECORD_COLUMNS]
    if compiled.distance is not None:
        columns.append(compiled.distance.label("distance"))
    if plan.keyset is not None:
        columns.append(_cursor_key(plan.keyset[0]).label("cursor_key"))
    if plan.by_similarity and plan.position is None:
        return similar.page(db.session, columns, plan.where, compiled.similarity, compiled.rank, total,
                            plan.offset, plan.page_size)
    return _plain_page(columns, plan.page_where, _ordered(plan.order), plan.skip, plan.page_size, compiled.values)


def _plain_page(columns: list, where: list, order_by: list, offset: int, limit: int, values=None) -> list:
    """A page of entity_records in `order_by` (one statement per shape: db.execute_shaped; `values`:
    a reused filter shape's, CompiledFilter.values)."""
    return list(db.execute_shaped(
        db.session, ("page",),
        lambda: select(*columns).where(*where).order_by(*order_by).limit(_LIMIT).offset(_OFFSET),
        [*columns, *where, *order_by], {"page_limit": limit, "page_offset": offset}, values))


# --- the answer ------------------------------------------------------------------------------------

def _answer(plan: QueryPlan, total: int, how: str, rows: list) -> dict[str, Any]:
    record_of = _getter(rows, "record")
    shaped = plan.include is not None or bool(plan.exclude) or plan.compiled.distance is not None or bool(plan.lookups)
    texts = None if shaped else [record_of(row) for row in rows]
    if texts and all(text.__class__ is str for text in texts):
        records = PreEncoded(json_compact(texts))  # the page's records as one JSON array, sent as it is
    else:
        records = [_wire(row, record_of) for row in rows]
    if shaped:
        raw_fields = [record["fields"] for record in records]  # before include/exclude: lookups read them all
        records = [_shape(record, row, plan.include, plan.exclude, plan.compiled)
                   for record, row in zip(records, rows, strict=True)]
        if plan.lookups:
            _resolve_lookups(plan.definition, records, raw_fields, plan.lookups)
    page, page_size = plan.page, plan.page_size
    if how != "exact":  # an estimate never contradicts the page in hand
        total = max(total, plan.offset + len(rows) + (1 if len(rows) == page_size else 0))
    total_pages = math.ceil(total / page_size) if total else 0
    return {"records": records, "totalCount": total, "currentPage": page, "pageSize": page_size,
            "totalPages": total_pages, "hasNextPage": page < total_pages, "hasPreviousPage": page > 1,
            "nextCursor": _next_cursor(plan, rows, total_pages), "countMode": how}


def _next_cursor(plan: QueryPlan, rows: list, total_pages: int) -> str | None:
    if plan.keyset is None or not rows or len(rows) != plan.page_size or plan.page >= total_pages:
        return None
    last = rows[-1]._mapping
    key = last["cursor_key"]
    if key is not None and isinstance(plan.keyset[0].type, JSON):
        key = cursors.JsonText(key)
    return cursors.encode(plan.definition.org_id, plan.definition.id, plan.digest,
                          cursors.Position(plan.page + 1, key, last["id"]))


def _keyset(resolver: FieldResolver, compiled: CompiledFilter, sort_by: str | None, sort_order: int | None):
    """(sort key, descending) of an order a cursor can follow, or None for relevance orders."""
    if sort_by:
        return resolver.sort_key(resolver.resolve(sort_by, "query.sortBy")), sort_order == -1
    if compiled.distance is not None or compiled.rank is not None:
        return None
    return resolver.t.c.created_at, sort_order != 1


def _cursor_key(expr: ColumnElement) -> ColumnElement:
    """The keyset's sort key as selected for the next cursor: a JSONB key as its JSON text (a JSON
    null is a value of the order, unlike the SQL NULL of a missing field; cursors.JsonText)."""
    return cast(expr, Text) if isinstance(expr.type, JSON) else expr


def _position(definition: EntityDefinition, params: dict[str, Any], keyset, digest: str):
    text = params.get("cursor")
    if text is None:
        return None
    if params.get("page") is not None:
        raise ValidationFailed("Send either page or cursor, not both.",
                               {"fields": {"query.cursor": ["cannot be combined with page"]}})
    if keyset is None:
        raise ValidationFailed("A cursor cannot follow relevance-ordered results ($similar, or $search without "
                               "sortBy); use page.", {"fields": {"query.cursor": ["not available for this order"]}})
    return cursors.decode(text, definition.org_id, definition.id, digest)


def _projected_page(P, where: list, order: list, keyset, offset: int, limit: int,  # noqa: N803
                    values: dict | None = None) -> list:
    """A page on a definition's projection: the page's ids and sort keys from the projection alone
    (filter, order, LIMIT/OFFSET on its indexes), then those records from entity_records by primary
    key, in the same order."""
    def build():
        keys = [expr.label(f"k{i}") for i, (expr, _, _) in enumerate(order)]
        extra = [_cursor_key(keyset[0]).label("cursor_key")] if keyset is not None else []
        page = (select(P.c.id.label("pid"), *keys, *extra).where(*where).order_by(*_ordered(order))
                .limit(_LIMIT).offset(_OFFSET).subquery("page"))
        columns = _record_columns(T.c) + ([page.c.cursor_key] if keyset is not None else [])
        return (select(*columns).join_from(T, page, T.c.id == page.c.pid)
                .order_by(*_ordered([(page.c[f"k{i}"], d, n) for i, (_, d, n) in enumerate(order)])))

    # the statement's form: the projection, the order's directions, a cursor key or not (the rest is
    # in the sources' structure)
    shape = ("projected page", P.schema, P.name, tuple((d, n) for _, d, n in order), keyset is not None,
             RECORD_JSON, PRE_ENCODED)
    sources = [*where, *(expr for expr, _, _ in order), *([keyset[0]] if keyset is not None else [])]
    return db.execute_shaped(db.session, shape, build, sources, {"page_limit": limit, "page_offset": offset},
                             values).all()


def _counted_page(P, count_where: list, where: list, order: list, keyset, offset: int,  # noqa: N803
                  limit: int, token_of: str | None, once: bool = False,
                  values: dict | None = None, count_table=None) -> tuple[int, str | None, list]:
    """`counted` and the page (`fetch_page`'s plain order, or `_projected_page` when `P` is the
    definition's projection) in one statement: one round trip, one snapshot. The exact count of
    `count_where` over `P`, the row token of definition `token_of` (None: not asked) and the page's
    records: the count's one row outer-joined with the page (an empty page still yields the count),
    in the page's order. Returns (total, token, rows). `count_table`: the table `count_where` is over
    when it is not `P` (a projection's substring table: `ProjectionResolver.count_source`).

    `once` (`where` is `count_where`, over the projection; `QueryPlan.scan_once`): the matches are found
    once, as a MATERIALIZED CTE of their ids and sort keys, and both the count and the page read it
    (a relevance order: the page would otherwise find, recheck and rank every match a second time)."""
    projected = P is not T

    def build():
        keys = [expr.label(f"k{i}") for i, (expr, _, _) in enumerate(order)]
        extra = [_cursor_key(keyset[0]).label("cursor_key")] if keyset is not None else []
        token = [definitions.TOKEN_OF.label("row_token")] if token_of is not None else []
        picked = [P.c.id.label("pid")] if projected else [T.c[name] for name in RECORD_COLUMNS]
        if once:
            matched = select(*picked, *keys, *extra).where(*where).cte("matched").prefix_with("MATERIALIZED")
            counts = select(func.count().label("total"), *token).select_from(matched).subquery("counted")
            page = (select(matched).order_by(*_ordered([(matched.c[f"k{i}"], d, n)
                                                        for i, (_, d, n) in enumerate(order)]))
                    .limit(_LIMIT).offset(_OFFSET).subquery("page"))
        else:
            counts = (select(func.count().label("total"), *token).select_from(P if count_table is None else count_table)
                      .where(*count_where).subquery("counted"))
            # the records as the wire has them, built by PostgreSQL (`_record_json`)
            page = (select(*picked, *keys, *extra).where(*where).order_by(*_ordered(order))
                    .limit(_LIMIT).offset(_OFFSET).subquery("page"))
        joined = counts.outerjoin(page, true())
        if projected and RECORD_JSON:  # each page row's record by primary key, a subquery per row: the
            # planner plans it on its own (a join of entity_records to the page is planned with every
            # order and method of joining it: ~0.1 ms more per statement, for the same 20 index probes)
            record = select(_record_json(T.c)).where(T.c.id == page.c.pid).scalar_subquery()
            columns = [record.label("record"), page.c.pid.label("id")]
        elif projected:  # the page's records by primary key
            columns = _record_columns(T.c)
            joined = joined.outerjoin(T, T.c.id == page.c.pid)
        else:
            columns = _record_columns(page.c)
        columns += [page.c.cursor_key] if keyset is not None else []
        return (select(counts.c.total, *([counts.c.row_token] if token_of is not None else []), *columns)
                .select_from(joined)
                .order_by(*_ordered([(page.c[f"k{i}"], d, n) for i, (_, d, n) in enumerate(order)])))

    shape = ("counted page", P.schema, P.name, tuple((d, n) for _, d, n in order), keyset is not None,
             token_of is not None, RECORD_JSON, PRE_ENCODED, once, None if count_table is None else count_table.name)
    sources = [*where, *(expr for expr, _, _ in order), *([keyset[0]] if keyset is not None else [])]
    if not once:
        sources = [*count_where, *sources]
    named = {"page_limit": limit, "page_offset": offset}
    if token_of is not None:
        named["definition_token_id"] = token_of
    rows = db.execute_shaped(db.session, shape, build, sources, named, values).all()
    first = rows[0]._mapping
    # no page row: the count's row alone (id NULL); a record subquery finds its row in the same snapshot
    # (the projection holds exactly the active records), else the row is left out as the join would
    by_subquery = projected and RECORD_JSON
    id_of = _getter(rows, "id")
    record_of = _getter(rows, "record") if by_subquery else None
    return (int(first["total"] or 0), first["row_token"] if token_of is not None else None,
            [row for row in rows if id_of(row) is not None and not (by_subquery and record_of(row) is None)])


def _getter(rows: list, name: str):
    """`row._mapping.get(name)` for the rows of one result, by position when they are the driver's rows
    (db.DriverRow: one row class per statement, its columns' positions known; no mapping per call)."""
    if rows and isinstance(rows[0], DriverRow):
        index = rows[0]._index.get(name)
        return (lambda row: None) if index is None else itemgetter(index)
    return lambda row: row._mapping.get(name)


# `createdAt`/`updatedAt` as app.wire.iso writes them: UTC, milliseconds (truncated), Z
_ISO_MS = literal_column("""'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'""")
_UTC = literal_column("'UTC'")


def _record_columns(c) -> list:
    """The columns a page statement selects for its records from `c` (a table's or subquery's columns)."""
    if RECORD_JSON:
        return [_record_json(c), c["id"]]
    return [c[name] for name in RECORD_COLUMNS]


def _record_json(c) -> ColumnElement:
    """A record as `record_to_wire` shapes it, built by PostgreSQL as one JSON object (`record`) from the
    RECORD_COLUMNS of `c` (a table's or subquery's columns): one value per row instead of twelve typed
    columns, and no Python shapes it (PRE_ENCODED: read as its text, sent as it is unless shaped). Same
    keys, same values: `fields` and `metadata` are the stored JSON as they are, `tags` [] when NULL, the
    stamps in the wire's one format (the keys and the format are SQL constants, not binds: the
    statement's shape stays cacheable)."""
    def stamp(column):
        return func.to_char(func.timezone(_UTC, column), _ISO_MS)

    pairs = (("id", c["id"]), ("entityId", c["entity_id"]), ("name", c["name"]), ("fields", c["fields"]),
             ("tags", func.coalesce(c["tags"], literal_column("'{}'::text[]"))), ("metadata", c["metadata"]),
             ("createdAt", stamp(c["created_at"])), ("updatedAt", stamp(c["updated_at"])),
             ("createdBy", c["created_by"]), ("updatedBy", c["updated_by"]), ("isActive", c["is_active"]),
             ("version", c["version"]))
    record = func.json_build_object(*(part for key, value in pairs for part in (literal_column(f"'{key}'"), value)))
    return (cast(record, Text) if PRE_ENCODED else record).label("record")


def _ordered(order: list) -> list:
    """ORDER BY clauses of an order spec [(expression, descending, nulls last)]."""
    clauses = []
    for expr, descending, nulls_last in order:
        clause = expr.desc() if descending else expr.asc()
        clauses.append(clause.nulls_last() if nulls_last else clause)
    return clauses


def _order_spec(resolver: FieldResolver, compiled: CompiledFilter, sort_by: str | None, sort_order: int | None):
    """Explicit sortBy (typed, NULLs last) > similarity distance > search rank > newest first; id breaks
    ties. As [(expression, descending, nulls last)]."""
    descending = sort_order == -1
    t = resolver.t  # entity_records or the projection
    if sort_by:
        try:
            ref = resolver.resolve(sort_by, "query.sortBy")
        except FilterError:
            raise ValidationFailed(f"Cannot sort by unknown field '{sort_by}'.",
                                   {"fields": {"query.sortBy": [f"unknown field '{sort_by}'"]}}) from None
        return [(resolver.sort_key(ref), descending, True), (t.c.id, descending, False)]
    if compiled.distance is not None:
        return [(compiled.distance, False, False), (t.c.id, False, False)]
    if compiled.rank is not None:
        return [(compiled.rank, True, False), (t.c.id, False, False)]
    if sort_order == 1:
        return [(t.c.created_at, False, False), (t.c.id, False, False)]
    return [(t.c.created_at, True, False), (t.c.id, True, False)]


def _projection(catalog, names: list[str] | None, key: str) -> set[str] | None:
    if names is None:
        return None
    unknown = [n for n in names if catalog.get(n) is None]
    if unknown:
        raise ValidationFailed(f"Unknown field(s) in {key}.",
                               {"fields": {f"query.{key}": [f"unknown field(s): {', '.join(unknown)}"]}})
    return set(names)


def _wire(row, record_of) -> dict:
    """The record of a page's row as a dict, for a page that shapes its records (include/exclude, lookups,
    a distance): built by PostgreSQL (`_record_json`; `record_of`: its getter, `_getter`), decoded from
    its text when PRE_ENCODED, or from its columns. An unshaped page sends its records' texts as one
    array (`_answer`)."""
    record = record_of(row)
    if record is None:
        return record_to_wire(row)
    if record.__class__ is str:
        return json_loads(record.encode())
    return record


def _shape(record: dict, row, include: set[str] | None, exclude: set[str] | None, compiled: CompiledFilter) -> dict:
    if include is not None or exclude:
        record["fields"] = {k: v for k, v in record["fields"].items()
                            if (include is None or k in include) and not (exclude and k in exclude)}
    if compiled.distance is not None:
        record["distance"] = float(row._mapping["distance"])
    return record


def _lookup_specs(catalog, items: list[dict]) -> list[dict]:
    if not items:
        return []
    lookups = catalog.lookup_fields()
    specs = []
    for i, item in enumerate(items):
        spec = lookups.get(item["field"])
        if spec is None:
            raise ValidationFailed("includeLookups names a field that is not a lookup.",
                                   {"fields": {f"query.includeLookups[{i}].field":
                                               [f"'{item['field']}' is not a lookup or multilookup field"]}})
        specs.append({"field": spec.name, "many": spec.field_type == "multilookup", "entity": spec.entity,
                      "fields": set(item["fields"]) if item.get("fields") is not None else None})
    return specs


def _resolve_lookups(definition: EntityDefinition, records: list[dict], raw_fields: list[dict],
                     specs: list[dict]) -> None:
    """Add `lookups[field]` = the referenced record(s) (active, same org) or null; `fields` stay ids."""
    wanted: set[str] = set()
    for fields in raw_fields:
        for spec in specs:
            wanted.update(i for i in _lookup_ids(fields, spec) if isinstance(i, str))
    found = _lookup_targets(definition, wanted) if wanted else {}
    for record, fields in zip(records, raw_fields, strict=True):
        resolved = record.setdefault("lookups", {})
        for spec in specs:
            targets = [_project(found[i][0], spec["fields"]) for i in _lookup_ids(fields, spec)
                       if isinstance(i, str) and i in found and (not spec["entity"] or found[i][1] == spec["entity"])]
            resolved[spec["field"]] = targets if spec["many"] else (targets[0] if targets else None)


def _lookup_ids(fields: Any, spec: dict) -> list:
    """The values a record's lookup field holds (ids, and whatever else a schema change left there)."""
    value = fields.get(spec["field"]) if isinstance(fields, dict) else None
    return value if isinstance(value, list) else ([value] if value is not None else [])


def _lookup_targets(definition: EntityDefinition, wanted: set[str]) -> dict[str, tuple[dict, str]]:
    """id → (the record as a lookup shows it, its definition's name), of the active ones of the org."""
    stmt = (select(T.c.id, T.c.entity_id, T.c.name, T.c.fields, T.c.created_at, T.c.updated_at,
                   EntityDefinition.name.label("entity_name"))
            .join(EntityDefinition, EntityDefinition.id == T.c.entity_id)
            .where(T.c.org_id == definition.org_id, T.c.is_active.is_(True), T.c.id.in_(sorted(wanted))))
    return {row.id: ({"id": row.id, "entityId": row.entity_id, "entityName": row.entity_name, "name": row.name,
                      "fields": row.fields, "createdAt": iso(row.created_at), "updatedAt": iso(row.updated_at)},
                     row.entity_name)
            for row in db.session.execute(stmt)}


def _project(target: dict, names: set[str] | None) -> dict:
    if names is None:
        return target
    return dict(target, fields={k: v for k, v in target["fields"].items() if k in names})
