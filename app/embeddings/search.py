"""`$similar`: the similarity hook of the entity store (app.entities.hooks, installed by create_app).

The query text is embedded with the definition's model (cached briefly per org + model + text);
records take part when they have a *current* vector (app.embeddings.pipeline) of that size, and,
with `maxDistance`, are at most that cosine distance away. `distance` is the exact cosine distance.

Fetching a page without a sortBy (app.entities.similar.page pages; `index_scan_settings` plans):
- few matching records (≤ EMBEDDINGS_EXACT_SEARCH_MAX_ROWS), a size without an HNSW index, or a
  filter so selective that the index would have to be walked too far: an exact scan (top-N sort);
- otherwise the HNSW index of that size, with pgvector's iterative scan (`relaxed_order`) so that
  rows removed by the other filters are replaced by further index entries until the page is full;
  ef_search is at least the page end. The candidates (the first offset+limit in index order) are
  materialised and re-sorted by exact distance, because relaxed order may be slightly out of order;
- with a top-level `$search` as well: reciprocal rank fusion, score = 1/(k + rank by distance) +
  1/(k + rank by text relevance), k = app.entities.similar.RRF_K, over the records that match every filter.
"""

from __future__ import annotations

import logging
import math
import time

from flask import current_app
from pgvector.sqlalchemy import HALFVEC, Vector
from sqlalchemy import Float, and_, case, cast, false, func, literal, literal_column, select
from sqlalchemy.orm import Session

from app.db import db
from app.embeddings import EmbedderConfigError, EmbedderError, EmbedderTransientError, get_query_cache
from app.embeddings.models import EMBEDDED_COUNTS, INDEXED_DIMENSIONS, EntityEmbedding
from app.embeddings.pipeline import embedding_target
from app.entities.filters import FilterContext
from app.entities.models import EntityRecord
from app.entities.similar import SimilarityClause, SimilarSpec
from app.errors import ServiceUnavailable
from app.ratelimit import check as check_rate_limit

log = logging.getLogger(__name__)
T = EntityRecord.__table__
E = EntityEmbedding.__table__
MAX_EF_SEARCH = 1000       # pgvector's limit
MAX_INDEX_WALK = 100_000   # beyond this many estimated index tuples an exact scan is cheaper
MAX_SCAN_TUPLES = 400_000  # cap of hnsw.max_scan_tuples (pgvector default: 20 000)
INDEXED_ROWS_TTL = 30.0    # seconds a process reuses the vector table's planner row estimate
_indexed_rows_seen: dict[tuple[str, str], tuple[float, float]] = {}  # (database, table) → (expiry, rows)


def no_matches() -> SimilarityClause:
    """`$similar` that cannot match (e.g. a field-level `$similar` on a field that is not embedded)."""
    return SimilarityClause(where=false(), distance=literal(None, Float), count_where=false())


class SemanticClause(SimilarityClause):
    """The compiled `$similar` of one query (see the module docstring)."""

    def __init__(self, vector: list[float], config_hash: str, org_id: str, entity_id: str,
                 max_distance: float | None):
        self.dimensions = dims = len(vector)
        query = cast(literal(_vector_text(vector)), Vector(dims))
        # Guarded by the size: `<=>` between vectors of different sizes is an error, not a mismatch.
        exact = E.c.embedding.op("<=>", return_type=Float)(query)
        distance = case((E.c.dimensions == literal_column(str(dims)), exact), else_=None)
        kind = INDEXED_DIMENSIONS.get(dims)
        # The exact expression of the partial index `(embedding::<kind>(N)) <kind>_cosine_ops WHERE dimensions = N`.
        vector_type = HALFVEC(dims) if kind == "halfvec" else Vector(dims)
        index_distance = (cast(E.c.embedding, vector_type).op("<=>", return_type=Float)(
            cast(query, vector_type)) if kind else None)
        conditions = [E.c.record_id == T.c.id, E.c.org_id == org_id, E.c.entity_id == entity_id,
                      E.c.dimensions == literal_column(str(dims)),  # a literal, so the partial index applies
                      E.c.config_hash == config_hash, E.c.record_version == T.c.version]
        if max_distance is not None:
            conditions.append(func.coalesce(distance <= max_distance, false()))
        where = and_(*conditions)
        # Counting: without maxDistance, "has a current vector of this size" is the record's own stamp
        # (a trigger keeps it, migration v0003: no join with the vectors; with another filter, that
        # filter's index and a check of the stamp on the rows it finds); with maxDistance every
        # candidate's distance is computed.
        count_where = where if max_distance is not None else and_(
            T.c.embedded_hash == config_hash, T.c.embedded_version == T.c.version)
        # ... and every such record of the definition, with no other condition, is the per-definition
        # counter of stamped records (migration v0004): a sum over a few delta rows, O(1) in the matches.
        C = EMBEDDED_COUNTS.c
        count_total = None if max_distance is not None else (
            select(func.coalesce(func.sum(C.n), 0))
            .where(C.entity_id == entity_id, C.embedded_hash == config_hash, C.org_id == org_id))
        # ... and with a filter the definition's typed projection answers: a count there, of the rows
        # whose projected stamp is current (app.entities.projection, CURRENT_VECTOR)
        super().__init__(where=where, distance=distance, count_where=count_where, count_total=count_total,
                         current_hash=None if max_distance is not None else config_hash,
                         index_distance=index_distance)

    def index_scan_settings(self, session: Session, total: int, end: int) -> dict[str, str] | None:
        """SET LOCAL settings for an HNSW walk to the first `end` of `total` matches, or None when an
        exact scan is the better plan."""
        if self.index_distance is None or total <= current_app.config["EMBEDDINGS_EXACT_SEARCH_MAX_ROWS"]:
            return None
        # The index holds every org's vectors of this size: estimate how far the walk must go to
        # meet `end` matching rows, from the share of index rows that match.
        indexed = max(_indexed_rows(session), float(total))
        estimate = math.ceil(end * indexed / max(total, 1))
        if estimate > MAX_INDEX_WALK:
            return None
        walk = int(min(MAX_SCAN_TUPLES, max(20_000, 4 * estimate)))
        ef_search = min(MAX_EF_SEARCH, max(current_app.config["EMBEDDINGS_HNSW_EF_SEARCH"], end))
        return {"hnsw.iterative_scan": "relaxed_order", "hnsw.ef_search": str(ef_search),
                "hnsw.max_scan_tuples": str(walk)}


def similarity_clause(spec: SimilarSpec, ctx: FilterContext) -> SimilarityClause:
    """The similarity hook: embed the query with the definition's model and compile the clause."""
    config = ctx.embeddings_config or {}
    if spec.field is not None and spec.field not in (config.get("fields") or []):
        return no_matches()  # a field-level $similar needs that field in the embedded text
    check_rate_limit("similar")  # embedding the query is the costly part
    try:
        target = embedding_target(config)
        if target is None:
            return no_matches()
        vector = get_query_cache().get_or_embed(ctx.org_id, spec.query, target.embedder)
    # The upstream's own message goes to the log only: it is about our configuration, not the caller's query.
    except EmbedderConfigError as exc:
        log.error("$similar: embedder not configured: %s", exc.message)
        raise ServiceUnavailable("Semantic search is not available: the embedding model is not configured.") \
            from None
    except EmbedderTransientError as exc:
        log.warning("$similar: embedder unavailable: %s", exc.message)
        raise ServiceUnavailable("Semantic search is temporarily unavailable (the embedding service did not "
                                 "answer); retry shortly.") from None
    except EmbedderError as exc:
        log.error("$similar: embedder refused the query: %s", exc.message)
        raise ServiceUnavailable("Semantic search is not available: the embedding service refused the query.") \
            from None
    return SemanticClause(vector, target.config_hash, ctx.org_id, ctx.definition_id, spec.max_distance)


def _indexed_rows(session: Session) -> float:
    """pg_class.reltuples of entity_embeddings (all orgs), reused for INDEXED_ROWS_TTL: it moves only with
    VACUUM/ANALYZE and only steers the plan (index walk or exact scan), so a request need not ask for it
    (one round trip less per `$similar` page)."""
    key = (session.get_bind().url.render_as_string(hide_password=True), db.qualified_name(session, E))
    now = time.monotonic()
    seen = _indexed_rows_seen.get(key)
    if seen is not None and seen[0] > now:
        return seen[1]
    rows = db.estimated_rows(session, E)
    _indexed_rows_seen[key] = (now + INDEXED_ROWS_TTL, rows)
    return rows


def _vector_text(vector: list[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"

