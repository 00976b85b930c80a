"""The deployment's broker settings on a Celery app, shared by every process: the API and the worker
(app.tasks.init_celery) and the worker health check (app.celery_probe), which imports only this."""

from __future__ import annotations

from celery import Celery

import celeryconfig

MAX_RETRY_COUNTDOWN = 300  # the longest retry countdown of any task (embeddings), seconds


def visibility_timeout(time_limit: int) -> int:
    """Seconds before Redis hands a message taken by a worker to another one: above the longest a live
    task may hold its message (its time limit, or the longest retry countdown of a message waiting for
    its ETA), else a running task would be delivered twice; never below celeryconfig's 900 s. Without a
    time limit nothing bounds a task: the 900 s stand, and a task running longer is delivered again
    (leased jobs refuse the second delivery; unleased tasks are idempotent)."""
    default = int(celeryconfig.broker_transport_options["visibility_timeout"])
    return max(default, max(time_limit, MAX_RETRY_COUNTDOWN) + 60) if time_limit else default


def configure_broker(celery: Celery, config) -> None:
    """celeryconfig + the deployment's broker (REDIS_URL, CELERY_KEY_PREFIX) on `celery`; eager
    in-process execution without REDIS_URL. Shared by `init_celery` and `app.celery_probe` (the
    worker health check, which must not build the Flask app)."""
    celery.config_from_object(celeryconfig)
    redis_url = config.get("REDIS_URL")
    if redis_url:
        celery.conf.update(broker_url=redis_url, result_backend=redis_url,
                           task_always_eager=False, task_eager_propagates=False)
        # the time limits are settings (a test sets a tiny one); the visibility timeout stays above them
        hard, soft = int(config["CELERY_TASK_TIME_LIMIT"]), int(config["CELERY_TASK_SOFT_TIME_LIMIT"])
        if hard and soft and soft >= hard:
            raise RuntimeError(f"CELERY_TASK_SOFT_TIME_LIMIT ({soft}) must be below CELERY_TASK_TIME_LIMIT ({hard})")
        celery.conf.update(task_time_limit=hard or None, task_soft_time_limit=soft or None)
        transport = {**celeryconfig.broker_transport_options,
                     "visibility_timeout": visibility_timeout(hard or soft)}
        prefix = config.get("CELERY_KEY_PREFIX")
        if prefix:  # every queue, unacked and result key of this deployment lives under the prefix
            transport["global_keyprefix"] = prefix
            celery.conf.result_backend_transport_options = {
                **celeryconfig.result_backend_transport_options, "global_keyprefix": prefix}
        celery.conf.broker_transport_options = transport
    else:  # embedded default: no broker, tasks run in-process
        celery.conf.update(task_always_eager=True, task_eager_propagates=True,
                           broker_url="memory://", result_backend="cache+memory://")
