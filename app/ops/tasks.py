"""Operational tasks and the failed-task recorder (connected by `init_celery`, not at import)."""

from __future__ import annotations

import logging

from app.extensions import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name="ops.ping", ignore_result=False)
def ping(value: str = "pong") -> str:
    """Round trip through a worker (used by health tooling and tests)."""
    return value


def record_failed_task(sender=None, task_id=None, exception=None, args=None, kwargs=None, **_):
    """A task that failed for good (retries exhausted or not retryable) lands in platform.failed_tasks."""
    from app.db import db
    from app.platform_models import FailedTask

    try:
        with db.product_session(db.default_product) as session:
            session.add(FailedTask(task_id=str(task_id), task_name=getattr(sender, "name", str(sender)),
                                   args=_jsonable(args or []), kwargs=_jsonable(kwargs or {}),
                                   error=f"{type(exception).__name__}: {exception}"[:4000]))
    except Exception:  # recording must never mask the original failure
        log.exception("could not record failed task %s", task_id)


def _jsonable(value):
    import json

    try:
        json.dumps(value)
        return value
    except TypeError:
        return json.loads(json.dumps(value, default=str))
