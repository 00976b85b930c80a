"""gunicorn settings. Threaded workers: an image call blocks up to 120 s, and sync workers would
starve every other route while it waits; threads keep the process answering."""

import os

from app.observability.metrics_process import forget_tree, prepare_tree, process_died

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
worker_class = "app.serving.EnvelopeThreadWorker"  # gthread; gunicorn-level errors in the envelope
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Each worker must be able to hold every waiting image call by itself and still answer other routes:
# a gthread worker accepts connections beyond its thread count and queues them, and the kernel does
# not spread connections evenly over workers. Waiting threads cost memory, not CPU.
threads = int(os.environ.get("GUNICORN_THREADS", "128"))
# The image budget (IMAGE_TIMEOUT_SECONDS, 120 s by default) bounds the longest request. A worker silent
# for `timeout` is killed; on SIGTERM a worker stops listening at once (app.serving) and its accepted
# requests get `graceful_timeout` to finish: both outlast an image call. Compose's stop_grace_period for
# the api lies above graceful_timeout.
_image_budget = float(os.environ.get("IMAGE_TIMEOUT_SECONDS") or 120)
timeout = max(150, int(_image_budget) + 30)
graceful_timeout = int(_image_budget) + 10
# A pool that serves no image calls (deploy/kubernetes: the `gateway-api` Deployment; the image route has
# its own pool) drains within the contract's 30 s shutdown: GUNICORN_GRACEFUL_TIMEOUT overrides the above.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT") or graceful_timeout)
keepalive = 5
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms rid=%({x-request-id}o)s'
# gunicorn's logger; the access line computes only the atoms the format names (the same line). A set
# logger_class also stops gunicorn's automatic switch to its statsd logger when --statsd-host is given:
# statsd metrics need logger_class = "gunicorn.instrument.statsd.Statsd" (the full-atom line) instead.
logger_class = "app.serving.AccessLogger"
# gunicorn answers an over-long header or request line itself, before the app sees it (in the JSON
# envelope, through app.serving). The app has its own, tighter limits with more precise answers (an
# Authorization header over 8 KB is a 401), so gunicorn's ceilings sit above them: 64 KB per header
# field (431 beyond), the longest request line gunicorn supports (414 beyond).
limit_request_field_size = 65536
limit_request_line = 8190

# Metrics (app.observability): the master chooses and clears the directory where every worker writes its
# samples (PROMETHEUS_MULTIPROC_DIR, inherited by the workers) before any of them starts; a worker that
# exits stops counting in the live gauges; the directory goes with the master.
_metrics_dir = None


def on_starting(server):
    global _metrics_dir
    _metrics_dir = prepare_tree("api")


def child_exit(server, worker):
    process_died(worker.pid)


def on_exit(server):
    forget_tree(_metrics_dir)

def post_fork(server, worker):
    """Tracing (app.observability.tracing, on when OTEL_TRACES_EXPORTER names an exporter) is set up in
    each worker process after the fork: the span processor's export thread would not survive it."""
    from app.observability import tracing

    if tracing.configure("platform-gateway-api"):
        server.log.info("worker %s: tracing on (OTEL_TRACES_EXPORTER=%s)", worker.pid,
                        tracing.otel_environment().get("OTEL_TRACES_EXPORTER"))


def worker_exit(server, worker):
    """Write the samples the worker counted in memory since the last second, and export the spans still
    buffered, before the worker process exits."""
    from app.observability import metrics, tracing

    metrics.write_process_samples()
    tracing.shutdown()
