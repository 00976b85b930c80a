"""Celery integration: the base task and the send-after-commit helper.

Tasks take ids, never ORM objects, and are sent only once the transaction that produced their
input has committed (`enqueue_after_commit`): a rolled-back request sends nothing.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from celery import Celery, Task
from flask import Flask, current_app, g, has_app_context
from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


def init_celery(celery: Celery, app: Flask) -> None:
    """Configure the Celery app from celeryconfig + REDIS_URL and run tasks in an app context."""
    import celeryconfig

    celery.config_from_object(celeryconfig)
    redis_url = app.config.get("REDIS_URL")
    if redis_url:
        celery.conf.update(broker_url=redis_url, result_backend=redis_url,
                           task_always_eager=False, task_eager_propagates=False)
        prefix = app.config.get("CELERY_KEY_PREFIX")
        if prefix:  # every queue, unacked and result key of this deployment lives under the prefix
            celery.conf.broker_transport_options = {**celeryconfig.broker_transport_options,
                                                    "global_keyprefix": prefix}
            celery.conf.result_backend_transport_options = {
                **celeryconfig.result_backend_transport_options, "global_keyprefix": prefix}
    else:  # embedded default: no broker, tasks run in-process
        celery.conf.update(task_always_eager=True, task_eager_propagates=True,
                           broker_url="memory://", result_backend="cache+memory://")
    _drop_cached_connections(celery)

    class AppContextTask(Task):
        abstract = True

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if g and getattr(g, "_celery_inline", False):
                return self.run(*args, **kwargs)
            # A worker has no app context: use the app Celery was bound to. An eager task called
            # inside a request or CLI command runs in a fresh context of *that* app (its own `g`, so
            # it never shares the request's session), which keeps several apps in one process apart.
            target = current_app._get_current_object() if has_app_context() else app
            with target.app_context():
                g._celery_inline = True
                return self.run(*args, **kwargs)

    celery.Task = AppContextTask
    celery.set_default()
    celery.loader.import_default_modules()  # the task modules celeryconfig.include declares
    app.extensions["celery"] = celery


def _drop_cached_connections(celery: Celery) -> None:
    """Celery caches its broker pool and result backend; a re-configured app must not reuse them
    (several apps in one process: tests, CLI)."""
    celery._after_fork()
    celery._backend_cache = None
    if getattr(celery._local, "backend", None) is not None:
        del celery._local.backend


def enqueue_after_commit(session: Session, task: Task, *args: Any, **kwargs: Any) -> None:
    """Send `task` once `session`'s current transaction commits; drop it if it rolls back."""
    pending = session.info.setdefault("_pending_tasks", [])
    pending.append((task, args, kwargs))
    if not session.info.get("_task_hooks"):
        session.info["_task_hooks"] = True
        event.listen(session, "after_commit", _flush_pending)
        event.listen(session, "after_soft_rollback", _drop_pending)


def _flush_pending(session: Session) -> None:
    if session.in_nested_transaction():  # a SAVEPOINT was released (after_commit fires for those too):
        return                           # the outer transaction has not committed yet
    pending = session.info.pop("_pending_tasks", [])
    for task, args, kwargs in pending:
        try:
            task.apply_async(args=args, kwargs=kwargs)
        except Exception:  # broker down: the caller's data is committed; log, do not fail the request
            log.exception("could not enqueue %s", task.name)


def _drop_pending(session: Session, previous_transaction) -> None:
    if previous_transaction.parent is None:
        session.info.pop("_pending_tasks", None)


# --- the one retry policy of every task ----------------------------------------------------------------

MAX_BACKOFF_SECONDS = 300


def retry_countdown(retries: int, retry_after: float | None = None) -> float:
    """Seconds before retry number `retries + 1`: the upstream's Retry-After when it gave one, else
    exponential (2**n) with up to 50 % jitter, so a burst of failed tasks does not return in lockstep;
    never more than MAX_BACKOFF_SECONDS."""
    if retry_after is None:
        retry_after = min(MAX_BACKOFF_SECONDS, 2 ** retries) * (1 + random.random() / 2)
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
