"""Prometheus metrics: what the processes record, and the /metrics exposition.

Every family is named `gateway_*` and documented in docs/operations.md ("Metrics"). Three kinds:

- recorded by the process where the event happens (HTTP requests, upstream calls, the database pool,
  Redis errors, tasks, lease reaps): under gunicorn and Celery each process writes its samples to the
  files of its process tree (prometheus_client's multiprocess mode, app.observability.metrics_process),
  and the tree's exposition adds them up, so every gunicorn worker and Celery pool child is counted;
  in any other process (tests, CLI) they stay in this process's memory;
- read at scrape time from PostgreSQL and Redis (queue lengths, outbox backlog, analytics buffer,
  rollouts) by `DeploymentCollector`: one cheap statement or command each, time-bounded, at most every
  few seconds per process, never per request; only the API's /metrics reports them (they describe the
  deployment, not a process);
- labels are bounded: route templates (never the raw path), methods, status codes, task names, providers,
  queue names; values chosen by callers (an image or embedding model name) pass `bounded()`, and no
  organization, user or record id is ever a label.

The API serves /metrics (`init_app`); a Celery worker's main process serves its tree's samples on
WORKER_METRICS_PORT (`serve_worker`). Both answer only callers that present INTERNAL_API_TOKEN, as
`X-Internal-Token: <token>` or `Authorization: Bearer <token>` (what Prometheus sends from
`authorization: {credentials_file: ...}`).
"""

from __future__ import annotations

import bisect
import hmac
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from app.reqctx import current_g, current_request

log = logging.getLogger(__name__)

# One registry of this process's metrics (not prometheus_client's global one: nothing else registers
# here, and a second app in the process finds the same metrics).
REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 150.0)
_UPSTREAM_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 180.0)
_TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# -- HTTP ------------------------------------------------------------------------------------------------
HTTP_DURATION = Histogram(
    "gateway_http_request_duration_seconds", "Time from the first to the last hook of a request, by route "
    "template, method and status", ["route", "method", "status"], buckets=_LATENCY_BUCKETS, registry=REGISTRY)
HTTP_IN_FLIGHT = Gauge("gateway_http_requests_in_flight", "Requests being handled now (each process's count "
                       "as of the last second)",
                       multiprocess_mode="livesum", registry=REGISTRY)
HTTP_REFUSALS = Counter("gateway_http_refusals_total", "429, 413 and 415 answers by status and route group "
                        "(the Flask blueprint of the route)", ["status", "group"], registry=REGISTRY)
RATE_LIMITED = Counter("gateway_rate_limited_total", "Requests refused by a per-organization rate limit, by "
                       "rate-limit group", ["group"], registry=REGISTRY)

# -- upstreams -------------------------------------------------------------------------------------------
IMAGE_PROVIDER = Histogram(
    "gateway_image_provider_request_duration_seconds", "One image provider call (with its own retry), by "
    "provider, model family and outcome (ok or the error code answered)", ["provider", "model", "outcome"],
    buckets=_UPSTREAM_BUCKETS, registry=REGISTRY)
REFERENCE_FETCHES = Counter("gateway_image_reference_fetches_total", "Reference/mask image URL fetches by "
                            "outcome (ok, refused, error)", ["outcome"], registry=REGISTRY)
SMTP_DELIVERIES = Counter("gateway_smtp_deliveries_total", "SMTP deliveries by outcome (sent, retry: a "
                          "transient failure, failed)", ["outcome"], registry=REGISTRY)
EMBEDDING = Histogram("gateway_embedding_request_duration_seconds", "One embedding model call (a batch of "
                      "texts), by backend, model and outcome", ["backend", "model", "outcome"],
                      buckets=_LATENCY_BUCKETS, registry=REGISTRY)

# -- PostgreSQL and Redis --------------------------------------------------------------------------------
DB_POOL_IN_USE = Gauge("gateway_db_pool_connections_in_use", "Pooled PostgreSQL connections checked out (each "
                       "process's count as of the last second)",
                       multiprocess_mode="livesum", registry=REGISTRY)
DB_POOL_WAITING = Gauge("gateway_db_pool_waiting", "Threads waiting for a pooled PostgreSQL connection (the "
                        "pool is exhausted)", multiprocess_mode="livesum", registry=REGISTRY)
REDIS_ERRORS = Counter("gateway_redis_errors_total", "Redis calls that failed, by component (rate_limit, "
                       "analytics_buffer, broker)", ["component"], registry=REGISTRY)
DB_REPLICA_FALLBACKS = Counter("gateway_db_replica_fallbacks_total", "Lag-tolerant reads (dashboards) the primary "
                               "served instead of the read replica, by reason (down, lag, conflict)", ["reason"],
                               registry=REGISTRY)
RATE_LIMIT_FALLBACK = Gauge("gateway_rate_limit_fallback", "1 while a process counts rate and concurrency "
                            "limits in-process because Redis failed (max over the processes)",
                            multiprocess_mode="livemax", registry=REGISTRY)

# -- jobs ------------------------------------------------------------------------------------------------
TASK_DURATION = Histogram("gateway_task_duration_seconds", "Celery task runs by task and final state "
                          "(SUCCESS, FAILURE, RETRY)", ["task", "state"], buckets=_TASK_BUCKETS, registry=REGISTRY)
TASK_FAILURES = Counter("gateway_task_failures_total", "Celery task runs that raised (retries not counted)",
                        ["task"], registry=REGISTRY)
TASK_RETRIES = Counter("gateway_task_retries_total", "Celery task retries scheduled", ["task"], registry=REGISTRY)
LEASE_REAPS = Counter("gateway_lease_reaps_total", "Jobs a lease reaper sent again because their worker was "
                      "lost, by job kind", ["kind"], registry=REGISTRY)

SMTP_OUTCOMES = ("sent", "retry", "failed")
FETCH_OUTCOMES = ("ok", "refused", "error")
REDIS_COMPONENTS = ("rate_limit", "analytics_buffer", "broker")
REPLICA_FALLBACK_REASONS = ("down", "lag", "conflict")
REFUSAL_STATUSES = frozenset({413, 415, 429})
# The lease reapers of app.lease_reapers, by qualified name → the kind of job they re-queue.
REAPER_KINDS = {
    "app.entities.bulk.requeue_orphaned_jobs": "entity_bulk",
    "app.analytics.tasks.reap_stalled_buffer": "analytics_batch",
    "app.email.bulk.requeue_stalled_jobs": "email_bulk",
    "app.embeddings.jobs.requeue_stalled_jobs": "embedding",
    "app.ops.rollout.requeue_stalled_rollouts": "rollout",
    "app.ops.seed_jobs.requeue_stalled_seed_jobs": "seed",
}
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

_state = {"enabled": False}


def enabled() -> bool:
    return _state["enabled"]


# -- bounded labels --------------------------------------------------------------------------------------
MAX_LABEL_VALUES = 20
_seen: dict[str, set[str]] = {}
_seen_lock = threading.Lock()


def bounded(kind: str, value: str) -> str:
    """`value` as a label of `kind`, or "other" once this process has seen MAX_LABEL_VALUES others: a
    value a caller chooses (a model name) can never grow a family without bound."""
    seen = _seen.get(kind)
    if seen is not None and value in seen:
        return value
    with _seen_lock:
        seen = _seen.setdefault(kind, set())
        if value in seen or len(seen) < MAX_LABEL_VALUES:
            seen.add(value)
            return value
    return "other"


# -- recording helpers (the call sites' one line each) ---------------------------------------------------

def observe_image_call(provider: str, model: str, outcome: str, seconds: float) -> None:
    if _state["enabled"]:
        IMAGE_PROVIDER.labels(provider, bounded("image_model", model), outcome).observe(seconds)


def count_reference_fetch(outcome: str) -> None:
    if _state["enabled"]:
        REFERENCE_FETCHES.labels(outcome).inc()


def count_smtp(outcome: str) -> None:
    if _state["enabled"]:
        SMTP_DELIVERIES.labels(outcome if outcome in SMTP_OUTCOMES else "failed").inc()


def observe_embedding(backend: str, model: str, outcome: str, seconds: float) -> None:
    if _state["enabled"]:
        EMBEDDING.labels(backend, bounded("embedding_model", model), outcome).observe(seconds)


def count_redis_error(component: str) -> None:
    if _state["enabled"]:
        REDIS_ERRORS.labels(component).inc()


def rate_limit_fallback(active: bool) -> None:
    if _state["enabled"]:
        RATE_LIMIT_FALLBACK.set(1 if active else 0)


def count_rate_limited(group: str) -> None:
    if _state["enabled"]:
        RATE_LIMITED.labels(group).inc()


def pool_waiting(delta: int) -> None:
    if _state["enabled"]:
        DB_POOL_WAITING.inc(delta)


def count_replica_fallback(reason: str) -> None:
    if _state["enabled"]:
        DB_REPLICA_FALLBACKS.labels(reason).inc()


def preset_replica() -> None:
    """A deployment with a read replica shows its fallback counter at 0 from the start."""
    for reason in REPLICA_FALLBACK_REASONS:
        DB_REPLICA_FALLBACKS.labels(reason)


def count_reaps(reaper: Callable[[], int], requeued: int) -> None:
    """What one lease reaper of app.lease_reapers sent again, in gateway_lease_reaps_total{kind}."""
    if requeued and _state["enabled"]:
        kind = REAPER_KINDS.get(f"{reaper.__module__}.{reaper.__name__}", reaper.__name__)
        LEASE_REAPS.labels(kind).inc(requeued)


def _preset(kinds: Iterable[str]) -> None:
    """Label sets known in advance start at 0, so a family exists (and rate() works) before its first event."""
    for outcome in SMTP_OUTCOMES:
        SMTP_DELIVERIES.labels(outcome)
    for outcome in FETCH_OUTCOMES:
        REFERENCE_FETCHES.labels(outcome)
    for component in REDIS_COMPONENTS:
        REDIS_ERRORS.labels(component)
    for kind in kinds:
        LEASE_REAPS.labels(kind)


# -- what a request records: counted in memory, written once a second ---------------------------------------
# A request changes the in-flight gauge twice, the pool's in-use gauge twice (checkout, checkin) and the
# duration histogram once (its sum and one bucket). Writing each change to the metric files costs a lock,
# a pid check and an mmap write (~9 000 instructions each), and Flask's `g`/`request` proxies cost a few
# thousand per access: together ~6 % of a record GET. So each process counts in memory (one lock, a
# few integer additions per request) and a daemon thread (`_Recorder`) writes what changed every
# SAMPLE_SECONDS; a scrape first writes its own process's, and a gunicorn worker writes its last counts
# when it exits. A scrape thus sees every other process's samples as of the last second: the gauges are
# samples anyway, and the histogram's counters reach Prometheus at most a second late.
SAMPLE_SECONDS = 1.0
_BOUNDS = HTTP_DURATION._upper_bounds  # the histogram's bucket bounds, +Inf last


class _Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        # (route, method, status) → [sum of seconds, count of bucket 0, bucket 1, …] since the last write
        self.pending: dict[tuple, list] = {}
        self.engines: weakref.WeakSet = weakref.WeakSet()  # this process's metered engines
        self.thread: threading.Thread | None = None
        self.written: tuple[int, int] | None = None

    def ensure_running(self) -> None:
        """Start this process's writer thread (once per process: a forked child starts its own)."""
        if self.thread is not None:
            return
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while self.thread is me:  # after a fork the child has another (or none)
            time.sleep(SAMPLE_SECONDS)
            try:
                self.write()
            except Exception:  # a failed write never ends the process's metrics thread
                log.warning("metrics: writing this process's samples failed", exc_info=True)

    def observe(self, key: tuple, seconds: float) -> None:
        index = bisect.bisect_left(_BOUNDS, seconds)  # the first bucket whose bound is >= seconds
        with self.lock:
            slot = self.pending.get(key)
            if slot is None:
                slot = self.pending[key] = [0.0] + [0] * len(_BOUNDS)
            slot[0] += seconds
            slot[index + 1] += 1

    def write(self, force: bool = False) -> None:
        """Write the durations observed since the last write and the in-flight and in-use counts (when
        they changed, or `force`)."""
        with self.lock:
            pending, self.pending = self.pending, {}
        for key, slot in pending.items():
            child = _http_children.get(key)
            if child is None:
                child = _http_children[key] = HTTP_DURATION.labels(key[0], key[1], str(key[2]))
            child._sum.inc(slot[0])  # what Histogram.observe does, for many observations at once
            for index, count in enumerate(slot[1:]):
                if count:
                    child._buckets[index].inc(count)
        in_use = 0
        for engine in list(self.engines):
            in_use += engine.pool.checkedout()
        values = (self.in_flight, in_use)
        if force or values != self.written:
            HTTP_IN_FLIGHT.set(values[0])
            DB_POOL_IN_USE.set(values[1])
            self.written = values

    def after_fork(self) -> None:
        """In a forked child: its own counts, lock and thread (the parent's thread does not exist here)."""
        self.lock = threading.Lock()
        self.in_flight = 0
        self.pending = {}
        self.thread = None
        self.written = None


_recorder = _Recorder()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_recorder.after_fork)
# (route, method, status) → the histogram's child (bounded like the labels)
_http_children: dict[tuple, Any] = {}


def write_process_samples() -> None:
    """Write what this process counted in memory now (a scrape; a gunicorn worker that exits)."""
    if _state["enabled"]:
        _recorder.write(force=True)


def watch_pool(engine) -> None:
    """Count `engine`'s checked-out connections in gateway_db_pool_connections_in_use (app.db, with
    METRICS_ENABLED): read once a second by the writer thread, nothing per checkout."""
    _recorder.engines.add(engine)


# -- HTTP hooks ------------------------------------------------------------------------------------------
_KEY = "_metrics_started"


def _request_started() -> None:
    setattr(current_g(), _KEY, time.perf_counter())
    recorder = _recorder
    with recorder.lock:
        recorder.in_flight += 1
    if recorder.thread is None:
        recorder.ensure_running()


def _request_finished(response):
    started = getattr(current_g(), _KEY, None)
    if started is not None:
        req = current_request()
        rule = req.url_rule
        method = req.method
        status = response.status_code
        _recorder.observe((rule.rule if rule is not None else "unmatched", method if method in _METHODS else "other",
                           status), time.perf_counter() - started)
        if status in REFUSAL_STATUSES:
            HTTP_REFUSALS.labels(str(status), req.blueprint or "none").inc()
    return response


def _request_torn_down(_exc=None) -> None:
    if current_g().pop(_KEY, None) is not None:  # (the request was counted in flight by this app's hook)
        recorder = _recorder
        with recorder.lock:
            recorder.in_flight -= 1


# -- Celery signals --------------------------------------------------------------------------------------
_task_started: dict[str, float] = {}


def _task_prerun(task_id=None, task=None, **_kwargs) -> None:
    if _recorder.thread is None and _recorder.engines and _state["enabled"]:
        _recorder.ensure_running()  # a pool process's connections in use
    if task_id:
        _task_started[task_id] = time.perf_counter()


def _task_postrun(task_id=None, task=None, state=None, **_kwargs) -> None:
    started = _task_started.pop(task_id, None) if task_id else None
    if started is not None and task is not None and _state["enabled"]:
        TASK_DURATION.labels(task.name, state or "UNKNOWN").observe(time.perf_counter() - started)


def _task_failure(sender=None, **_kwargs) -> None:
    if sender is not None and _state["enabled"]:
        TASK_FAILURES.labels(sender.name).inc()


def _task_retry(sender=None, **_kwargs) -> None:
    if sender is not None and _state["enabled"]:
        TASK_RETRIES.labels(sender.name).inc()


def _connect_task_signals(task_names: Iterable[str]) -> None:
    from celery.signals import task_failure, task_postrun, task_prerun, task_retry

    # idempotent (dispatch_uid): several apps in one process count a task once
    task_prerun.connect(_task_prerun, weak=False, dispatch_uid="gateway.metrics.prerun")
    task_postrun.connect(_task_postrun, weak=False, dispatch_uid="gateway.metrics.postrun")
    task_failure.connect(_task_failure, weak=False, dispatch_uid="gateway.metrics.failure")
    task_retry.connect(_task_retry, weak=False, dispatch_uid="gateway.metrics.retry")
    for name in task_names:
        TASK_FAILURES.labels(name)
        TASK_RETRIES.labels(name)


# -- what a scrape reads from PostgreSQL and Redis -------------------------------------------------------

class DeploymentCollector:
    """Gauges of the deployment read at scrape time by `sources` (name → function, given by create_app):

    - `queues() -> {queue: messages waiting}`
    - `outbox() -> (rows, age of the oldest in seconds)`
    - `analytics() -> (events waiting, age of the oldest in seconds)`
    - `rollouts() -> (rollouts pending or running, orgs they cover, orgs done)`
    - `replica() -> (seconds, bytes the read replica is behind)` (only with DATABASE_REPLICA_URL)

    Each source bounds its own time (a statement timeout, a Redis socket timeout); a failing source is
    reported as gateway_metrics_source_up{source} 0 and the others still answer. Results are kept for
    CACHE_SECONDS, so scrapers arriving together cost one round of queries per process."""

    CACHE_SECONDS = 5.0

    def __init__(self, app: Flask, sources: dict[str, Callable[[], Any]]) -> None:
        self.app = app
        self.sources = sources
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None

    def describe(self):
        return []  # nothing is queried when the collector is registered

    def collect(self):
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > self.CACHE_SECONDS:
                self._cached = (now, self._read())
            return list(self._cached[1])

    def _read(self) -> list:
        up = GaugeMetricFamily("gateway_metrics_source_up", "1 when the last scrape-time read of a source "
                               "(queues, outbox, analytics, rollouts) succeeded", labels=["source"])
        families: list = []
        for name, source in self.sources.items():
            try:
                with self.app.app_context():
                    value = source()
                families.extend(_FAMILIES[name](value))
                up.add_metric([name], 1)
            except Exception as exc:  # one source down (Redis, PostgreSQL) never hides the others
                log.warning("metrics: reading %s failed (%s: %s)", name, type(exc).__name__, exc)
                up.add_metric([name], 0)
        return [*families, up]


def _queue_families(lengths: dict[str, int]):
    family = GaugeMetricFamily("gateway_queue_length", "Messages waiting in a Celery queue (Redis list)",
                               labels=["queue"])
    for queue, length in sorted(lengths.items()):
        family.add_metric([queue], length)
    return [family]


def _outbox_families(value: tuple[int, float]):
    rows, age = value
    return [GaugeMetricFamily("gateway_outbox_backlog_rows", "Task outbox rows not sent to the broker yet",
                              value=rows),
            GaugeMetricFamily("gateway_outbox_oldest_age_seconds", "Age of the oldest unsent outbox row (0 when "
                              "none)", value=age)]


def _analytics_families(value: tuple[int, float]):
    events, age = value
    return [GaugeMetricFamily("gateway_analytics_buffer_events", "Analytics events waiting in the Redis buffer "
                              "or in flight", value=events),
            GaugeMetricFamily("gateway_analytics_buffer_oldest_age_seconds", "How long the oldest waiting "
                              "analytics event has waited (an upper bound; 0 when none)", value=age)]


def _rollout_families(value: tuple[int, int, int]):
    active, total, done = value
    return [GaugeMetricFamily("gateway_rollouts_active", "Rollouts pending or running", value=active),
            GaugeMetricFamily("gateway_rollout_orgs_total", "Orgs the active rollouts cover", value=total),
            GaugeMetricFamily("gateway_rollout_orgs_done", "Orgs the active rollouts have handled", value=done)]


def _replica_families(value: tuple[float, int]):
    seconds, lag_bytes = value
    return [GaugeMetricFamily("gateway_db_replica_lag_seconds", "How long ago the last transaction the read "
                              "replica has replayed committed, while it has WAL of the primary left to replay "
                              "(0 when caught up)", value=seconds),
            GaugeMetricFamily("gateway_db_replica_lag_bytes", "WAL of the primary the read replica has not "
                              "replayed yet", value=lag_bytes)]


_FAMILIES = {"queues": _queue_families, "outbox": _outbox_families, "analytics": _analytics_families,
             "rollouts": _rollout_families, "replica": _replica_families}


# -- exposition ------------------------------------------------------------------------------------------

def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _registry(extra=()) -> CollectorRegistry:
    """This process tree's samples (every process's files in multiprocess mode; this process's memory
    otherwise) plus `extra` collectors."""
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Delegate(REGISTRY))
    for collector in extra:
        registry.register(collector)
    return registry


class _Delegate:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def describe(self):
        return []

    def collect(self):
        return self.registry.collect()


def token_accepted(expected: str, internal_header: str | None, authorization: str | None) -> bool:
    """INTERNAL_API_TOKEN as X-Internal-Token or as a Bearer token; never with no token configured."""
    if not expected:
        return False
    sent = internal_header
    if sent is None and authorization:
        scheme, _, credentials = authorization.partition(" ")
        sent = credentials.strip() if scheme.lower() == "bearer" else None
    return sent is not None and hmac.compare_digest(sent.encode(), expected.encode())


def _metrics_view():
    from app.errors import Unauthorized

    expected = current_app.config.get("INTERNAL_API_TOKEN") or ""
    if not expected:
        raise Unauthorized("Metrics are closed: INTERNAL_API_TOKEN is not set on this deployment.")
    if not token_accepted(expected, request.headers.get("X-Internal-Token"), request.headers.get("Authorization")):
        raise Unauthorized("X-Internal-Token (or Authorization: Bearer) with the internal token is required.")
    collector = current_app.extensions.get("metrics_deployment")
    _recorder.write(force=True)  # this process's samples as of now (the others': as of the last second)
    body = generate_latest(_registry([collector] if collector is not None else []))
    return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"})


def init_app(app: Flask, sources: dict[str, Callable[[], Any]] | None = None, task_names: Iterable[str] = ()) -> None:
    """Install the request hooks, the task signals and GET /metrics on `app` (METRICS_ENABLED).
    Called by create_app before any other request hook, so the duration covers the whole pipeline and
    the status is the one sent (after every other after_request)."""
    if not app.config.get("METRICS_ENABLED", True):
        return  # (another app of this process may record: tests build several)
    _state["enabled"] = True
    _preset(REAPER_KINDS.values())
    app.before_request(_request_started)
    app.after_request(_request_finished)
    app.teardown_request(_request_torn_down)
    _connect_task_signals(task_names)
    if sources:
        app.extensions["metrics_deployment"] = DeploymentCollector(app, sources)
    app.add_url_rule("/metrics", "metrics", _metrics_view, methods=["GET"])


# -- a Celery worker's endpoint --------------------------------------------------------------------------

WORKER_METRICS_PORT_SPAN = 10  # ports tried from WORKER_METRICS_PORT on

def serve_worker(app: Flask):
    """Serve this worker tree's samples on WORKER_METRICS_PORT (all interfaces; 0 = off) from the
    worker's main process, in a thread. A port in use is logged, not fatal: the worker still works.
    Returns the server (or None)."""
    port = int(app.config.get("WORKER_METRICS_PORT") or 0)
    if not app.config.get("METRICS_ENABLED", True) or port <= 0:
        return None
    from wsgiref.simple_server import make_server

    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    expected = app.config.get("INTERNAL_API_TOKEN") or ""

    def wsgi(environ, start_response):
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: the worker serves /metrics only\n"]
        if not token_accepted(expected, environ.get("HTTP_X_INTERNAL_TOKEN"), environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("Content-Type", "text/plain")])
            return [b"the internal token is required (INTERNAL_API_TOKEN)\n"]
        _recorder.write(force=True)
        body = generate_latest(_registry())
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

    # Several workers on one host (the local stack runs two) cannot share a port: the next free one of
    # WORKER_METRICS_PORT .. +9 is taken and logged; in a container each worker has the port to itself.
    server, error = None, None
    for candidate in range(port, port + WORKER_METRICS_PORT_SPAN):
        try:
            server = make_server("0.0.0.0", candidate, wsgi, ThreadingWSGIServer, handler_class=_SilentHandler)
            break
        except OSError as exc:
            error = exc
    if server is None:
        log.warning("worker metrics not served: ports %s-%s unavailable (%s)", port,
                    port + WORKER_METRICS_PORT_SPAN - 1, error)
        return None
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    log.info("worker metrics on :%s/metrics", server.server_port)
    return server
