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
from app.observability import logs, metrics, tracing  # noqa: E402
from app.tasks import start_maintenance_loop  # noqa: E402

try:
    flask_app = create_app()
except SecondStateError as exc:  # a configuration mistake, said plainly (no traceback)
    raise SystemExit(f"Error: {exc}") from None
celery = celery_app
app = celery_app  # `celery -A workers` looks for `app` or `celery`
logs.install_celery(flask_app.config["LOG_FORMAT"])  # LOG_FORMAT=json: Celery's log lines too
SERVICE_NAME = "platform-gateway-worker"  # the traces' service.name unless OTEL_SERVICE_NAME says otherwise


@worker_process_init.connect
def _dispose_engine_after_fork(**_kwargs) -> None:
    """Connections inherited from the parent must not be shared with a forked child; tracing is set up
    in each pool process, after the fork (app.observability.tracing)."""
    db.dispose()
    tracing.configure(SERVICE_NAME)


@worker_process_shutdown.connect
def _export_spans(**_kwargs) -> None:
    """A pool process exits without atexit handlers: export its buffered spans first."""
    tracing.shutdown()


@worker_ready.connect
def _start_maintenance(sender=None, **_kwargs) -> None:
    """The worker's main process re-sends outbox tasks and re-queues orphaned jobs (app.tasks), and
    serves its processes' metrics (WORKER_METRICS_PORT). With a pool that does not fork (`-P solo`,
    `-P threads`), tasks run in this process: it traces everything. With the prefork pool it traces its
    Celery publishes only: a task the outbox dispatcher sends gets its publish span, child of the
    context the outbox row carries (request → outbox → publish → task run, one trace); its own SQL and
    its consumer's Redis polling make no spans."""
    prefork = "prefork" in type(getattr(sender, "pool", None) or object()).__module__
    tracing.configure(SERVICE_NAME, publisher_only=prefork)
    start_maintenance_loop(flask_app, celery_app)
    metrics.serve_worker(flask_app)


@worker_process_shutdown.connect
def _pool_child_exits(**_kwargs) -> None:
    """A pool child's live gauges stop counting when it exits."""
    process_died(os.getpid())


@worker_shutdown.connect
def _forget_metric_files(**_kwargs) -> None:
    forget_tree(_METRICS_DIR)
