"""Celery entry point: `celery -A workers worker -Q default,analytics,embeddings,email,bulk,seed`."""

from __future__ import annotations

from celery.signals import worker_process_init, worker_ready

from app import create_app
from app.embedded_pg import SecondStateError
from app.extensions import celery_app, db
from app.tasks import start_maintenance_loop

try:
    flask_app = create_app()
except SecondStateError as exc:  # a configuration mistake, said plainly (no traceback)
    raise SystemExit(f"Error: {exc}") from None
celery = celery_app
app = celery_app  # `celery -A workers` looks for `app` or `celery`


@worker_process_init.connect
def _dispose_engine_after_fork(**_kwargs) -> None:
    """Connections inherited from the parent must not be shared with a forked child."""
    db.dispose()


@worker_ready.connect
def _start_maintenance(**_kwargs) -> None:
    """The worker's main process re-sends outbox tasks and re-queues orphaned jobs (app.tasks)."""
    start_maintenance_loop(flask_app, celery_app)
