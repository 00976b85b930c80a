"""Celery tasks of the embedding pipeline (queue `embeddings`); the logic is in app.embeddings.pipeline.

Both tasks take ids and are idempotent (a redelivered task finds the vectors current and skips the
model). Each is a leased job when sent with a broker (app.embeddings.jobs: a row, a token in the task
id, a lease the embedding reaper watches). Transient trouble — the embedder's `EmbedderTransientError`
or a database OperationalError — is retried with the one retry policy of app.tasks up to
EMBEDDINGS_TASK_MAX_RETRIES;
after that the task fails and lands in platform.failed_tasks.
"""

from __future__ import annotations

import logging

from celery.exceptions import Retry, SoftTimeLimitExceeded, TaskPredicate
from flask import current_app
from sqlalchemy.exc import OperationalError

from app.db import db
from app.embeddings import EmbedderError, EmbedderTransientError, jobs, pipeline
from app.extensions import celery_app
from app.tasks import MAX_BACKOFF_SECONDS, job_lock, lease_of, retry_or_give_up

log = logging.getLogger(__name__)

class EmbeddingFailed(Exception):
    """Some records could not be embedded (permanent embedder errors); the others were stored."""


def _retry(task, exc: Exception, product: str, job) -> Exception:
    """The retry (or give-up) of `exc`; a leased job's lease follows: held until the retry is due, or the
    row dropped when the task gives up (it then lands in failed_tasks)."""
    outcome = retry_or_give_up(task, exc, current_app.config["EMBEDDINGS_TASK_MAX_RETRIES"])
    if job is not None:
        try:
            if isinstance(outcome, Retry):
                jobs.extend(product, job.id, MAX_BACKOFF_SECONDS)
            else:
                jobs.finish(product, job.id)
        except OperationalError:  # the database is what failed: the reaper sees to the job after its lease
            log.warning("embedding job %s: could not update its lease", job.id)
    return outcome


def _leased(task, product: str, kind: str, work, **expected):
    """Run `work(job)` under the lease of the job the message's task id names (app.embeddings.jobs), or
    `work(None)` for an unleased message. A duplicate or superseded message does nothing, nor does one
    whose arguments (`expected`) are not its job's."""
    lease = lease_of(task.request.id)
    if lease is None:
        return work(None)
    job_id, token = lease
    with job_lock(jobs.LOCK_CLASS, job_id, jobs.LOCK_WAIT_SECONDS) as mine:
        if not mine:
            log.info("embedding job %s is being run by another worker", job_id)
            return {"busy": True}
        with db.product_session(product) as session:
            job = jobs.claim(session, job_id, token, kind, new_run=not task.request.retries, **expected)
        if job is None:
            return {"stale": True}
        try:
            return work(job)
        except (TaskPredicate, OperationalError, SoftTimeLimitExceeded):  # a retry keeps the lease (a retry
            # the broker could not take is a Reject); the others are the reaper's turn too (the database
            raise  # failing; a slow run's stored batches stay, a re-send goes on)
        except Exception:  # the task fails for good (failed_tasks): a re-send would fail the same way, every
            _drop(product, job)  # lease period, forever (a records job's EmbedderConfigError, a bug)
            raise


def _drop(product: str, job) -> None:
    try:
        jobs.finish(product, job.id)
    except OperationalError:
        log.warning("embedding job %s: could not drop its lease row", job.id)


@celery_app.task(name=jobs.RECORDS_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def embed_records(self, product: str, org_id: str, entity_id: str, record_ids: list[str]) -> dict:
    """Embed (or re-stamp) these records of one definition after they were created or updated."""

    def work(job):
        try:
            outcome = pipeline.embed_records(product, org_id, entity_id, record_ids)
        except (EmbedderTransientError, OperationalError) as exc:
            raise _retry(self, exc, product, job) from None
        if job is not None:
            jobs.finish(product, job.id)
        if outcome.failed:
            raise EmbeddingFailed(f"{len(outcome.failed)} record(s) of entity {entity_id} could not be embedded: "
                                  f"{', '.join(outcome.failed[:20])}")
        return outcome.as_dict()

    return _leased(self, product, "records", work, org_id=org_id, entity_id=entity_id, record_ids=list(record_ids))


@celery_app.task(name=jobs.BACKFILL_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def backfill(self, product: str, org_id: str, entity_id: str, fingerprint: str = "", after_id: str = "") -> dict:
    """Re-embed a definition's records after embeddings were enabled or their setup changed.

    One step per task (RECORDS_PER_TASK records, in id order); the next step is queued when this
    one has committed, so new-record tasks interleave with a long backfill instead of waiting. The walk
    is a leased job (app.embeddings.jobs): the step moves its cursor and token and writes the next
    step's outbox row in one transaction, sent by the worker's maintenance loop if the broker is down;
    a worker lost mid-step leaves the walk to the embedding lease reaper, which sends the step again
    (it skips records whose vectors are current).
    An empty `fingerprint` walks the present setup (`celery -A workers call embeddings.backfill`)."""

    def work(job):
        try:
            outcome, next_after, walked = pipeline.backfill_step(product, org_id, entity_id, fingerprint, after_id)
        except (EmbedderTransientError, OperationalError) as exc:
            raise _retry(self, exc, product, job) from None
        except EmbedderError as exc:  # not configured / cannot run: nothing to gain by walking on
            log.error("backfill of entity %s stopped: %s", entity_id, exc)
            if job is not None:
                jobs.finish(product, job.id)
            raise
        if outcome.failed:
            log.warning("backfill of entity %s: %d record(s) could not be embedded", entity_id, len(outcome.failed))
        try:
            if next_after is None:
                if job is not None:
                    jobs.finish(product, job.id)
            else:  # the next step through the outbox: a broker outage right now loses nothing
                with db.product_session(product) as session:
                    jobs.next_step(session, product, job.id if job is not None else None, org_id, entity_id,
                                   walked, next_after)
        except OperationalError as exc:  # the step committed, its successor did not: retry (the step is
            raise _retry(self, exc, product, job) from None  # idempotent), else the walk is never queued
        return {**outcome.as_dict(), "next": next_after}

    return _leased(self, product, "backfill", work, org_id=org_id, entity_id=entity_id)
