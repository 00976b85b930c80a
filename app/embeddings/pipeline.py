"""The record embedding pipeline: which records need a vector, embedding them, storing the result.

Flow. A record write (single or bulk, sync or async) calls `on_records_written` (app.embeddings.hooks) inside its
transaction; for a definition with `embeddingsConfig.enabled` it queues `embeddings.records` tasks
(at most RECORDS_PER_TASK ids each) that run only if the write commits. A definition update that
enables embeddings or changes fields/model/dimensions queues `embeddings.backfill`, which walks the
definition's records in id order, RECORDS_PER_TASK at a time, re-queuing itself until none is left.

Staleness. A stored vector is *current* for a record when its `config_hash` is the definition's
present setup (model, requested dimensions, fields) and its `record_version` is the record's
`version`. Queries serve current vectors only (app.embeddings.search). The writer re-checks both
under locks right before it stores, so a vector computed from text that changed while
the model ran is dropped, never stored as current (the newer write has queued its own task).
A trigger on entity_embeddings mirrors (config_hash, record_version) onto the record (`embedded_hash`,
`embedded_version`, migration v0003), so "has a current vector" is answerable from entity_records alone.
`content_hash` (model, dimensions, text) lets a redelivered task or an edit that did not touch the
embedded text skip the model: the row is only re-stamped with the new record version.

Failures. Transient embedder errors (and database OperationalErrors) propagate, so the task
retries with backoff; vectors stored before the failure stay (progress is kept). A permanent error
on a batch is retried text by text, so one unembeddable record does not sink its neighbours; the
records that still fail keep no current vector and are simply absent from `$similar`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from flask import current_app
from sqlalchemy import and_, delete, exists, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.db import db
from app.embeddings import (
    Embedder,
    EmbedderError,
    EmbedderTransientError,
    build_embedding_text,
    embedding_content_hash,
    get_embedder,
)
from app.embeddings.models import EntityEmbedding
from app.entities.models import EntityDefinition, EntityRecord
from app.wire import utcnow

log = logging.getLogger(__name__)

RECORDS_PER_TASK = 256
T = EntityRecord.__table__
E = EntityEmbedding.__table__
D = EntityDefinition.__table__


# --- the definition's embedding setup ----------------------------------------------------------------

def is_enabled(config: dict | None) -> bool:
    return bool(config and config.get("enabled"))


def setup_of(config: dict | None) -> tuple:
    """What the vectors depend on, as configured: (model, dimensions, fields). `enabled` is not part."""
    config = config or {}
    return (config.get("model") or None, config.get("dimensions") or None, tuple(config.get("fields") or ()))


def config_fingerprint(config: dict | None) -> str:
    """Hash of the configured setup; a backfill run is tied to it and stops when the setup changes."""
    return hashlib.sha256(json.dumps(setup_of(config)).encode()).hexdigest()


@dataclass(frozen=True)
class EmbeddingTarget:
    """What a definition's vectors are made with right now, resolved against the server's backend."""

    embedder: Embedder
    model: str                 # the model that really produces the vectors
    dimensions: int | None     # requested dimensions (None: the model's native size)
    fields: tuple[str, ...]
    config_hash: str           # stored with each vector; a different value means stale

    def text_of(self, name: str | None, fields: dict | None) -> str:
        return build_embedding_text(name, fields, self.fields,
                                    max_chars=current_app.config["EMBEDDINGS_MAX_TEXT_CHARS"])

    def content_hash(self, text: str) -> str:
        return embedding_content_hash(self.model, self.dimensions, text)


def embedding_target(config: dict | None) -> EmbeddingTarget | None:
    """The target of an enabled config (None when disabled); EmbedderConfigError when it cannot run."""
    if not is_enabled(config):
        return None
    model, dimensions, fields = setup_of(config)
    embedder = get_embedder(model, dimensions)
    requested = getattr(embedder, "requested_dimensions", None)  # the local model has one fixed size
    digest = hashlib.sha256(json.dumps([embedder.model, requested, list(fields)]).encode()).hexdigest()
    return EmbeddingTarget(embedder, embedder.model, requested, fields, digest)


# --- embedding a set of records ---------------------------------------------------------------------

@dataclass
class Outcome:
    embedded: int = 0      # new vectors stored
    restamped: int = 0     # text unchanged: vector kept, record version updated
    skipped: int = 0       # changed or deleted meanwhile, inactive, or already current
    cleared: int = 0       # nothing to embed (empty text): vector removed
    failed: list[str] | None = None  # permanent embedder errors (record ids)

    def as_dict(self) -> dict[str, Any]:
        return {"embedded": self.embedded, "restamped": self.restamped, "skipped": self.skipped,
                "cleared": self.cleared, "failed": len(self.failed or [])}


@dataclass
class _Item:
    record_id: str
    version: int
    text: str
    content_hash: str


def embed_records(product: str, org_id: str, entity_id: str, record_ids: list[str]) -> Outcome:
    """Bring the vectors of these records up to date. Idempotent: current ones are left alone."""
    outcome = Outcome(failed=[])
    with db.product_session(product) as session:
        definition = _definition(session, org_id, entity_id)
        config = definition.embeddings_config if definition is not None else None
        target = embedding_target(config)
        if target is None:
            outcome.skipped = len(record_ids)
            return outcome
        rows = session.execute(
            select(T.c.id, T.c.name, T.c.fields, T.c.version, E.c.content_hash, E.c.config_hash,
                   E.c.record_version)
            .outerjoin(E, E.c.record_id == T.c.id)
            .where(T.c.org_id == org_id, T.c.entity_id == entity_id, T.c.is_active.is_(True),
                   T.c.id.in_(record_ids)).order_by(T.c.id)).all()
    outcome.skipped = len(set(record_ids)) - len(rows)
    to_embed, to_restamp, to_clear = [], [], []
    for row in rows:
        text = target.text_of(row.name, row.fields)
        if not text.strip():
            if row.content_hash is not None:
                to_clear.append(_Item(row.id, row.version, "", ""))
            else:
                outcome.skipped += 1
            continue
        item = _Item(row.id, row.version, text, target.content_hash(text))
        if row.content_hash == item.content_hash and row.config_hash == target.config_hash:
            if row.record_version == row.version:
                outcome.skipped += 1
            else:
                to_restamp.append(item)
        else:
            to_embed.append(item)
    if to_restamp or to_clear:
        with db.product_session(product) as session:
            outcome.restamped, outcome.cleared = _write(session, org_id, entity_id, config, target,
                                                        restamp=to_restamp, clear=to_clear)
    batch = target.embedder.max_batch_size
    for start in range(0, len(to_embed), batch):
        items = to_embed[start:start + batch]
        vectors = _embed(target.embedder, items, outcome.failed)
        done = [(item, vector) for item, vector in zip(items, vectors, strict=True) if vector is not None]
        if done:
            with db.product_session(product) as session:  # one commit per batch: progress survives a retry
                stored, _ = _write(session, org_id, entity_id, config, target, store=done)
            outcome.embedded += stored
            outcome.skipped += len(done) - stored
    return outcome


def _definition(session: Session, org_id: str, entity_id: str) -> EntityDefinition | None:
    definition = session.get(EntityDefinition, entity_id)
    if definition is None or definition.org_id != org_id or not definition.is_active:
        return None
    return definition


def _embed(embedder: Embedder, items: list[_Item], failed: list[str]) -> list[list[float] | None]:
    """Vectors for the items; transient errors propagate (retry), permanent ones fall back to one by one."""
    try:
        return list(embedder.embed([item.text for item in items]))
    except EmbedderTransientError:
        raise
    except EmbedderError as exc:
        if len(items) == 1:
            log.warning("embedding record %s failed permanently: %s", items[0].record_id, exc.message)
            failed.append(items[0].record_id)
            return [None]
    vectors: list[list[float] | None] = []
    for item in items:
        vectors.extend(_embed(embedder, [item], failed))
    return vectors


def _write(session: Session, org_id: str, entity_id: str, config: dict | None, target: EmbeddingTarget, *,
           store=(), restamp=(), clear=()) -> tuple[int, int]:
    """Store vectors / re-stamp / clear rows, but only for records still at the version that was read,
    while the definition still has the same config. The locks (FOR SHARE on the definition; FOR NO KEY
    UPDATE on the records, which the v0003 trigger stamps) make a concurrent record or definition update wait
    for this commit (after which its own task or backfill sees the new state)."""
    current = session.execute(select(D.c.embeddings_config, D.c.is_active)
                              .where(D.c.id == entity_id, D.c.org_id == org_id).with_for_update(read=True)).first()
    if current is None or not current.is_active or current.embeddings_config != config:
        return 0, 0
    ids = [item.record_id for item, _ in store] + [item.record_id for item in (*restamp, *clear)]
    versions = dict(session.execute(
        select(T.c.id, T.c.version).where(T.c.org_id == org_id, T.c.id.in_(ids), T.c.is_active.is_(True))
        .order_by(T.c.id).with_for_update(key_share=True)).all())
    now = utcnow()
    rows = [{"record_id": item.record_id, "org_id": org_id, "entity_id": entity_id, "model": target.model,
             "dimensions": len(vector), "config_hash": target.config_hash, "content_hash": item.content_hash,
             "record_version": item.version, "embedding": vector, "updated_at": now}
            for item, vector in store if versions.get(item.record_id) == item.version]
    if rows:
        stmt = insert(E).values(rows)
        session.execute(stmt.on_conflict_do_update(index_elements=[E.c.record_id], set_={
            name: stmt.excluded[name] for name in ("model", "dimensions", "config_hash", "content_hash",
                                                  "record_version", "embedding", "updated_at")}))
    restamped = 0
    for item in restamp:
        if versions.get(item.record_id) == item.version:
            restamped += session.execute(
                update(E).where(E.c.record_id == item.record_id, E.c.content_hash == item.content_hash,
                                E.c.config_hash == target.config_hash)
                .values(record_version=item.version, updated_at=now)).rowcount
    cleared = [item.record_id for item in clear if versions.get(item.record_id) == item.version]
    if cleared:
        session.execute(delete(E).where(E.c.record_id.in_(cleared)))
    return len(rows) + restamped, len(cleared)


# --- backfill ---------------------------------------------------------------------------------------

def backfill_step(product: str, org_id: str, entity_id: str, fingerprint: str,
                  after_id: str) -> tuple[Outcome, str | None, str]:
    """Embed the next RECORDS_PER_TASK records (by id, after `after_id`) that lack a current vector.

    Returns the outcome, the id to continue after (None when the walk is done or the definition's
    setup is no longer `fingerprint`: a newer backfill covers it) and the fingerprint walked; an
    empty `fingerprint` means the present setup (an operator's manual backfill)."""
    with db.product_session(product) as session:
        definition = _definition(session, org_id, entity_id)
        config = definition.embeddings_config if definition is not None else None
        fingerprint = fingerprint or config_fingerprint(config)
        if not is_enabled(config) or config_fingerprint(config) != fingerprint:
            return Outcome(), None, fingerprint
        target = embedding_target(config)
        current = exists().where(E.c.record_id == T.c.id, E.c.config_hash == target.config_hash,
                                 E.c.record_version == T.c.version)
        ids = list(session.scalars(
            select(T.c.id).where(and_(T.c.org_id == org_id, T.c.entity_id == entity_id, T.c.is_active.is_(True),
                                      T.c.id > after_id, ~current))
            .order_by(T.c.id).limit(RECORDS_PER_TASK)))
    if not ids:
        return Outcome(), None, fingerprint
    outcome = embed_records(product, org_id, entity_id, ids)
    return outcome, (ids[-1] if len(ids) == RECORDS_PER_TASK else None), fingerprint
