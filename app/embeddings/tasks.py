"""Celery tasks of the embedding pipeline (queue `embeddings`); the logic is in app.embeddings.pipeline.

Both tasks take ids and are idempotent (a redelivered task finds the vectors current and skips the
model). Transient trouble — the embedder's `EmbedderTransientError` or a database OperationalError —
is retried with the one retry policy of app.tasks up to EMBEDDINGS_TASK_MAX_RETRIES;
after that the task fails and lands in platform.failed_tasks.
"""

from __future__ import annotations

import logging

from flask import current_app
from sqlalchemy.exc import OperationalError

from app.embeddings import EmbedderError, EmbedderTransientError, pipeline
from app.extensions import celery_app
from app.tasks import retry_or_give_up

log = logging.getLogger(__name__)

class EmbeddingFailed(Exception):
    """Some records could not be embedded (permanent embedder errors); the others were stored."""


def _retry(task, exc: Exception) -> Exception:
    return retry_or_give_up(task, exc, current_app.config["EMBEDDINGS_TASK_MAX_RETRIES"])


@celery_app.task(name="embeddings.records", bind=True, acks_late=True, reject_on_worker_lost=True)
def embed_records(self, product: str, org_id: str, entity_id: str, record_ids: list[str]) -> dict:
    """Embed (or re-stamp) these records of one definition after they were created or updated."""
    try:
        outcome = pipeline.embed_records(product, org_id, entity_id, record_ids)
    except (EmbedderTransientError, OperationalError) as exc:
        raise _retry(self, exc) from None
    if outcome.failed:
        raise EmbeddingFailed(f"{len(outcome.failed)} record(s) of entity {entity_id} could not be embedded: "
                              f"{', '.join(outcome.failed[:20])}")
    return outcome.as_dict()


@celery_app.task(name="embeddings.backfill", bind=True, acks_late=True, reject_on_worker_lost=True)
def backfill(self, product: str, org_id: str, entity_id: str, fingerprint: str = "", after_id: str = "") -> dict:
    """Re-embed a definition's records after embeddings were enabled or their setup changed.

    One step per task (RECORDS_PER_TASK records, in id order); the next step is queued when this
    one has committed, so new-record tasks interleave with a long backfill instead of waiting. It is
    an outbox row (app.tasks.enqueue_after_commit), sent by the worker's maintenance loop if the broker
    is down; a worker lost before that commit leaves this message unacknowledged (acks_late), and its
    redelivery re-runs the step, which skips records whose vectors are current.
    An empty `fingerprint` walks the present setup (`celery -A workers call embeddings.backfill`)."""
    try:
        outcome, next_after, fingerprint = pipeline.backfill_step(product, org_id, entity_id, fingerprint, after_id)
    except (EmbedderTransientError, OperationalError) as exc:
        raise _retry(self, exc) from None
    except EmbedderError as exc:  # not configured / cannot run: nothing to gain by walking on
        log.error("backfill of entity %s stopped: %s", entity_id, exc)
        raise
    if outcome.failed:
        log.warning("backfill of entity %s: %d record(s) could not be embedded", entity_id, len(outcome.failed))
    if next_after is not None:  # the next step through the outbox: a broker outage right now loses nothing
        from app.db import db
        from app.tasks import enqueue_after_commit

        with db.product_session(product) as session:
            enqueue_after_commit(session, backfill, product, org_id, entity_id, fingerprint, next_after)
    return {**outcome.as_dict(), "next": next_after}
