"""Where the processes of one server share their metric files (prometheus_client's multiprocess mode).

A gunicorn master and its workers, or a Celery worker and its pool children, are one *process tree*:
every process of the tree writes its samples to files in one directory (PROMETHEUS_MULTIPROC_DIR in the
environment, which prometheus_client reads when it is first imported), and the tree's /metrics adds
them up. The tree's first process (`prepare_tree`, before anything imports prometheus_client) chooses
the directory and clears it:

- PROMETHEUS_MULTIPROC_DIR set in the environment (one server per container, as the image runs): that
  directory, emptied at start;
- otherwise `<setting PROMETHEUS_MULTIPROC_DIR, default VAR_DIR/metrics>/<role>-<pid>`, so that several
  servers on one machine (the local stack: two API processes, two workers) never mix or wipe each
  other's files; directories of trees whose first process is gone are removed at the next start.

This module imports nothing but the standard library and app.config: it runs before our metrics exist.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from app.config import load_config

ENV = "PROMETHEUS_MULTIPROC_DIR"
_TREE_DIR = re.compile(r"^(api|worker)-(\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _empty(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def prepare_tree(role: str, config: dict | None = None) -> str | None:
    """Choose and clear the metric directory of this process tree (`role`: "api" or "worker") and put
    it in the environment its children inherit. Returns the directory, or None with METRICS_ENABLED off
    (prometheus_client then keeps each process's samples in memory and nothing is written)."""
    config = config if config is not None else load_config()
    if not config.get("METRICS_ENABLED", True):
        os.environ.pop(ENV, None)
        return None
    explicit = os.environ.get(ENV)
    if explicit:
        os.makedirs(explicit, exist_ok=True)
        _empty(explicit)
        _switch_loaded_client()
        return explicit
    base = config.get("PROMETHEUS_MULTIPROC_DIR") or os.path.join(config["VAR_DIR"], "metrics")
    os.makedirs(base, exist_ok=True)
    for name in os.listdir(base):  # trees that ended without cleaning up (kill -9, a crash)
        match = _TREE_DIR.match(name)
        if match and not _alive(int(match.group(2))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    directory = os.path.join(base, f"{role}-{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    _empty(directory)
    os.environ[ENV] = directory
    _switch_loaded_client()
    return directory


def _switch_loaded_client() -> None:
    """prometheus_client picks its value class (memory or files) when it is first imported, from the
    environment. The `celery` command loads Flower's command plugin, which imports prometheus_client
    before any module of ours runs: pick again, so every metric made from now on writes to the files
    (a metric takes the class when its first sample is made)."""
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        values.ValueClass = values.get_value_class()


def forget_tree(directory: str | None) -> None:
    """At the tree's clean exit: remove a directory `prepare_tree` derived (an explicit one is kept)."""
    if directory and _TREE_DIR.match(os.path.basename(directory)):
        shutil.rmtree(directory, ignore_errors=True)


def process_died(pid: int) -> None:
    """A process of the tree exited: its live gauges (in flight, pool in use) stop counting."""
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
