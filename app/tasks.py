"""Celery integration: the base task, the transactional outbox and the worker's maintenance loop.

Tasks take ids, never ORM objects, and are sent only once the transaction that produced their
input has committed (`enqueue_after_commit`): a rolled-back request sends nothing.

No accepted task is lost (issue 12): with a broker, `enqueue_after_commit` also writes a row to
`platform.task_outbox` in the caller's transaction. After the commit the task is sent with the row's
id as its Celery task id and the row is deleted; if the broker is down the row stays, and
`dispatch_outbox()` (run every few seconds by every worker's maintenance loop) sends it once the
broker is back. A row can be sent twice (sent, then the delete failed): tasks are idempotent, and a
redelivery runs once in effect. Running jobs are leased: the lease reapers create_app lists (`lease_reapers()`)
re-queue jobs whose worker died (see `app.entities.bulk.requeue_orphaned_jobs`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
import random
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg.errors
from celery import Celery, Task
from flask import Flask, current_app, g, has_app_context
from sqlalchemy import delete, event, func, select, text, update
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session

import celeryconfig
from app import idempotency
from app.broker import configure_broker
from app.db import db
from app.extensions import celery_app
from app.observability import metrics, tracing
from app.platform_models import OutboxMessage, Product
from app.wire import new_id

log = logging.getLogger(__name__)

# True while `_flush_pending` sends the tasks of a commit (an after_commit hook): an eager task sent then
# runs in this process, inside that hook, while the session that committed is in its 'committed' state
# (no SQL until the commit returns). Such a task never takes AppContextTask's inline shortcut, even when
# the commit was a task's (its context has `g._celery_inline`): it gets a context of its own.
_SENDING_AFTER_COMMIT: contextvars.ContextVar[bool] = contextvars.ContextVar("sending_after_commit", default=False)


_bound_app: Flask | None = None  # the app Celery was last bound to (init_celery): a worker's, or the CLI's


class AppContextTask(Task):
    """The base of every task, named where the Celery app is created (app.extensions: `task_cls`), so a
    task has it whatever imported or finalized Celery first: runs the task in an app context, as its
    unit of work."""

    abstract = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Inside a task's context (a task calling another directly, a test's run under its own app) the
        # task runs inline, in the caller's unit of work; not when it was sent by a commit's
        # after_commit hook (`_flush_pending`, eager mode): that session is mid-commit.
        if g and getattr(g, "_celery_inline", False) and not _SENDING_AFTER_COMMIT.get():
            return self.run(*args, **kwargs)
        # A worker has no app context: use the app Celery was bound to. An eager task called
        # inside a request or CLI command runs in a fresh context of *that* app (its own `g`, so
        # it never shares the request's session), which keeps several apps in one process apart.
        # The task is the edge: its context's session is its unit of work (db.unit_of_work), committed
        # when it returns; a job that commits step by step opens its steps' own sessions.
        if has_app_context():
            target = current_app._get_current_object()
        elif _bound_app is not None:
            target = _bound_app
        else:
            raise RuntimeError(f"task {self.name} run before init_celery bound Celery to an app")
        sending = _SENDING_AFTER_COMMIT.set(False)  # what this task calls directly runs inline again
        try:
            with target.app_context():
                g._celery_inline = True
                with db.unit_of_work():
                    return self.run(*args, **kwargs)
        finally:
            _SENDING_AFTER_COMMIT.reset(sending)


def init_celery(celery: Celery, app: Flask) -> None:
    """Configure the Celery app from celeryconfig + REDIS_URL and run tasks in an app context."""
    global _bound_app
    configure_broker(celery, app.config)
    _drop_cached_connections(celery)
    _bound_app = app
    celery.set_default()
    celery.loader.import_default_modules()  # the task modules celeryconfig.include declares
    # A message carries its publisher's time limits (Celery copies them from the task, which took them
    # from the configuration the first time it was bound), and a worker obeys the message's: so every
    # app (API, worker, CLI) sets its tasks' limits from its own settings, and the API's limits are the
    # ones a worker enforces on what the API sends.
    for task in celery.tasks.values():
        if not task.name.startswith("celery."):
            task.time_limit, task.soft_time_limit = celery.conf.task_time_limit, celery.conf.task_soft_time_limit
            task._exec_options = None  # Celery's cache of the options a message is sent with
    app.extensions["celery"] = celery


def _drop_cached_connections(celery: Celery) -> None:
    """Celery caches its broker pool and result backend; a re-configured app must not reuse them
    (several apps in one process: tests, CLI)."""
    celery._after_fork()
    celery._backend_cache = None
    if getattr(celery._local, "backend", None) is not None:
        del celery._local.backend


def _celery() -> Celery:
    """The Celery app every task is registered with (create_app configures it: init_celery)."""
    return celery_app


def task_named(name: str) -> Task:
    """The registered task called `name`. Services send their tasks by name (`enqueue_after_commit(session,
    "email.bulk_send", ...)`): a task module imports its service, and the service never imports it back.
    The task modules (celeryconfig.include) are imported here if nothing did yet (init_celery does)."""
    celery = _celery()
    if name not in celery.tasks:
        for module in celeryconfig.include:
            importlib.import_module(module)
    try:
        return celery.tasks[name]
    except KeyError:
        raise LookupError(f"no Celery task named {name!r} (is its module in celeryconfig.include?)") from None


def uses_outbox() -> bool:
    """True with a broker: tasks go through the outbox (and leased jobs have rows); False in eager mode,
    where a task runs in this process right after the commit."""
    return not _celery().conf.task_always_eager


def enqueue_after_commit(session: Session, task: Task | str, *args: Any, **kwargs: Any) -> str:
    """Send `task` (a task or its registered name) once `session`'s current transaction commits; drop it
    if it rolls back. With a broker the task is recorded in the outbox in the same transaction, so it
    survives a broker outage. Returns the task id the message will carry (the outbox row id), for a 202's
    status link."""
    return enqueue_message_after_commit(session, task, new_id(), args, kwargs)


def enqueue_message_after_commit(session: Session, task: Task | str, message_id: str, args=(), kwargs=None) -> str:
    """`enqueue_after_commit` under a given task id (a leased job's `lease_message_id`)."""
    if isinstance(task, str):
        task = task_named(task)
    args, kwargs = tuple(args), dict(kwargs or {})
    in_outbox = not task.app.conf.task_always_eager
    # the caller's trace (a request's, a task's), which the task continues whoever sends it; None untraced
    carrier = tracing.outbox_context(task.name, message_id) if tracing.ENABLED else None
    if in_outbox:
        session.add(OutboxMessage(id=message_id, key_prefix=_key_prefix(), task_name=task.name, args=list(args),
                                  kwargs=dict(kwargs), trace_context=carrier))
    pending = session.info.setdefault("_pending_tasks", [])
    pending.append((task, args, kwargs, message_id, in_outbox, carrier))
    if not session.info.get("_task_hooks"):
        session.info["_task_hooks"] = True
        event.listen(session, "after_commit", _flush_pending)
        event.listen(session, "after_soft_rollback", _drop_pending)
    return message_id


# --- leased jobs: the dispatch token travels in the task id -------------------------------------------
#
# A leased job (a row with a lease and a dispatch token) is sent under the task id
# `<job id>~<token>~<random>`: the task reads its job and token from `self.request.id`, so its message
# has the same arguments as before leases existed, and a worker of the previous release runs it (an
# argument it does not take would fail the task: rollbacks must not strand jobs). The random part keeps
# two dispatches under one token (a reaper re-sending a job whose message is late) distinct outbox rows.


def lease_message_id(job_id: str, token: int) -> str:
    return f"{job_id}~{int(token)}~{secrets.token_hex(4)}"


def lease_of(task_id: str | None) -> tuple[str, int] | None:
    """(job id, dispatch token) of a `lease_message_id`; None for any other task id (unleased message:
    an operator's `celery call`, a message of the previous release, an eager or direct call)."""
    parts = (task_id or "").split("~")
    # ASCII digits only, a dispatch token's size: str.isdigit() takes '²' (int() refuses it) and 5 000 digits
    if len(parts) != 3 or not parts[0] or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) > 18:
        return None
    return parts[0], int(parts[1])


@contextlib.contextmanager
def job_lock(lock_class: int, job_id: str, wait_seconds: float = 0.0) -> Iterator[bool]:
    """A job's session advisory lock (`lock_class`, the job id's hash), tried for up to `wait_seconds`,
    on a connection of its own: it ends with that connection, so `kill -9` of the worker frees it. A
    lease reaper takes the same lock (`pg_try_advisory_xact_lock`) to know no live worker runs the job."""
    with db.engine.connect() as conn:
        deadline = time.monotonic() + wait_seconds
        while True:
            got = conn.scalar(text("SELECT pg_try_advisory_lock(:c, hashtext(:k))"), {"c": lock_class, "k": job_id})
            if got or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        try:
            yield bool(got)
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"), {"c": lock_class, "k": job_id})
            conn.commit()


# --- bounded attempts: a leased job that never finishes is failed, not sent again forever -------------
#
# Every leased job counts the runs a worker started on it (`attempts`; a run that makes progress, a
# slice or a step, sets it back to 0). A lease reaper that finds a job past its lease with no live
# worker sends it again while it has attempts left, and otherwise fails it with `interrupted_reason`,
# shown where the job's status is read: a job whose task is killed by the time limit (or whose worker
# dies on it) every time it runs stops after JOB_MAX_ATTEMPTS runs instead of cycling forever.


def max_attempts() -> int:
    return max(1, int(current_app.config["JOB_MAX_ATTEMPTS"]))


def out_of_attempts(attempts: int | None) -> bool:
    return (attempts or 0) >= max_attempts()


def interrupted_reason(attempts: int | None) -> str:
    return (f"Stopped after {attempts or 0} interrupted run(s): the worker running it was lost or it exceeded the "
            f"task time limit each time (JOB_MAX_ATTEMPTS); not run again.")


def reap_stalled(session: Session, model, lock_class: int, *where, give_up, resend, limit: int = 100) -> int:
    """The lease reaper's one rule, for every leased job kind: rows of `model` of this deployment
    (`key_prefix`: another deployment sharing the database has its own broker) past their lease and
    matching `where`, each taken with SKIP LOCKED, whose advisory lock (`lock_class`, id) is free (the
    lock a worker holds while it runs the job: free means no live worker runs it). `give_up(row)` once
    JOB_MAX_ATTEMPTS runs were lost, else `resend(row)` (same token, renewed lease, through the outbox).
    Returns how many were sent again; the caller owns the transaction."""
    stalled = session.scalars(
        select(model).where(model.key_prefix == _key_prefix(), model.lease_expires_at < func.now(), *where)
        .order_by(model.lease_expires_at).limit(limit).with_for_update(skip_locked=True)).all()
    requeued = 0
    for row in stalled:
        if not session.scalar(text("SELECT pg_try_advisory_xact_lock(:c, hashtext(:k))"),
                              {"c": lock_class, "k": row.id}):
            continue  # a worker runs it right now
        if out_of_attempts(row.attempts):
            give_up(row)
        else:
            resend(row)
            requeued += 1
    return requeued


def _flush_pending(session: Session) -> None:
    if session.in_nested_transaction():  # a SAVEPOINT was released (after_commit fires for those too):
        return                           # the outer transaction has not committed yet
    pending = session.info.pop("_pending_tasks", [])
    sent = []
    sending = _SENDING_AFTER_COMMIT.set(True)  # an eager task runs here, in its own context (AppContextTask)
    try:
        for task, args, kwargs, message_id, in_outbox, carrier in pending:
            try:
                _send(task, args, kwargs, message_id, carrier)
            except Exception as exc:  # broker down: the caller's data is committed; do not fail the request
                metrics.count_redis_error("broker")
                if not in_outbox:
                    log.exception("could not enqueue %s", task.name)
                else:
                    log.warning("could not enqueue %s (%s); the outbox dispatcher sends it when the broker is "
                                "back", task.name, type(exc).__name__)
            else:
                if in_outbox:
                    sent.append(message_id)
    finally:
        _SENDING_AFTER_COMMIT.reset(sending)
    if sent:
        _forget_sent(sent)


def _send(task: Task, args, kwargs, message_id: str, carrier: dict | None) -> None:
    """Hand one outbox task to the broker, in the trace of whoever wrote it (its row's `trace_context`):
    the message's headers carry that context even from a process that does not trace."""
    if carrier is None:
        task.apply_async(args=args, kwargs=kwargs, task_id=message_id)
        return
    with tracing.resumed(carrier):
        try:
            task.apply_async(args=args, kwargs=kwargs, task_id=message_id, headers=tracing.message_headers(carrier))
        except Exception as exc:
            tracing.publish_failed(task, message_id, exc)
            raise


def _key_prefix() -> str:
    """The deployment's CELERY_KEY_PREFIX: deployments sharing a database send only their own rows."""
    return (current_app.config.get("CELERY_KEY_PREFIX") or "") if has_app_context() else ""


def _forget_sent(message_ids: list[str]) -> None:
    try:
        with db.engine.begin() as conn:
            conn.execute(delete(OutboxMessage).where(OutboxMessage.id.in_(message_ids)))
    except Exception:  # the dispatcher sends these once more; tasks are idempotent
        log.warning("could not clear %d sent outbox row(s)", len(message_ids), exc_info=True)


def dispatch_outbox(celery: Celery | None = None, *, min_age_seconds: float | None = None,
                    limit: int = 500) -> int:
    """Send outbox rows older than `min_age_seconds` (OUTBOX_DISPATCH_AFTER_SECONDS: the request that
    wrote a row normally sends it itself) and delete them. Rows are locked SKIP LOCKED, so several
    workers dispatch side by side without sending a row twice. Stops at the first broker error.
    Returns the number of tasks sent."""
    celery = celery or current_app.extensions["celery"]
    if min_age_seconds is None:
        min_age_seconds = float(current_app.config["OUTBOX_DISPATCH_AFTER_SECONDS"])
    cutoff = datetime.now(UTC) - timedelta(seconds=min_age_seconds)
    table = OutboxMessage.__table__
    sent = 0
    with db.engine.begin() as conn:
        rows = conn.execute(select(table.c.id, table.c.task_name, table.c.args, table.c.kwargs, table.c.trace_context)
                            .where(table.c.key_prefix == _key_prefix(), table.c.created_at <= cutoff)
                            .order_by(table.c.created_at)
                            .limit(limit).with_for_update(skip_locked=True)).all()
        done = []
        for row in rows:
            task = celery.tasks.get(row.task_name)
            if task is None:
                conn.execute(update(table).where(table.c.id == row.id).values(
                    attempts=table.c.attempts + 1, last_error=f"unknown task {row.task_name}"))
                continue
            try:
                _send(task, row.args, row.kwargs, row.id, row.trace_context)
            except Exception as exc:
                metrics.count_redis_error("broker")
                conn.execute(update(table).where(table.c.id == row.id).values(
                    attempts=table.c.attempts + 1, last_error=f"{type(exc).__name__}: {exc}"[:2000]))
                log.warning("outbox: broker still unavailable (%s); %d task(s) wait", type(exc).__name__,
                            len(rows) - len(done))
                break
            done.append(row.id)
        if done:
            conn.execute(delete(table).where(table.c.id.in_(done)))
            sent = len(done)
    if sent:
        log.info("outbox: sent %d task(s) accepted while the broker was unavailable", sent)
    return sent


# --- what /metrics reads at scrape time (app.observability.metrics.DeploymentCollector) ------------------

SCRAPE_STATEMENT_TIMEOUT_MS = 1000
# kombu's Redis transport keeps a queue's messages of priority p > 0 in `<queue>\x06\x16<p>`
_PRIORITY_SUFFIXES = ("", *(f"\x06\x16{p}" for p in (3, 6, 9)))


def queues() -> list[str]:
    """Every queue the deployment's tasks are routed to (celeryconfig)."""
    names = {celeryconfig.task_default_queue, *(route["queue"] for route in celeryconfig.task_routes.values())}
    return sorted(names)


def queue_lengths() -> dict[str, int]:
    """Messages waiting per queue (LLEN of its Redis lists, in one round trip of at most 1 s); {} without
    a broker (eager mode)."""
    url = current_app.config.get("REDIS_URL")
    if not url:
        return {}
    client = current_app.extensions.get("metrics_redis")
    if client is None:
        import redis

        client = current_app.extensions["metrics_redis"] = redis.Redis.from_url(
            url, socket_timeout=1, socket_connect_timeout=1)
    prefix = current_app.config.get("CELERY_KEY_PREFIX") or ""
    pipe = client.pipeline(transaction=False)
    names = queues()
    for name in names:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(f"{prefix}{name}{suffix}")
    lengths = pipe.execute()
    step = len(_PRIORITY_SUFFIXES)
    return {name: int(sum(lengths[i * step:(i + 1) * step])) for i, name in enumerate(names)}


def outbox_backlog() -> tuple[int, float]:
    """(rows of this deployment's outbox, age in seconds of the oldest), in one statement of at most 1 s."""
    table = OutboxMessage.__table__
    with db.engine.begin() as conn:
        conn.execute(text(f"SET LOCAL statement_timeout = {SCRAPE_STATEMENT_TIMEOUT_MS}"))
        rows, age = conn.execute(select(func.count(), func.extract("epoch", func.now() - func.min(table.c.created_at)))
                                 .where(table.c.key_prefix == _key_prefix())).one()
    return int(rows), max(0.0, float(age or 0))


def reap_each_product(label: str, reap) -> int:
    """Run a lease reaper's `reap(product) -> int` for every product of the platform and sum what it sent
    again. A product whose schema is not migrated yet (`create_product` registers the product, then
    migrates it; seeding does that at runtime, and a failed migration leaves it so) is skipped with a
    warning, so one such product never stops the reaper for the others; any other error is raised."""
    with db.engine.connect() as conn:
        products = list(conn.scalars(select(Product.slug)))
    total = 0
    for product in products:
        try:
            total += reap(product)
        except ProgrammingError as exc:
            if not isinstance(exc.orig, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
                raise
            log.warning("%s: product %s skipped, its schema is not migrated (%s)", label, product,
                        type(exc.orig).__name__)
    return total


def run_maintenance(celery: Celery | None = None) -> dict[str, int]:
    """One round of the worker's maintenance loop (inside an app context): the app's lease reapers
    (`app.extensions["lease_reapers"]`, set by create_app: functions that re-queue jobs whose worker
    died and return how many), then the outbox dispatch, then the deletion of expired idempotency keys
    (app.idempotency.purge_expired)."""
    outcome = {"requeued": 0, "sent": 0, "expired_keys": 0}
    for reaper in current_app.extensions.get("lease_reapers", ()):
        try:
            requeued = reaper()
            metrics.count_reaps(reaper, requeued)
            outcome["requeued"] += requeued
        except Exception:
            log.warning("lease reaper %s failed", getattr(reaper, "__name__", reaper), exc_info=True)
    try:
        outcome["sent"] = dispatch_outbox(celery)
    except Exception:
        log.warning("outbox dispatch failed", exc_info=True)
    try:
        outcome["expired_keys"] = idempotency.purge_expired()
    except Exception:
        log.warning("deleting expired idempotency keys failed", exc_info=True)
    return outcome


def start_maintenance_loop(app: Flask, celery: Celery) -> threading.Thread:
    """A daemon thread (in the worker's main process) running `run_maintenance` every
    OUTBOX_DISPATCH_INTERVAL_SECONDS, first right away: a worker that starts sends what is waiting."""
    interval = float(app.config["OUTBOX_DISPATCH_INTERVAL_SECONDS"])

    def loop() -> None:
        while True:
            with app.app_context():
                run_maintenance(celery)
            time.sleep(interval)

    thread = threading.Thread(target=loop, name="outbox-dispatcher", daemon=True)
    thread.start()
    return thread


def _drop_pending(session: Session, previous_transaction) -> None:
    if previous_transaction.parent is None:
        session.info.pop("_pending_tasks", None)


# --- the one retry policy of every task ----------------------------------------------------------------

MAX_BACKOFF_SECONDS = 300
# the jitter's own generator: a retry scheduled from a background thread (the outbox dispatcher, a worker's
# pool) leaves the random module's shared state alone (a property test drawing meanwhile sees it unchanged)
_JITTER = random.Random()


def retry_countdown(retries: int, retry_after: float | None = None) -> float:
    """Seconds before retry number `retries + 1`: the upstream's Retry-After when it gave one, else
    exponential (2**n) with up to 50 % jitter, so a burst of failed tasks does not return in lockstep;
    never more than MAX_BACKOFF_SECONDS."""
    if retry_after is None:
        retry_after = min(MAX_BACKOFF_SECONDS, 2 ** retries) * (1 + _JITTER.random() / 2)
    return min(retry_after, MAX_BACKOFF_SECONDS)


def retry_or_give_up(task: Task, exc: Exception, max_retries: int) -> Exception:
    """The exception for a bound task to raise on transient trouble: a scheduled retry (Retry), or
    `exc` itself once `max_retries` are used up (then the task fails and lands in failed_tasks)."""
    retries = task.request.retries
    if retries >= max_retries:
        log.error("%s gave up after %d retries: %s", task.name, retries, exc)
        return exc
    countdown = retry_countdown(retries, getattr(exc, "retry_after", None))
    return task.retry(exc=exc, countdown=countdown, max_retries=max_retries, throw=False)
