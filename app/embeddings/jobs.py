"""Leases of embedding jobs: every queued or running embedding job has a row, a token and a lease.

A job is what one message asks for: the records of one `embeddings.records` task (a record write's
ids, at most RECORDS_PER_TASK), or one `embeddings.backfill` walk of a definition (its cursor moves
with each step). `queue_records` / `queue_backfill` write the job's row (table
`entity_embedding_jobs`, migration v0005) and its message in the caller's transaction, like the
outbox row (app.tasks.enqueue_message_after_commit); without a broker (eager mode) there is no row.

The token travels in the task id (`app.tasks.lease_message_id`), so messages keep the arguments of the
release before leases (a rollback runs them). A worker runs a leased message under the job's
advisory lock (`app.tasks.job_lock`, released by PostgreSQL when the worker's connection dies,
`kill -9` included) and only while the row's `dispatch_token` is the message's: a records job deletes
its row when done; a backfill step moves the cursor, bumps the token and writes the next step's
message in one transaction, or deletes the row after the last step. A message whose row is gone or
whose token moved on is a duplicate and does nothing.

The embedding lease reaper (`requeue_stalled_jobs`, in app.lease_reapers) sends a job past its lease
that no worker holds again under its current token (a worker killed mid-job, a message lost with the
broker's memory, or one still waiting in a long queue: that one stays valid, and whichever of the two
runs first does the job; the other then finds the row gone or its token moved on). The work itself is
idempotent in effect (vectors already current are skipped, and stores are checked against the record
version), so a late duplicate costs a read, never a second vector.
Messages without a lease in their task id (the previous release's, an operator's `celery call`, direct
calls) run as before, unleased; an unleased backfill step hands its successor to a leased walk.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from flask import current_app, has_app_context
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.config import SETTINGS
from app.db import db
from app.embeddings.models import EmbeddingJob
from app.platform_models import FailedTask
from app.tasks import (
    _key_prefix,
    enqueue_after_commit,
    enqueue_message_after_commit,
    interrupted_reason,
    lease_message_id,
    reap_each_product,
    reap_stalled,
    uses_outbox,
)
from app.wire import new_id, utcnow

log = logging.getLogger(__name__)

LOCK_CLASS = 0x454D_4244  # "EMBD": the advisory lock class of embedding jobs (app.tasks.job_lock)
# A reaper holds a job's lock for the few milliseconds of its transaction; a message arriving then waits.
LOCK_WAIT_SECONDS = 5.0
# The tasks (app.embeddings.tasks, which imports this module), sent by name.
RECORDS_TASK = "embeddings.records"
BACKFILL_TASK = "embeddings.backfill"


def _lease_seconds() -> float:
    if has_app_context():
        return float(current_app.config["EMBEDDINGS_JOB_LEASE_SECONDS"])
    return float(SETTINGS["EMBEDDINGS_JOB_LEASE_SECONDS"][0])


def lease_end(extra_seconds: float = 0.0):
    return utcnow() + timedelta(seconds=_lease_seconds() + extra_seconds)


def _send(session: Session, job: EmbeddingJob, product: str) -> None:
    """The job's message under its current token, sent once `session` commits."""
    if job.kind == "records":
        enqueue_message_after_commit(session, RECORDS_TASK, lease_message_id(job.id, job.dispatch_token),
                                     (product, job.org_id, job.entity_id, list(job.record_ids or ())))
    else:
        enqueue_message_after_commit(session, BACKFILL_TASK, lease_message_id(job.id, job.dispatch_token),
                                     (product, job.org_id, job.entity_id, job.fingerprint or "", job.after_id or ""))


# --- writers (inside the caller's transaction) --------------------------------------------------------

def queue_records(session: Session, product: str, org_id: str, entity_id: str, record_ids: list[str]) -> None:
    """Embed these records once the caller's transaction commits (a leased job with a broker)."""
    if not uses_outbox():  # eager: the task runs in this process right after commit
        enqueue_after_commit(session, RECORDS_TASK, product, org_id, entity_id, list(record_ids))
        return
    job = EmbeddingJob(id=new_id(), kind="records", org_id=org_id, entity_id=entity_id, record_ids=list(record_ids),
                       dispatch_token=0, lease_expires_at=lease_end(), key_prefix=_key_prefix(), created_at=utcnow())
    session.add(job)
    _send(session, job, product)


def queue_backfill(session: Session, product: str, org_id: str, entity_id: str, fingerprint: str,
                   after_id: str = "") -> None:
    """Walk the definition's records from `after_id` once the caller's transaction commits."""
    if not uses_outbox():
        enqueue_after_commit(session, BACKFILL_TASK, product, org_id, entity_id, fingerprint, after_id)
        return
    job = EmbeddingJob(id=new_id(), kind="backfill", org_id=org_id, entity_id=entity_id, fingerprint=fingerprint,
                       after_id=after_id, dispatch_token=0, lease_expires_at=lease_end(), key_prefix=_key_prefix(),
                       created_at=utcnow())
    session.add(job)
    _send(session, job, product)


# --- the worker's side --------------------------------------------------------------------------------

def claim(session: Session, job_id: str, token: int, kind: str, *, new_run: bool = True,
          **expected) -> EmbeddingJob | None:
    """The job, when the message of `token` may run it (call under the job's lock); renews its lease and,
    for a `new_run` (not a Celery retry of the same run), counts it in `attempts` (the reaper's bound).
    None: finished already, the token moved on (a duplicate or superseded message), or the job is not the
    one the message's arguments (`expected`: column values) describe (a task id naming another job)."""
    job = session.get(EmbeddingJob, job_id)
    if job is None or job.kind != kind:
        log.info("embedding job %s is finished; duplicate message ignored", job_id)
        return None
    if any(getattr(job, column) != value for column, value in expected.items()):
        log.warning("embedding job %s is not the job of this message's arguments; message ignored", job_id)
        return None
    if job.dispatch_token != token:
        log.info("embedding job %s: message of token %s superseded by %s", job_id, token, job.dispatch_token)
        return None
    job.lease_expires_at = lease_end()
    if new_run:
        job.attempts = (job.attempts or 0) + 1
    session.commit()
    return job


def finish(product: str, job_id: str) -> None:
    with db.product_session(product) as session:
        session.execute(delete(EmbeddingJob).where(EmbeddingJob.id == job_id))


def extend(product: str, job_id: str, seconds: float) -> None:
    """A retry is scheduled `seconds` ahead: keep the reaper off the job until it is due, and a lease after."""
    with db.product_session(product) as session:
        session.execute(update(EmbeddingJob).where(EmbeddingJob.id == job_id)
                        .values(lease_expires_at=lease_end(seconds)))


def next_step(session: Session, product: str, job_id: str | None, org_id: str, entity_id: str, fingerprint: str,
              after_id: str) -> None:
    """A backfill step is done and `after_id` is where the walk goes on: move the walk's cursor and token
    and write the next step's message, in `session`'s transaction (the caller commits). A walk without a
    row (an unleased message) becomes a leased one here."""
    job = session.get(EmbeddingJob, job_id, with_for_update=True) if job_id else None
    if job is None:
        queue_backfill(session, product, org_id, entity_id, fingerprint, after_id)
        return
    job.fingerprint, job.after_id, job.attempts = fingerprint, after_id, 0  # the walk moved on
    job.dispatch_token, job.lease_expires_at = job.dispatch_token + 1, lease_end()
    _send(session, job, product)


# --- the lease reaper ---------------------------------------------------------------------------------

def requeue_stalled_jobs() -> int:
    """Lease reaper (app.lease_reapers, run by every worker's maintenance loop): send again, under its
    current token and with a renewed lease, every embedding job of this deployment (CELERY_KEY_PREFIX)
    past its lease whose advisory lock is free (no live worker runs it). Returns how many were sent."""
    return reap_each_product("embedding lease reaper", _requeue_stalled)


def _requeue_stalled(product: str) -> int:
    given_up = []
    with db.product_session(product) as session:
        def give_up(job: EmbeddingJob) -> None:
            given_up.append((job.id, job.kind, job.attempts, _message_args(job, product)))
            session.delete(job)

        def resend(job: EmbeddingJob) -> None:
            log.warning("embedding job %s (%s, product %s) past its lease with no worker; dispatched again",
                        job.id, job.kind, product)
            # The same token, not a new one (as the email reaper): the job's message may only be waiting
            # in a long queue, and a new token voided it, sending the job to the back of the queue again
            # every lease period. Whichever of the two runs first does the job (deletes the row or moves
            # the walk's token on) under the job's lock; the other is then a no-op read.
            job.lease_expires_at = lease_end()
            _send(session, job, product)

        requeued = reap_stalled(session, EmbeddingJob, LOCK_CLASS, give_up=give_up, resend=resend, limit=500)
    for job_id, kind, attempts, args in given_up:  # after the commit that dropped them
        _record_given_up(job_id, kind, attempts, args, product)
    return requeued


def _message_args(job: EmbeddingJob, product: str) -> list:
    if job.kind == "records":
        return [product, job.org_id, job.entity_id, list(job.record_ids or ())]
    return [product, job.org_id, job.entity_id, job.fingerprint or "", job.after_id or ""]


def _record_given_up(job_id: str, kind: str, attempts: int, args: list, product: str) -> None:
    """A job the reaper stopped sending lands in platform.failed_tasks with the reason (where every task
    that failed for good is), so an operator can re-run it (`flask embeddings backfill`)."""
    reason = interrupted_reason(attempts)
    log.error("embedding job %s (%s, product %s): %s", job_id, kind, product, reason)
    try:
        with db.product_session(db.default_product) as session:
            session.add(FailedTask(task_id=job_id, task_name=f"embeddings.{kind}", args=args, kwargs={},
                                   error=f"JobInterrupted: {reason}"))
    except Exception:  # the log line above stays
        log.exception("could not record the given-up embedding job %s", job_id)
