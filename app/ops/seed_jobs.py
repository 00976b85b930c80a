"""Leased asynchronous seeds: `seed.org` messages a 202 (or `flask seed org --queue`) accepted.

Seeding itself is idempotent (app.ops.seeding, under the org's lock), so a seed run twice is harmless;
what the lease adds is that an accepted seed is not silently dropped. A `seed_jobs` row (o0002) is
written with the message in the caller's transaction and carries the shape every leased job has
(app.tasks): a dispatch token in the task id, `lease_expires_at`, `key_prefix`, `attempts`. The task
runs under the job's advisory lock (its own connection: `kill -9` or the task time limit frees it) and
only while its message's token is the job's; it ends the row `done` (or `failed` with the reason: a
body the seeding refuses, an error). The seed lease reaper (`requeue_stalled_seed_jobs`, in
app.lease_reapers) sends a job past its lease that no worker holds again, or fails it after
JOB_MAX_ATTEMPTS interrupted runs. GET /internal/seed/{orgId} shows the org's latest request
(`lastRequest`). Without a broker (eager) there is no row: the seed runs in the request.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from flask import current_app
from sqlalchemy import select

from app.db import db
from app.ops.seeding import org_id_for
from app.platform_models import SeedJob
from app.tasks import (
    _key_prefix,
    enqueue_after_commit,
    enqueue_message_after_commit,
    interrupted_reason,
    job_lock,
    lease_message_id,
    lease_of,
    reap_stalled,
    uses_outbox,
)
from app.wire import iso, new_id, utcnow

log = logging.getLogger(__name__)
LOCK_CLASS = 0x5345_4A42  # "SEJB": the advisory lock class of seed jobs (app.tasks.job_lock)
LOCK_WAIT_SECONDS = 5.0
SEED_TASK = "seed.org"  # app.ops.tasks.SEED_TASK, sent by name (that module imports this one)


def _lease_end():
    return utcnow() + timedelta(seconds=float(current_app.config["JOB_LEASE_SECONDS"]))


def queue_seed(session, data: dict[str, Any]) -> str:
    """Seed `data` (a loaded SeedRequestSchema body) once `session` commits; returns the task id."""
    if not uses_outbox():
        return enqueue_after_commit(session, SEED_TASK, **data)
    job = SeedJob(id=new_id(), org_id=org_id_for(data["org"]["mainDomain"]), product=data["org"]["product"],
                  body=data, status="queued", dispatch_token=0, lease_expires_at=_lease_end(),
                  key_prefix=_key_prefix(), attempts=0, created_at=utcnow())
    session.add(job)
    return enqueue_message_after_commit(session, SEED_TASK, lease_message_id(job.id, 0), (), data)


def run_leased(task_id: str | None, work) -> dict:
    """Run `work()` (the seed) under the lease of the job `task_id` names; `work()` alone for an unleased
    message (the previous release's, an operator's `celery call`). A duplicate does nothing."""
    lease = lease_of(task_id)
    if lease is None:
        return work()
    job_id, token = lease
    with job_lock(LOCK_CLASS, job_id, LOCK_WAIT_SECONDS) as mine:
        if not mine:
            return {"busy": True}
        session = db.session
        job = session.get(SeedJob, job_id)
        if job is None or job.status not in ("queued", "running") or job.dispatch_token != token:
            log.info("seed job %s: nothing to do for this message (finished or superseded)", job_id)
            return {"stale": True}
        job.status, job.attempts, job.lease_expires_at = "running", (job.attempts or 0) + 1, _lease_end()
        session.commit()
        try:
            report = work()
        except Exception as exc:
            session.rollback()
            _finish(job_id, "failed", f"{type(exc).__name__}: {exc}"[:2000])
            raise
        error = report.get("error") if isinstance(report, dict) else None
        _finish(job_id, "failed" if error else "done", error and error.get("message"))
        return report


def _finish(job_id: str, status: str, error: str | None) -> None:
    session = db.session
    job = session.get(SeedJob, job_id)
    if job is not None:
        job.status, job.error, job.finished_at, job.lease_expires_at = status, error, utcnow(), None
        session.commit()


def requeue_stalled_seed_jobs() -> int:
    """Lease reaper (app.lease_reapers, run by every worker's maintenance loop): a queued or running seed
    of this deployment past its lease whose lock is free is sent again under its token, or `failed` with
    the reason once JOB_MAX_ATTEMPTS runs were lost. Returns how many were sent again."""
    session = db.session

    def give_up(job: SeedJob) -> None:
        job.status, job.error = "failed", interrupted_reason(job.attempts)
        job.finished_at, job.lease_expires_at = utcnow(), None
        log.error("seed job %s (%s/%s): %s", job.id, job.org_id, job.product, job.error)

    def resend(job: SeedJob) -> None:
        log.warning("seed job %s (%s/%s) past its lease with no worker; dispatched again", job.id, job.org_id,
                    job.product)
        job.lease_expires_at = _lease_end()
        enqueue_message_after_commit(session, SEED_TASK, lease_message_id(job.id, job.dispatch_token), (), job.body)

    try:
        requeued = reap_stalled(session, SeedJob, LOCK_CLASS, SeedJob.status.in_(("queued", "running")),
                                give_up=give_up, resend=resend)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return requeued


def latest_request(org_id: str, product: str) -> dict[str, Any] | None:
    """The org's latest asynchronous seed in `product`, for GET /internal/seed/{orgId}; None without one."""
    job = db.session.scalars(select(SeedJob).where(SeedJob.org_id == org_id, SeedJob.product == product)
                             .order_by(SeedJob.created_at.desc()).limit(1)).first()
    if job is None:
        return None
    return {"id": job.id, "status": job.status, "error": job.error, "attempts": job.attempts,
            "createdAt": iso(job.created_at), "finishedAt": iso(job.finished_at)}
