"""Record query and count, one way through (the model for reading a domain's records):

1. `_reading`: the definition, its compiled schema and filter context (app.entities.services.context),
   from the per-process cache (services.definitions.DefinitionCache); a cached one is proven current
   by the request's count statement, which selects the definition row's token beside the count (same
   snapshot), else the answer is discarded and the definition read again;
2. `compile_request_filters`: parse the filters, resolve `$similar` through the app's similarity hook
   (embedding the query text is the only I/O), then compile (pure, app.entities.filters);
   When the definition has a ready typed projection (app.entities.projection) that covers the filter
   and the sort, the same compiler targets its columns instead (a `ProjectionResolver`): the count
   reads the projection alone and `_projected_page` takes the page's ids from it, then the records by id;
3. an exact count and its page (no `$similar`) are one statement (`_counted_page`: the count's row
   outer-joined with the page); otherwise `_count`, then `fetch_page`, the executor of the other pages
   (an estimated count's, exact distance, ANN index walk, rank fusion);
4. shaping: projection, `distance`, lookups.
"""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from typing import Any

import psycopg
from flask import current_app
from sqlalchemy import JSON, Integer, Text, bindparam, cast, func, literal, select, text, true
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.expression import Executable

from app.db import db
from app.entities import cursor as cursors
from app.entities import hooks, projection
from app.entities.filters import (
    CompiledFilter,
    FieldResolver,
    FilterError,
    NotProjected,
    SimilarityClause,
    SimilarSpec,
    compile_filters,
    parse_filters,
    project_terms,
)
from app.entities.models import EntityDefinition, EntityRecord
from app.entities.services import definitions
from app.entities.services.context import DefinitionContext
from app.entities.services.records import RECORD_COLUMNS, record_to_wire
from app.errors import ValidationFailed
from app.wire import iso

T = EntityRecord.__table__


def record_scope(definition: EntityDefinition) -> list:
    """The conditions every record read of a definition starts with: org, entity, active."""
    return [T.c.org_id == definition.org_id, T.c.entity_id == definition.id, T.c.is_active.is_(True)]


def resolve_similarity(similar: SimilarSpec | None, dctx: DefinitionContext) -> SimilarityClause | None:
    """What `$similar` compiles to, from the app's hook (None: it matches nothing)."""
    if similar is None or not dctx.filters.embeddings_enabled:
        return None
    hook = hooks.current().similarity
    return hook(similar, dctx.filters) if hook is not None else None


def compile_request_filters(raw: Any, dctx: DefinitionContext, *, sort_by: str | None = None,
                            projected: bool = False) -> CompiledFilter:
    """Parse, resolve `$similar` (before compiling), compile. `projected`: against the definition's
    ready typed projection when it answers the filter (and `sort_by`) exactly, else entity_records."""
    parsed = parse_filters(raw, dctx.filters)
    resolver = projection.resolver_for(dctx.definition, dctx.filters.catalog) if projected else None
    terms = None
    if resolver is not None and parsed.similar is None:
        terms = project_terms(parsed, resolver)  # each top-level term compiled once against the projection
        try:
            if sort_by:
                resolver.sort_key(resolver.resolve(sort_by))
            return compile_filters(parsed, dctx.filters, None, resolver, terms=terms)
        except (NotProjected, FilterError):  # not projected, or an unknown sortBy (400 below)
            pass
    # entity_records; the terms the projection can answer still narrow the rows through its indexes
    out = compile_filters(parsed, dctx.filters, resolve_similarity(parsed.similar, dctx),
                          narrow=resolver if parsed.similar is None else None, terms=terms)  # $similar: its own path
    if resolver is not None and out.similarity is not None and out.count_total is None:
        out.count_projected = _projected_similar_count(parsed, dctx, resolver, out.similarity)
    return out


def _projected_similar_count(parsed, dctx: DefinitionContext, resolver, similarity) -> Any:
    """`$similar` (without maxDistance) + a filter the projection answers: the exact count of the
    projection's rows matching the filter whose projected stamp is the current vector (the projection
    holds exactly the active records; `embedded_current` = v0003's stamp when it is of the record's
    version), index-only through the shared enum b-tree. None when the projection cannot answer."""
    current_hash = getattr(similarity, "current_hash", None)
    if current_hash is None:
        return None
    try:
        rest = compile_filters(dataclasses.replace(parsed, similar=None), dctx.filters, None, resolver)
    except (NotProjected, FilterError):
        return None
    t = resolver.t
    return select(func.count()).select_from(t).where(rest.where, t.c[projection.CURRENT_VECTOR] == current_hash)


COUNT_MODES = ("exact", "planned", "estimated")
COUNT_WITH_PAGE = True  # a page and its exact count in one statement (False: two; for A/B benches)


class _ExplainJson(Executable, ClauseElement):
    """`EXPLAIN (FORMAT JSON) <select>`, with the select's parameters bound as usual."""

    inherit_cache = False

    def __init__(self, stmt):
        self.stmt = stmt


@compiles(_ExplainJson, "postgresql")
def _compile_explain(element, compiler, **kw):
    return "EXPLAIN (FORMAT JSON) " + compiler.process(element.stmt, **kw)


def planned_count(where: list, table=T) -> int:
    """The planner's estimate of the matching rows (PostgREST's `count=planned`): no scan at all."""
    plan = db.session.scalar(_ExplainJson(select(literal(1)).select_from(table).where(*where)))
    if isinstance(plan, str):
        plan = json.loads(plan)
    return max(0, int(round(plan[0]["Plan"]["Plan Rows"])))


def counted(where: list, mode: str = "exact", count_where: list | None = None, table=T,
            token_of: str | None = None) -> tuple[int, str, str | None]:
    """(count, how it was counted, a row token). `estimated` counts exactly while the estimate is at most
    ENTITY_COUNT_ESTIMATE_ABOVE, and reports the estimate beyond (PostgREST's `count=estimated`).
    `count_where` (a `$similar`: CompiledFilter.where_to_count) is the same set, cheaper to count
    exactly; the planner estimates `where` (it cannot estimate the stamp's `embedded_version = version`).
    `token_of`: a definition id whose current row token (definitions.TOKEN_OF) the exact count selects
    beside the count, from the same snapshot (the token is None when not asked or when no exact count ran)."""
    if mode in ("planned", "estimated"):
        estimate = planned_count(where, table)
        if mode == "planned" or estimate > current_app.config["ENTITY_COUNT_ESTIMATE_ABOVE"]:
            return estimate, "planned" if mode == "planned" else "estimated", None
    terms = count_where or where
    if token_of is None:
        result = db.execute_shaped(db.session, ("count", table.schema, table.name),
                                   lambda: select(func.count()).select_from(table).where(*terms), terms)
        return int(result.scalar() or 0), "exact", None
    result = db.execute_shaped(db.session, ("count+token", table.schema, table.name),
                               lambda: select(func.count(), definitions.TOKEN_OF).select_from(table).where(*terms),
                               terms, {"definition_token_id": token_of})
    count, token = result.first()
    return int(count or 0), "exact", token


def _count(entry: definitions.CachedDefinition, compiled: Any, mode: str) -> tuple[int, str]:
    """The count of a query, and how it was counted. For a cached definition (`entry.cached`) the
    count also proves the definition current: its row token from the count's own snapshot (or, on
    the paths that cannot select it, one round trip more); `_StaleDefinition` when it is not."""
    definition = entry.context.definition
    token_of = definition.id if entry.cached else None
    token = None
    if compiled.projected:  # the projection holds exactly the definition's active records
        total, how, token = counted([compiled.where], mode, table=compiled.table, token_of=token_of)
    elif mode == "exact" and compiled.count_total is not None:  # a lone $similar: its counter
        total, how = int(db.session.scalar(compiled.count_total) or 0), "exact"
    elif mode == "exact" and compiled.count_projected is not None:  # $similar + a projected filter
        total, how = int(db.session.scalar(compiled.count_projected) or 0), "exact"
    elif compiled.count_projected is not None:  # ... estimated: on the projection too
        # (entity_records' estimate of the joined condition is blind to the correlation of org_id and
        # entity_id: 231 for 10 000 matching measured, which sent the page to an exact scan)
        stmt = compiled.count_projected
        total, how, _ = counted([stmt.whereclause], mode, table=stmt.get_final_froms()[0])
    else:
        scope = record_scope(definition)
        total, how, token = counted([*scope, compiled.where], mode, [*scope, compiled.where_to_count],
                                    token_of=token_of)
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
    return isinstance(exc.orig, psycopg.errors.UndefinedTable) and projection.PREFIX in str(exc.orig)


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
    return _reading(name, lambda entry, projected: _count(
        entry, compile_request_filters(filters, entry.context, projected=projected), count_mode))


def query_records(name: str, params: dict[str, Any], count_mode: str = "exact") -> dict[str, Any]:
    """One page of records of the org's definition `name` matching the filters, as a PaginatedResult
    (`countMode` says how `totalCount` was counted: exact unless the caller preferred otherwise)."""
    return _reading(name, lambda entry, projected: _query_records(entry, params, count_mode, projected))


def _query_records(entry: definitions.CachedDefinition, params: dict[str, Any], count_mode: str,
                   projected: bool) -> dict[str, Any]:
    dctx = entry.context
    definition = dctx.definition
    schema, ctx = dctx.schema, dctx.filters
    page, page_size = params.get("page") or 1, params.get("pageSize", 20)
    max_page_size = current_app.config["ENTITY_MAX_PAGE_SIZE"]
    if page_size > max_page_size:
        raise ValidationFailed(f"pageSize is at most {max_page_size}.",
                               {"fields": {"query.pageSize": [f"must be between 1 and {max_page_size}"]}})
    compiled = compile_request_filters(params.get("filters") or {}, dctx, sort_by=params.get("sortBy"),
                                       projected=projected)
    resolver = compiled.resolver  # entity_records, or the projection: where, order and cursor key alike
    P = compiled.table  # noqa: N806
    order = _order_spec(resolver, compiled, params.get("sortBy"), params.get("sortOrder"))
    order_by = _ordered(order)
    keyset = _keyset(resolver, compiled, params.get("sortBy"), params.get("sortOrder"))
    digest = cursors.query_digest(params)
    position = _position(definition, params, keyset, digest)
    if position is not None:
        page = position.page
    include, exclude = _projection(ctx.catalog, params.get("include"), "include"), \
        _projection(ctx.catalog, params.get("exclude"), "exclude")
    lookups = _lookup_specs(schema.catalog, params.get("includeLookups") or [])

    where = [compiled.where] if compiled.projected else [*record_scope(definition), compiled.where]
    offset = (page - 1) * page_size
    # count and page in one statement (one round trip, one snapshot), unless a `$similar` orders or
    # counts (its own statements) or the count is an estimate (the page is fetched whatever it says)
    combined = count_mode == "exact" and compiled.similarity is None and COUNT_WITH_PAGE
    if combined:
        page_where = where if position is None else [*where, cursors.after(keyset[0], P.c.id, keyset[1], position)]
        count_where = where if compiled.projected else [*record_scope(definition), compiled.where_to_count]
        total, token, rows = _counted_page(P, count_where, page_where, order, keyset,
                                           0 if position is not None else offset, page_size,
                                           definition.id if entry.cached else None)
        how = "exact"
        _check_current(entry, token)
    else:
        total, how = _count(entry, compiled, count_mode)
        rows = []
    if not combined and (position is not None or offset < total or how != "exact"):  # an estimate may be low
        columns = [T.c[name] for name in RECORD_COLUMNS]
        if compiled.distance is not None:
            columns.append(compiled.distance.label("distance"))
        similarity = compiled.similarity if not params.get("sortBy") else None
        if keyset is not None:
            columns.append(_cursor_key(keyset[0]).label("cursor_key"))
        if compiled.projected:
            if position is not None:
                where = [*where, cursors.after(keyset[0], P.c.id, keyset[1], position)]
            rows = _projected_page(P, where, order, keyset, 0 if position is not None else offset, page_size)
        elif position is not None:  # keyset: no OFFSET to walk, stable under concurrent writes
            rows = fetch_page(db.session, columns, [*where, cursors.after(keyset[0], P.c.id, keyset[1], position)],
                              order_by, None, None, total, 0, page_size)
        else:
            rows = fetch_page(db.session, columns, where, order_by, similarity, compiled.rank, total, offset,
                              page_size)
    records = [_shape(row, include, exclude, compiled) for row in rows]
    if lookups:
        _resolve_lookups(definition, records, [row._mapping["fields"] for row in rows], lookups)
    if how != "exact":  # an estimate never contradicts the page in hand
        total = max(total, offset + len(records) + (1 if len(records) == page_size else 0))
    total_pages = math.ceil(total / page_size) if total else 0
    next_cursor = None
    if keyset is not None and rows and len(rows) == page_size and page < total_pages:
        last = rows[-1]._mapping
        key = last["cursor_key"]
        if key is not None and isinstance(keyset[0].type, JSON):
            key = cursors.JsonText(key)
        next_cursor = cursors.encode(definition.org_id, definition.id, digest,
                                     cursors.Position(page + 1, key, last["id"]))
    return {"records": records, "totalCount": total, "currentPage": page, "pageSize": page_size,
            "totalPages": total_pages, "hasNextPage": page < total_pages, "hasPreviousPage": page > 1,
            "nextCursor": next_cursor, "countMode": how}


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


_LIMIT, _OFFSET = bindparam("page_limit", type_=Integer), bindparam("page_offset", type_=Integer)
RRF_K = 60  # reciprocal rank fusion: the constant of Cormack et al. (2009); damps the very top ranks


def fetch_page(session: Session, columns: list, where: list, order_by: list, similarity: SimilarityClause | None,
               rank: ColumnElement | None, total: int, offset: int, limit: int) -> list:
    """The rows of one page. Without `similarity` (or with a sortBy) in `order_by`; with it, by distance:
    an exact scan, or the ANN index walk the clause plans (candidates re-sorted by exact distance); with
    a top-level `$search` as well, by reciprocal rank fusion of distance and text relevance."""
    if similarity is None:
        return list(db.execute_shaped(
            session, ("page",),
            lambda: select(*columns).where(*where).order_by(*order_by).limit(_LIMIT).offset(_OFFSET),
            [*columns, *where, *order_by], {"page_limit": limit, "page_offset": offset}))
    if rank is not None:
        return _fused_page(session, columns, where, similarity, rank, offset, limit)
    end = offset + limit
    settings = (similarity.index_scan_settings(session, total, end)
                if similarity.index_distance is not None else None)
    if settings is None:
        stmt = select(*columns).where(*where).order_by(similarity.distance, T.c.id).offset(offset).limit(limit)
        return list(session.execute(stmt))
    _walk_settings(session, settings)
    candidates = (select(*columns).where(*where).order_by(similarity.index_distance).limit(end)
                  .cte("similar_candidates").prefix_with("MATERIALIZED"))
    stmt = (select(*[candidates.c[c.name] for c in columns])
            .order_by(candidates.c.distance, candidates.c.id).offset(offset).limit(limit))
    # The walk was chosen from the exact number of matches (`total`); the planner only has its own
    # estimate of the filtered join, which can be far too low (org_id and entity_id are correlated,
    # the filter's selectivity is sampled): 231 estimated for 10 000 matching gave a filter-first plan
    # with a top-N sort over every match, 136 ms instead of a 3 ms walk (decisions.md, stop 20). With
    # sorting disabled for this one statement the candidates can only come in index order.
    session.execute(_SORT_OFF)
    try:
        rows = list(session.execute(stmt))
    except Exception:
        # in a transaction the error aborted it, and its rollback undoes the SET; in autocommit the
        # connection keeps it: set it back, or drop the connection rather than pool it so
        if session.connection().get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            try:
                session.execute(_SORT_RESET)
            except DBAPIError:
                session.connection().invalidate()
        raise
    session.execute(_SORT_RESET)
    return rows


# enable_sort off for the candidates statement of an index walk only (fetch_page), set back right after
# it (a plain SET: undone by a rollback inside a transaction, kept by the connection in autocommit)
_SORT_OFF, _SORT_RESET = text("SET enable_sort = off"), text("RESET enable_sort")

# DBAPI connection → the hnsw.* values it holds at session level (set by _walk_settings in autocommit)
_connection_settings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _walk_settings(session: Session, settings: dict[str, str]) -> None:
    """Give the index walk its settings, in one statement. Inside a transaction: SET LOCAL (gone at its
    end). In autocommit (a read-only request, db.reads_only): session-level SET, which no rollback
    can undo, remembered per connection so that the next `$similar` page on it with the same values
    (the usual case: page 1 of any query) sends nothing. Only this walk uses the HNSW index, and it
    always sets all three values first, so values left on a pooled connection affect no other query."""
    connection = session.connection()
    if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        session.execute(select(*[func.set_config(name, value, True) for name, value in settings.items()]))
        return
    dbapi = connection.connection.dbapi_connection
    wanted = tuple(sorted(settings.items()))
    if _connection_settings.get(dbapi) != wanted:
        session.execute(select(*[func.set_config(name, value, False) for name, value in settings.items()]))
        _connection_settings[dbapi] = wanted


def _fused_page(session: Session, columns: list, where: list, similarity: SimilarityClause, rank: ColumnElement,
                offset: int, limit: int) -> list:
    ranked = select(*columns,
                    func.row_number().over(order_by=(similarity.distance, T.c.id)).label("similar_rank"),
                    func.row_number().over(order_by=(rank.desc(), T.c.id)).label("search_rank"),
                    ).where(*where).cte("fused")
    score = 1.0 / (RRF_K + ranked.c.similar_rank) + 1.0 / (RRF_K + ranked.c.search_rank)
    stmt = (select(*[ranked.c[c.name] for c in columns])
            .order_by(score.desc(), ranked.c.distance, ranked.c.id).offset(offset).limit(limit))
    return list(session.execute(stmt))


def _projected_page(P, where: list, order: list, keyset, offset: int, limit: int) -> list:  # noqa: N803
    """A page on a definition's projection: the page's ids and sort keys from the projection alone
    (filter, order, LIMIT/OFFSET on its indexes), then those records from entity_records by primary
    key, in the same order."""
    def build():
        keys = [expr.label(f"k{i}") for i, (expr, _, _) in enumerate(order)]
        extra = [_cursor_key(keyset[0]).label("cursor_key")] if keyset is not None else []
        page = (select(P.c.id.label("pid"), *keys, *extra).where(*where).order_by(*_ordered(order))
                .limit(_LIMIT).offset(_OFFSET).subquery("page"))
        columns = [T.c[name] for name in RECORD_COLUMNS] + ([page.c.cursor_key] if keyset is not None else [])
        return (select(*columns).join_from(T, page, T.c.id == page.c.pid)
                .order_by(*_ordered([(page.c[f"k{i}"], d, n) for i, (_, d, n) in enumerate(order)])))

    # the statement's form: the projection, the order's directions, a cursor key or not (the rest is
    # in the sources' structure)
    shape = ("projected page", P.schema, P.name, tuple((d, n) for _, d, n in order), keyset is not None)
    sources = [*where, *(expr for expr, _, _ in order), *([keyset[0]] if keyset is not None else [])]
    return list(db.execute_shaped(db.session, shape, build, sources, {"page_limit": limit, "page_offset": offset}))


def _counted_page(P, count_where: list, where: list, order: list, keyset, offset: int,  # noqa: N803
                  limit: int, token_of: str | None) -> tuple[int, str | None, list]:
    """`counted` and the page (`fetch_page`'s plain order, or `_projected_page` when `P` is the
    definition's projection) in one statement: one round trip, one snapshot. The exact count of
    `count_where` over `P`, the row token of definition `token_of` (None: not asked) and the page's
    records: the count's one row outer-joined with the page (an empty page still yields the count),
    in the page's order. Returns (total, token, rows)."""
    projected = P is not T

    def build():
        keys = [expr.label(f"k{i}") for i, (expr, _, _) in enumerate(order)]
        extra = [_cursor_key(keyset[0]).label("cursor_key")] if keyset is not None else []
        counts = select(func.count().label("total"),
                        *([definitions.TOKEN_OF.label("row_token")] if token_of is not None else [])
                        ).select_from(P).where(*count_where).subquery("counted")
        picked = [P.c.id.label("pid")] if projected else [T.c[name] for name in RECORD_COLUMNS]
        page = (select(*picked, *keys, *extra).where(*where).order_by(*_ordered(order))
                .limit(_LIMIT).offset(_OFFSET).subquery("page"))
        joined = counts.outerjoin(page, true())
        if projected:  # the page's records by primary key
            columns = [T.c[name] for name in RECORD_COLUMNS]
            joined = joined.outerjoin(T, T.c.id == page.c.pid)
        else:
            columns = [page.c[name] for name in RECORD_COLUMNS]
        columns += [page.c.cursor_key] if keyset is not None else []
        return (select(counts.c.total, *([counts.c.row_token] if token_of is not None else []), *columns)
                .select_from(joined)
                .order_by(*_ordered([(page.c[f"k{i}"], d, n) for i, (_, d, n) in enumerate(order)])))

    shape = ("counted page", P.schema, P.name, tuple((d, n) for _, d, n in order), keyset is not None,
             token_of is not None)
    sources = [*count_where, *where, *(expr for expr, _, _ in order), *([keyset[0]] if keyset is not None else [])]
    named = {"page_limit": limit, "page_offset": offset}
    if token_of is not None:
        named["definition_token_id"] = token_of
    rows = list(db.execute_shaped(db.session, shape, build, sources, named))
    first = rows[0]._mapping
    return (int(first["total"] or 0), first["row_token"] if token_of is not None else None,
            [row for row in rows if row._mapping["id"] is not None])


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


def _shape(row, include: set[str] | None, exclude: set[str] | None, compiled: CompiledFilter) -> dict:
    record = record_to_wire(row)
    if include is not None or exclude:
        record["fields"] = {k: v for k, v in record["fields"].items()
                            if (include is None or k in include) and not (exclude and k in exclude)}
    if compiled.distance is not None:
        record["distance"] = float(row._mapping["distance"])
    return record


def _lookup_specs(catalog, items: list[dict]) -> list[dict]:
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
            value = fields.get(spec["field"]) if isinstance(fields, dict) else None
            wanted.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
    found: dict[str, tuple[dict, str]] = {}
    if wanted:
        stmt = (select(T.c.id, T.c.entity_id, T.c.name, T.c.fields, T.c.created_at, T.c.updated_at,
                       EntityDefinition.name.label("entity_name"))
                .join(EntityDefinition, EntityDefinition.id == T.c.entity_id)
                .where(T.c.org_id == definition.org_id, T.c.is_active.is_(True), T.c.id.in_(sorted(wanted))))
        for row in db.session.execute(stmt):
            found[row.id] = ({"id": row.id, "entityId": row.entity_id, "entityName": row.entity_name,
                              "name": row.name, "fields": row.fields, "createdAt": iso(row.created_at),
                              "updatedAt": iso(row.updated_at)}, row.entity_name)
    for record, fields in zip(records, raw_fields, strict=True):
        resolved = record.setdefault("lookups", {})
        for spec in specs:
            value = fields.get(spec["field"]) if isinstance(fields, dict) else None
            ids = value if isinstance(value, list) else ([value] if value is not None else [])
            targets = [_project(found[i][0], spec["fields"]) for i in ids
                       if isinstance(i, str) and i in found and (not spec["entity"] or found[i][1] == spec["entity"])]
            resolved[spec["field"]] = targets if spec["many"] else (targets[0] if targets else None)


def _project(target: dict, names: set[str] | None) -> dict:
    if names is None:
        return target
    return dict(target, fields={k: v for k, v in target["fields"].items() if k in names})
