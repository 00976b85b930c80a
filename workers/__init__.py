"""Celery entry point: `celery -A workers worker -Q default,analytics,embeddings,email,bulk,seed`."""

from __future__ import annotations

import os
import sys

from app.observability.metrics_process import forget_tree, prepare_tree, process_died

# A worker's processes share their metric files (app.observability.metrics_process): chosen before
# anything imports prometheus_client, and only by `celery ... worker` (not Flower or `celery inspect`,
# which load this module too).
_METRICS_DIR = prepare_tree("worker") if "worker" in sys.argv[1:] else None

from celery.signals import worker_process_init, worker_process_shutdown, worker_ready, worker_shutdown  # noqa: E402

from app import create_app  # noqa: E402
from app.embedded_pg import SecondStateError  # noqa: E402
from app.extensions import celery_app, db  # noqa: E402
from app.observability import metrics  # noqa: E402
from app.tasks import start_maintenance_loop  # noqa: E402

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
    """The worker's main process re-sends outbox tasks and re-queues orphaned jobs (app.tasks), and
    serves its processes' metrics (WORKER_METRICS_PORT)."""
    start_maintenance_loop(flask_app, celery_app)
    metrics.serve_worker(flask_app)


@worker_process_shutdown.connect
def _pool_child_exits(**_kwargs) -> None:
    """A pool child's live gauges stop counting when it exits."""
    process_died(os.getpid())


@worker_shutdown.connect
def _forget_metric_files(**_kwargs) -> None:
    forget_tree(_METRICS_DIR)
