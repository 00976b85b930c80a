"""`$similar` (semantic search) in the entity store: what it compiles to, how it is counted, how its pages run.

- `SimilarSpec`: the parsed `$similar` (app.entities.filters parses it);
- `SimilarityClause`: what it compiles to, made by the app's similarity hook (app.entities.hooks;
  app.embeddings.search makes it from the vectors), every member declared: `where`, `distance`, and
  what the hook may know to count and to page faster (`count_where`, `count_total`, `current_hash`,
  `index_distance`, `index_scan_settings`);
- `joined`: the clause joined with the filter's other conditions (app.entities.filters.compile_filters);
- counting (`count`): the hook's per-definition counter for a lone `$similar`, the definition's typed
  projection for `$similar` + a filter it answers (`projected_count`), else the caller's generic count
  of `count_where`;
- paging (`page`): exact distance order, the HNSW index walk the clause plans, or reciprocal rank fusion
  with a top-level `$search`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement, True_
from sqlalchemy.sql.expression import Executable

from app.entities.counting import counted
from app.entities.models import EntityRecord

T = EntityRecord.__table__
RRF_K = 60  # reciprocal rank fusion: the constant of Cormack et al. (2009); damps the very top ranks
CURRENT_VECTOR = "embedded_current"  # the projection's column: embedded_hash when of the record's version


@dataclass(frozen=True)
class SimilarSpec:
    """`$similar`: semantic search; `field` is set when written as a field operator."""

    query: str
    max_distance: float | None = None
    field: str | None = None


@dataclass(eq=False)  # compared and hashed by identity, like the SQL expressions it holds
class SimilarityClause:
    """What `$similar` compiles to (made by the app's similarity hook, app.entities.hooks)."""

    where: ColumnElement                         # which records take part (a current embedding, maxDistance)
    distance: ColumnElement                      # selected as the record's `distance`
    count_where: ColumnElement | None = None     # the same set, cheaper to count (may omit the join)
    count_total: Executable | None = None        # counts every match of the definition when `$similar` is
                                                 # the only condition (None: count `count_where`)
    current_hash: str | None = None              # a match is exactly an active record whose projected
                                                 # `embedded_current` equals it (None: not countable there)
    index_distance: ColumnElement | None = None  # the distance expression an ANN index orders by, if any

    def index_scan_settings(self, session: Session, total: int, end: int) -> dict[str, str] | None:
        """Settings for fetching the first `end` of `total` matches through the index, or None when an
        exact scan is the better plan (`page` pages either way)."""
        return None


# `hook(spec, filter context)` → a `SimilarityClause`: called only when the definition has
# `embeddingsConfig.enabled` (the context is app.entities.filters.FilterContext)
SimilarityHook = Callable[[SimilarSpec, Any], SimilarityClause]


def resolve(spec: SimilarSpec | None, ctx: Any, hook: SimilarityHook | None) -> SimilarityClause | None:
    """What `$similar` compiles to, from the app's hook (None: it matches nothing). `ctx`: the
    definition's FilterContext."""
    if spec is None or not ctx.embeddings_enabled or hook is None:
        return None
    return hook(spec, ctx)


@dataclass(frozen=True)
class Joined:
    """A `$similar` clause joined with a filter's other conditions (`where`)."""

    where: ColumnElement
    count_where: ColumnElement | None
    count_total: Executable | None


def joined(where: ColumnElement, clause: SimilarityClause) -> Joined:
    """The filter `where` and the clause: what matches, what counts the same set more cheaply, and the
    hook's total when nothing else conditions the matches."""
    count_where = and_(where, clause.count_where) if clause.count_where is not None else None
    return Joined(and_(where, clause.where), count_where, clause.count_total if isinstance(where, True_) else None)


def projected_count(rest: ColumnElement, table, clause: SimilarityClause) -> Executable | None:
    """`$similar` (without maxDistance) + a filter the projection answers (`rest`, compiled against its
    `table`): the exact count of the projection's rows matching the filter whose projected stamp is the
    current vector (the projection holds exactly the active records; `embedded_current` = v0003's stamp
    when it is of the record's version), index-only through the shared enum b-tree. None when the
    clause cannot be counted there."""
    if clause.current_hash is None:
        return None
    return select(func.count()).select_from(table).where(rest, table.c[CURRENT_VECTOR] == clause.current_hash)


def count(session: Session, count_total: Executable | None, count_projected: Executable | None,
          mode: str) -> tuple[int, str] | None:
    """The count of a `$similar` query by the clause's own means (its counter of a lone `$similar`, or
    the projection), and how it was counted; None when it has none (the caller counts `count_where`)."""
    if mode == "exact" and count_total is not None:  # a lone $similar: its counter
        return int(session.scalar(count_total) or 0), "exact"
    if count_projected is None:
        return None
    if mode == "exact":  # $similar + a projected filter
        return int(session.scalar(count_projected) or 0), "exact"
    # estimated: on the projection too (entity_records' estimate of the joined condition is blind to
    # the correlation of org_id and entity_id: 231 for 10 000 matching measured, which sent the page
    # to an exact scan)
    total, how, _ = counted([count_projected.whereclause], mode, table=count_projected.get_final_froms()[0])
    return total, how


def page(session: Session, columns: list, where: list, clause: SimilarityClause, rank: ColumnElement | None,
         total: int, offset: int, limit: int) -> list:
    """The rows of one page by distance: an exact scan, or the ANN index walk the clause plans
    (candidates re-sorted by exact distance); with a top-level `$search` (`rank`) as well, by
    reciprocal rank fusion of distance and text relevance."""
    if rank is not None:
        return _fused_page(session, columns, where, clause, rank, offset, limit)
    end = offset + limit
    settings = clause.index_scan_settings(session, total, end) if clause.index_distance is not None else None
    if settings is None:
        stmt = select(*columns).where(*where).order_by(clause.distance, T.c.id).offset(offset).limit(limit)
        return list(session.execute(stmt))
    return _walked_page(session, columns, where, clause, settings, offset, limit)


def _walked_page(session: Session, columns: list, where: list, clause: SimilarityClause,
                 settings: dict[str, str], offset: int, limit: int) -> list:
    _walk_settings(session, settings)
    candidates = (select(*columns).where(*where).order_by(clause.index_distance).limit(offset + limit)
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


# enable_sort off for the candidates statement of an index walk only, set back right after it (a plain
# SET: undone by a rollback inside a transaction, kept by the connection in autocommit)
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


def _fused_page(session: Session, columns: list, where: list, clause: SimilarityClause, rank: ColumnElement,
                offset: int, limit: int) -> list:
    ranked = select(*columns,
                    func.row_number().over(order_by=(clause.distance, T.c.id)).label("similar_rank"),
                    func.row_number().over(order_by=(rank.desc(), T.c.id)).label("search_rank"),
                    ).where(*where).cte("fused")
    score = 1.0 / (RRF_K + ranked.c.similar_rank) + 1.0 / (RRF_K + ranked.c.search_rank)
    stmt = (select(*[ranked.c[c.name] for c in columns])
            .order_by(score.desc(), ranked.c.distance, ranked.c.id).offset(offset).limit(limit))
    return list(session.execute(stmt))
