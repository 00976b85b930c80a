"""Bulk email: a job of per-recipient deliveries, sent by `email` queue workers.

Once per recipient: a delivery is sent only after a worker moved it from `pending` to `sending`
(UPDATE … WHERE status = 'pending', SKIP LOCKED). Right before the message's point of no return (SMTP:
MAIL and RCPT accepted, DATA about to start) its `claimed_at` is committed, and its outcome is
committed right after the SMTP answer, row by row. One worker runs a job at a time (a session
advisory lock on the job id). When a job is run again after its worker was lost (killed, task time
limit), a row still `sending` without `claimed_at` never reached the server's DATA (a transaction the
server has not got the end of is discarded): it goes back to `pending` and is sent; one with
`claimed_at` was perhaps delivered: it is marked failed ("not resent"), never sent again (the only
case SMTP leaves open: at most one message per worker connection, lost between DATA and the answer);
`sent` rows are skipped. A job whose runs are lost JOB_MAX_ATTEMPTS times in a row without recording a
delivery is ended by the reaper, its unsent rows failed with the reason (also the job's `error`).
Transient failures (4xx, dropped connection) go back to `pending` with a growing delay, up to
EMAIL_BULK_MAX_ATTEMPTS tries; permanent ones (5xx, a refused recipient) fail at once.

Slices and the lease: a task sends at most EMAIL_BULK_SLICE_SIZE recipients (well inside the task time
limit), then, in one transaction, bumps the job's `dispatch_token`, renews `lease_expires_at` and
writes the next slice's message to the outbox (`enqueue_after_commit`): a broker outage or a worker
death between slices loses nothing. A message whose token is not the job's current one does nothing,
so there is only ever one live chain. The email lease reaper (`requeue_stalled_jobs`, in
`app.lease_reapers()`) dispatches again, under the job's current token, a job past its lease that no
worker holds (its advisory lock is free): a worker killed mid-slice, a soft time limit, a message lost
with the broker's memory, or one only waiting in a long queue (it stays valid: whichever of the two
messages runs first sends the slice and moves the token on). Eager mode (no broker) sends the whole job in one call.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from flask import current_app
from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from app.db import db
from app.email.models import EmailDelivery, EmailJob
from app.email.senders import Delivery, NotSent
from app.email.services import build_message, get_sender, unique_addresses
from app.errors import NotFound
from app.tasks import (
    _key_prefix,
    enqueue_message_after_commit,
    interrupted_reason,
    job_lock,
    lease_message_id,
    reap_each_product,
    reap_stalled,
    retry_countdown,
)
from app.tenancy import Tenant, tenant_select
from app.wire import iso, new_id, utcnow

log = logging.getLogger(__name__)
CLAIM_CHUNK = 200
LOST = ("The worker was lost while handing this message to the SMTP server (it may have been delivered); "
        "not resent, to never deliver twice.")
JOB_LOCK = 0x454D_4A42
LOCK_WAIT_SECONDS = 10.0
SEND_TASK = "email.bulk_send"  # app.email.tasks.bulk_send, sent by name


# --------------------------------------------------------------------------- creating jobs


def create_job(session: Session, tenant: Tenant, *, kind: str, deliveries: list[dict[str, Any]],
               subject: str | None = None, body: str | None = None) -> EmailJob:
    """A queued job with one `pending` row per delivery, in the caller's unit of work; its task is sent once
    that commits."""
    job = EmailJob(id=new_id(), org_id=tenant.org_id, kind=kind, status="queued", subject=subject,
                   body=body, total=len(deliveries), created_by=tenant.user_id, created_at=utcnow(),
                   lease_expires_at=_lease_end(), dispatch_token=0, key_prefix=_key_prefix())
    session.add(job)
    session.flush()
    if deliveries:
        session.execute(insert(EmailDelivery), [
            {"job_id": job.id, "seq": i, "org_id": tenant.org_id, "status": "pending", "attempts": 0,
             "recipient": d["to"], "subject": d.get("subject"), "body": d.get("body"), "headers": d.get("headers")}
            for i, d in enumerate(deliveries)])
    else:
        job.status, job.finished_at, job.lease_expires_at = "done", utcnow(), None
    if deliveries:
        _dispatch(session, tenant.product, job.id, 0)
    return job


def create_bulk_job(session: Session, tenant: Tenant, payload: dict) -> EmailJob:
    """From the bulk-send body: `messages` (each its own), or one message to `recipients`."""
    if payload.get("messages"):
        deliveries = [{"to": m["to"].strip(), "subject": m["subject"], "body": m["body"]}
                      for m in payload["messages"]]
        return create_job(session, tenant, kind="bulk", deliveries=deliveries)
    deliveries = [{"to": r} for r in unique_addresses(payload["recipients"])]
    return create_job(session, tenant, kind="bulk", deliveries=deliveries, subject=payload["subject"],
                      body=payload["body"])


# --------------------------------------------------------------------------- reading


def job_counts(job_id: str) -> dict[str, int]:
    rows = db.session.execute(select(EmailDelivery.status, func.count()).where(EmailDelivery.job_id == job_id)
                              .group_by(EmailDelivery.status)).all()
    counts = {"pending": 0, "sending": 0, "sent": 0, "failed": 0}
    counts.update({status: n for status, n in rows})
    return counts


def get_job(job_id: str) -> EmailJob:
    job = db.session.scalars(tenant_select(EmailJob).where(EmailJob.id == job_id)).first()
    if job is None:
        raise NotFound("Email job not found.")
    return job


def job_to_wire(job: EmailJob) -> dict[str, Any]:
    return {"id": job.id, "kind": job.kind, "status": job.status, "total": job.total, "counts": job_counts(job.id),
            "subject": job.subject, "createdBy": job.created_by, "createdAt": iso(job.created_at),
            "startedAt": iso(job.started_at), "finishedAt": iso(job.finished_at), "error": job.error}


def list_deliveries(job: EmailJob, status: str | None, after: int | None, limit: int) -> list[EmailDelivery]:
    stmt = select(EmailDelivery).where(EmailDelivery.org_id == job.org_id, EmailDelivery.job_id == job.id)
    if status:
        stmt = stmt.where(EmailDelivery.status == status)
    if after is not None:
        stmt = stmt.where(EmailDelivery.seq > after)
    return list(db.session.scalars(stmt.order_by(EmailDelivery.seq).limit(limit)))


def delivery_to_wire(d: EmailDelivery) -> dict[str, Any]:
    return {"seq": d.seq, "to": d.recipient, "status": d.status, "attempts": d.attempts, "smtpCode": d.smtp_code,
            "error": d.error, "sentAt": iso(d.sent_at)}


# --------------------------------------------------------------------------- sending (worker)


def _job_lock(job_id: str, wait_seconds: float = 0.0):
    """The job's session advisory lock (app.tasks.job_lock: ends with the connection, `kill -9` included),
    tried for up to `wait_seconds`."""
    return job_lock(JOB_LOCK, job_id, wait_seconds)


def _lease_end():
    return utcnow() + timedelta(seconds=float(current_app.config["EMAIL_BULK_LEASE_SECONDS"]))


def run_job(product: str, job_id: str, token: int | None = None, *, slice_size: int | None = None,
            sleep=time.sleep) -> str:
    """Send `product`'s job: at most `slice_size` recipients (None: all), then chain the next slice
    through the outbox. `token` is the message's dispatch token (None: 0, messages of the previous
    release). Returns done | continued | busy | stale | missing."""
    # A slice's message is sent the moment the previous slice commits, a few statements before that
    # slice's worker lets go of the lock: wait for it a little rather than drop the chain. Still held
    # after LOCK_WAIT_SECONDS: a duplicate of a message another worker is running (or, should the
    # holder be that slow, the lease reaper sends the slice again).
    with _job_lock(job_id, LOCK_WAIT_SECONDS if slice_size is not None else 0.0) as mine:
        if not mine:
            log.info("email job %s is being sent by another worker", job_id)
            return "busy"
        with db.product_session(product) as session:
            return _run_locked(session, product, job_id, token or 0, slice_size, sleep)


def _run_locked(session, product: str, job_id: str, token: int, slice_size: int | None, sleep) -> str:
    job = session.get(EmailJob, job_id)
    if job is None:
        log.warning("email job %s does not exist (deleted?)", job_id)
        return "missing"
    if job.status == "done":
        return "done"
    if job.dispatch_token != token:  # a finished slice moved the token on: a duplicate of its message
        log.info("email job %s: message of token %s superseded by %s", job_id, token, job.dispatch_token)
        return "stale"
    _recover_lost_rows(session, job_id)
    job.status, job.started_at, job.lease_expires_at = "sending", job.started_at or utcnow(), _lease_end()
    job.attempts = (job.attempts or 0) + 1  # a run started; one that records deliveries sets it back to 0
    # This message came through this deployment's broker, so the job is this deployment's: a job of the
    # previous release (m0002 left key_prefix empty; it could not know) comes under this reaper.
    job.key_prefix = _key_prefix()
    session.commit()
    config = current_app.config
    concurrency = max(1, int(config["EMAIL_BULK_CONCURRENCY"]))
    max_attempts = max(1, int(config["EMAIL_BULK_MAX_ATTEMPTS"]))
    backoff = float(config["EMAIL_BULK_RETRY_SECONDS"])
    tenant = Tenant(org_id=job.org_id, user_id=job.created_by or "", email=None, role=None, product=product)
    subject, body = job.subject, job.body
    sender, sender_address = get_sender(), config["EMAIL_FROM"]
    rows_engine = db.engine_for(product, autocommit=True)  # the pool threads' own per-row writes
    progressed = threading.Event()
    local = threading.local()
    transports = []
    lock = threading.Lock()

    def transport():
        if getattr(local, "transport", None) is None:
            local.transport = sender.open_batch()
            with lock:
                transports.append(local.transport)
        return local.transport

    def deliver(row) -> Delivery:
        """Send one row and commit its outcome at once: a worker lost later never loses a delivery."""
        try:
            message = build_message(sender_address, [row.recipient], row.subject or subject or "",
                                    row.body or body or "", tenant)
            if row.headers:  # a long List-Unsubscribe URL must not be folded into encoded words
                message.policy = message.policy.clone(max_line_length=998)
                for name, value in row.headers.items():
                    message[name] = value
            result = transport().deliver(message, before_data=lambda: _on_the_wire(rows_engine, job_id, row.seq))
        except NotSent as exc:  # the point of no return could not be recorded: not sent, tried again later
            log.warning("email job %s: message %s not sent (%s)", job_id, row.seq, exc)
            result = Delivery("retry", f"Not sent: its send could not be recorded ({exc})"[:500])
        except Exception as exc:  # a bad message must not stop the job
            log.exception("email job %s: building/sending message %s failed", job_id, row.seq)
            result = Delivery("failed", f"{type(exc).__name__}: {exc}"[:500])
        _record(rows_engine, job_id, [row], [result], max_attempts, backoff)
        if not progressed.is_set():  # this run got somewhere: it does not count against JOB_MAX_ATTEMPTS
            progressed.set()
            with rows_engine.connect() as conn:
                conn.execute(update(EmailJob.__table__).where(EmailJob.__table__.c.id == job_id)
                             .values(attempts=0))
        return result

    budget = slice_size if slice_size is not None else -1  # -1: the whole job in this call
    finished = False
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="email-bulk") as pool:
            while budget != 0:
                rows = _claim(session, job_id, CLAIM_CHUNK if budget < 0 else min(CLAIM_CHUNK, budget))
                if not rows:
                    wait = _next_retry_in(session, job_id)
                    if wait is None:
                        finished = True
                        break
                    _renew(session, job_id)
                    sleep(min(wait, 30.0))
                    if budget > 0:  # a slice waits once, then hands over: no task outlives its time limit
                        break
                    continue
                list(pool.map(deliver, rows))  # each row's outcome is committed as it comes
                _renew(session, job_id)
                if budget > 0:
                    budget -= len(rows)
            else:
                finished = _next_retry_in(session, job_id) is None
    finally:
        for t in transports:
            t.close()
    job = session.get(EmailJob, job_id)
    if finished:
        job.status, job.finished_at, job.lease_expires_at = "done", utcnow(), None
        session.commit()
        return "done"
    job.dispatch_token, job.lease_expires_at, job.attempts = job.dispatch_token + 1, _lease_end(), 0
    _dispatch(session, product, job_id, job.dispatch_token)
    session.commit()  # the next slice's message is an outbox row of this commit
    return "continued"


def _dispatch(session, product: str, job_id: str, token: int) -> None:
    """The job's next message, sent once `session` commits. The token travels in the task id
    (app.tasks.lease_message_id), not as an argument: a worker of the release before slices runs the
    message (it sends the whole job), so a rollback strands no job mid-chain. Sent by name: app.email.tasks
    imports this module."""
    enqueue_message_after_commit(session, SEND_TASK, lease_message_id(job_id, token), (product, job_id))


def _renew(session, job_id: str) -> None:
    session.execute(update(EmailJob).where(EmailJob.id == job_id).values(lease_expires_at=_lease_end()))
    session.commit()


def _recover_lost_rows(session, job_id: str) -> None:
    """Rows a lost worker left `sending` (its job lock is ours now, so nobody sends them): those it had
    not taken to their point of no return (`claimed_at` unset: MAIL/RCPT at most, which the server
    discards with the dropped connection) go back to `pending`, their try not counted; those past it
    (`claimed_at` set: DATA was under way, they may have been delivered) fail with LOST, never sent again."""
    rows = EmailDelivery.__table__.c
    session.execute(update(EmailDelivery).where(rows.job_id == job_id, rows.status == "sending",
                                                rows.claimed_at.is_(None))
                    .values(status="pending", attempts=func.greatest(rows.attempts - 1, 0)))
    session.execute(update(EmailDelivery).where(rows.job_id == job_id, rows.status == "sending")
                    .values(status="failed", error=LOST))


def _on_the_wire(engine, job_id: str, seq: int) -> None:
    """A row reaches its point of no return (app.email.senders.BatchTransport): recorded, committed,
    before the message may be delivered."""
    table = EmailDelivery.__table__
    with engine.connect() as conn:  # autocommit
        conn.execute(update(table).where(table.c.job_id == job_id, table.c.seq == seq).values(claimed_at=func.now()))


def requeue_stalled_jobs() -> int:
    """Lease reaper (app.lease_reapers, run by every worker's maintenance loop): an unfinished job past
    its lease whose advisory lock is free has no live worker and no message on its way that started:
    its next slice is sent again through the outbox (same dispatch token: a message still waiting in
    the queue stays valid), and its lease renewed, in one transaction.
    A job a worker is sending (lock held) is left alone; its slice renews the lease. Only this
    deployment's jobs (CELERY_KEY_PREFIX, as the outbox dispatch): another one sharing the database has
    its own broker and settings."""
    return reap_each_product("email lease reaper", _requeue_stalled)


def _requeue_stalled(product: str) -> int:
    with db.product_session(product) as session:
        def resend(job: EmailJob) -> None:
            log.warning("email job %s (product %s) past its lease with no worker; dispatched again",
                        job.id, product)
            # The same token, not a new one: the job's message may only be waiting in a busy queue
            # (lost is not the only way to be late); whichever of the two runs first sends the
            # slice and moves the token on, the other then does nothing.
            job.lease_expires_at = _lease_end()
            _dispatch(session, product, job.id, job.dispatch_token)

        return reap_stalled(session, EmailJob, JOB_LOCK, EmailJob.status != "done",
                            give_up=lambda job: _give_up(session, job, product), resend=resend)


def _give_up(session, job: EmailJob, product: str) -> None:
    """End a job whose last JOB_MAX_ATTEMPTS runs were each lost before sending anything: its rows not
    sent yet fail with the reason (rows caught at their point of no return: LOST), and the reason is the
    job's `error`. Called under the job's lock (the reaper's transaction)."""
    reason = interrupted_reason(job.attempts)
    log.error("email job %s (product %s): %s", job.id, product, reason)
    _recover_lost_rows(session, job.id)
    session.execute(update(EmailDelivery).where(EmailDelivery.job_id == job.id, EmailDelivery.status == "pending")
                    .values(status="failed", error=reason))
    job.status, job.error, job.finished_at, job.lease_expires_at = "done", reason, utcnow(), None


def _claim(session, job_id: str, limit: int):
    due = (select(EmailDelivery.seq).where(
        EmailDelivery.job_id == job_id, EmailDelivery.status == "pending",
        (EmailDelivery.next_attempt_at.is_(None)) | (EmailDelivery.next_attempt_at <= func.now()))
        .order_by(EmailDelivery.seq).limit(limit).with_for_update(skip_locked=True)
        # MATERIALIZED: as `IN (subquery)` PostgreSQL may run the LIMIT … SKIP LOCKED subquery again per
        # row, and the claim took the whole job instead of `limit` rows (a slice must stay bounded)
        .cte("due").prefix_with("MATERIALIZED"))
    rows = session.execute(
        update(EmailDelivery).where(EmailDelivery.job_id == job_id, EmailDelivery.seq.in_(select(due.c.seq)))
        # `sending`, not yet on the wire: `claimed_at` is set at the row's point of no return (_on_the_wire)
        .values(status="sending", claimed_at=None, attempts=EmailDelivery.attempts + 1)
        .returning(EmailDelivery.seq, EmailDelivery.recipient, EmailDelivery.subject, EmailDelivery.body,
                   EmailDelivery.headers, EmailDelivery.attempts)).all()
    session.commit()
    return sorted(rows, key=lambda r: r.seq)


def _next_retry_in(session, job_id: str) -> float | None:
    moment = session.scalar(select(func.min(EmailDelivery.next_attempt_at)).where(
        EmailDelivery.job_id == job_id, EmailDelivery.status == "pending"))
    session.commit()
    if moment is None:
        pending = session.scalar(select(func.count()).where(EmailDelivery.job_id == job_id,
                                                            EmailDelivery.status == "pending"))
        return 0.0 if pending else None
    return max(0.0, (moment - utcnow()).total_seconds())


def _record(engine, job_id: str, rows, results: list[Delivery], max_attempts: int, backoff: float) -> None:
    now = utcnow()
    params = []
    for row, result in zip(rows, results, strict=True):
        status, next_at = result.status, None
        if status == "retry":
            if row.attempts >= max_attempts:
                status = "failed"
            else:
                # the one retry policy (app.tasks.retry_countdown: doubling, jitter, cap), in units of
                # EMAIL_BULK_RETRY_SECONDS
                delay = backoff * retry_countdown(row.attempts - 1)
                status, next_at = "pending", now + timedelta(seconds=delay)
        params.append({"b_seq": row.seq, "b_status": status, "b_code": result.code,
                       "b_error": None if status == "sent" else result.message[:2000],
                       "b_next": next_at, "b_sent": now if status == "sent" else None})
    table = EmailDelivery.__table__
    with engine.connect() as conn:  # autocommit
        conn.execute(
            update(table).where(table.c.job_id == job_id, table.c.seq == bindparam("b_seq"))
            .values(status=bindparam("b_status"), smtp_code=bindparam("b_code"), error=bindparam("b_error"),
                    next_attempt_at=bindparam("b_next"), sent_at=bindparam("b_sent")), params)
