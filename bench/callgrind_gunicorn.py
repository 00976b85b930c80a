"""gunicorn settings for a server measured under callgrind (bench.callgrind): docker/gunicorn.conf.py as the
Procfile runs it, plus the signals that start and end a measured window in each worker."""

import os

from bench import callgrind

_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docker", "gunicorn.conf.py")
with open(_CONF) as _fh:
    exec(compile(_fh.read(), _CONF, "exec"))  # noqa: S102 - the shipped settings, unchanged

_shipped_post_worker_init = globals().get("post_worker_init")


def post_worker_init(worker):  # noqa: F811
    if _shipped_post_worker_init is not None:
        _shipped_post_worker_init(worker)
    # the spans of the requests before the window are exported before it, the window's own in it
    callgrind.install_signals(os.environ.get("BENCH_CALLGRIND_MARKER"), flush=_export_spans)


def _export_spans():
    from app.observability import tracing

    if tracing.ENABLED and tracing._provider is not None:
        tracing._provider.force_flush(120_000)  # callgrind is slow: far beyond the 5 s of a worker's exit
