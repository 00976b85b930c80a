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
    callgrind.install_signals(os.environ.get("BENCH_CALLGRIND_MARKER"))
