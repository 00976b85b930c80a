"""The deployment's broker settings on a Celery app, shared by every process: the API and the worker
(app.tasks.init_celery) and the worker health check (app.celery_probe), which imports only this."""

from __future__ import annotations

from celery import Celery

import celeryconfig


def configure_broker(celery: Celery, config) -> None:
    """celeryconfig + the deployment's broker (REDIS_URL, CELERY_KEY_PREFIX) on `celery`; eager
    in-process execution without REDIS_URL. Shared by `init_celery` and `app.celery_probe` (the
    worker health check, which must not build the Flask app)."""
    celery.config_from_object(celeryconfig)
    redis_url = config.get("REDIS_URL")
    if redis_url:
        celery.conf.update(broker_url=redis_url, result_backend=redis_url,
                           task_always_eager=False, task_eager_propagates=False)
        prefix = config.get("CELERY_KEY_PREFIX")
        if prefix:  # every queue, unacked and result key of this deployment lives under the prefix
            celery.conf.broker_transport_options = {**celeryconfig.broker_transport_options,
                                                    "global_keyprefix": prefix}
            celery.conf.result_backend_transport_options = {
                **celeryconfig.result_backend_transport_options, "global_keyprefix": prefix}
        # the time limits are settings (a test sets a tiny one); the visibility timeout stays above them
        celery.conf.update(task_time_limit=int(config["CELERY_TASK_TIME_LIMIT"]) or None,
                           task_soft_time_limit=int(config["CELERY_TASK_SOFT_TIME_LIMIT"]) or None)
    else:  # embedded default: no broker, tasks run in-process
        celery.conf.update(task_always_eager=True, task_eager_propagates=True,
                           broker_url="memory://", result_backend="cache+memory://")
