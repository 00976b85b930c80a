"""A real Prometheus (Debian's `prometheus`) scrapes the API under gunicorn (docker/gunicorn.conf.py, two
workers: multiprocess mode) and a real Celery worker (its main process serves WORKER_METRICS_PORT),
with the internal token as Prometheus sends it (`authorization: credentials_file`), evaluates the
shipped alert rules (docker/prometheus/alerts.yml), and a PromQL query returns every metric family
docs/operations.md lists. The traffic before the scrape makes the families carry real events: HTTP
requests, a 429, a 413 and a 415, an image call to a fake provider, an async bulk job and an embedding
job run by the worker against a fake embeddings upstream.

Skipped when the `prometheus` binary is missing, unless REQUIRE_SERVICES=1 (then it fails)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.conftest import (
    BIN,
    REQUIRE_SERVICES,
    ROOT,
    TEST_SECRET,
    TEST_VAR_DIR,
    dies_with_parent,
    start_worker,
    stop_worker,
    wait_for,
)
from tests.fake_embeddings_server import FakeEmbeddingsServer
from tests.images_fakes import FakeAzureImages
from tests.support import token

TOKEN = "prom-internal-" + "p" * 32
SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
# every family of docs/operations.md "Metrics" (a histogram by its _count series) but the read replica's
# (gateway_db_replica_lag_seconds, _lag_bytes, _fallbacks_total: only an API with DATABASE_REPLICA_URL has
# them, and this one has none; tests/deploy/test_replica.py checks them on a stack with a replica)
FAMILIES = [
    "gateway_http_request_duration_seconds_count", "gateway_http_requests_in_flight", "gateway_http_refusals_total",
    "gateway_rate_limited_total", "gateway_image_provider_request_duration_seconds_count",
    "gateway_image_reference_fetches_total", "gateway_smtp_deliveries_total",
    "gateway_embedding_request_duration_seconds_count", "gateway_db_pool_connections_in_use", "gateway_db_pool_waiting",
    "gateway_redis_errors_total", "gateway_rate_limit_fallback", "gateway_task_duration_seconds_count",
    "gateway_task_failures_total", "gateway_task_retries_total", "gateway_queue_length", "gateway_outbox_backlog_rows",
    "gateway_outbox_oldest_age_seconds", "gateway_lease_reaps_total", "gateway_analytics_buffer_events",
    "gateway_analytics_buffer_oldest_age_seconds", "gateway_rollouts_active", "gateway_rollout_orgs_total",
    "gateway_rollout_orgs_done", "gateway_metrics_source_up",
]


def _prometheus() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        message = "prometheus not installed (apt-get install prometheus; .ci/run installs it)"
        if REQUIRE_SERVICES:
            pytest.fail(message)
        pytest.skip(message)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body=None, headers=None, data: bytes | None = None):
    headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw[:1] in (b"{", b"[") else raw


def _stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def fakes():
    images, embeddings = FakeAzureImages(), FakeEmbeddingsServer(api_key="sk-metrics")
    embeddings.__enter__()
    yield images, embeddings
    images.close()
    embeddings.__exit__(None, None, None)


@pytest.fixture(scope="module")
def stack(app, database_url, redis_url, fakes, tmp_path_factory):
    """gunicorn (the API) + a Celery worker + Prometheus scraping both every second."""
    prometheus = _prometheus()
    images, embeddings = fakes
    work = tmp_path_factory.mktemp("prometheus")
    # a key prefix of its own: the session's worker (other settings: no fake embeddings upstream) must not
    # take this test's tasks
    prefix = f"test-metrics-{uuid.uuid4().hex[:8]}:"
    settings = {
        "DATABASE_URL": database_url, "REDIS_URL": redis_url, "CELERY_KEY_PREFIX": prefix,
        "JWT_SECRET": TEST_SECRET, "INTERNAL_API_TOKEN": TOKEN, "VAR_DIR": TEST_VAR_DIR, "LOG_LEVEL": "WARNING",
        "PUBLIC_BASE_URL": "http://gateway.test", "RATE_LIMIT_AGGREGATE": "1/60", "MAX_CONTENT_LENGTH": "4096",
        "PROVIDER_A_ENDPOINT": images.url, "PROVIDER_A_API_KEY": FakeAzureImages.API_KEY,
        "PROVIDER_A_API_VERSION": FakeAzureImages.GENERATION_VERSION,
        "PROVIDER_A_EDIT_API_VERSION": FakeAzureImages.EDIT_VERSION,
        "EMBEDDINGS_BACKEND": "openai", "EMBEDDINGS_ENDPOINT": embeddings.base_url,
        "EMBEDDINGS_API_KEY": embeddings.api_key, "EMBEDDINGS_MODEL": "text-embedding-3-small",
    }
    api_port, worker_port, prom_port = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(settings, PORT=str(api_port), WEB_CONCURRENCY="2", GUNICORN_THREADS="8")
    log_path = os.path.join(TEST_VAR_DIR, "metrics-gunicorn.log")
    os.makedirs(TEST_VAR_DIR, exist_ok=True)
    with open(log_path, "w") as log:
        api = subprocess.Popen([os.path.join(BIN, "gunicorn"), "-c", os.path.join(ROOT, "docker", "gunicorn.conf.py"),
                                "--bind", f"127.0.0.1:{api_port}", "wsgi:app"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=dies_with_parent)
    worker = prom = None
    try:
        base = f"http://127.0.0.1:{api_port}"
        wait_for(lambda: api.poll() is None and _health(base), timeout=90, what=f"gunicorn up (log {log_path})")
        # this process's Celery app pings the worker: bound to the prefix while it starts (as make_app does)
        from app import create_app
        from app.extensions import celery_app
        from app.tasks import init_celery
        from tests.conftest import app_config

        prefixed = create_app(app_config(database_url, CELERY_KEY_PREFIX=prefix))
        try:
            worker = start_worker(database_url, redis_url, prefix=prefix, log_name="metrics-worker.log",
                                  extra_env={**settings, "WORKER_METRICS_PORT": str(worker_port)})
        finally:
            init_celery(celery_app, app)
            prefixed.extensions["db"].engine.dispose()
        (work / "token").write_text(TOKEN)
        (work / "alerts.yml").write_text(open(os.path.join(ROOT, "docker", "prometheus", "alerts.yml")).read())
        (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: gateway-api
    authorization: {{type: Bearer, credentials_file: {work / 'token'}}}
    static_configs: [{{targets: ["127.0.0.1:{api_port}"]}}]
  - job_name: gateway-worker
    authorization: {{type: Bearer, credentials_file: {work / 'token'}}}
    static_configs: [{{targets: ["127.0.0.1:{worker_port}"]}}]
""")
        with open(work / "prometheus.log", "w") as log:
            prom = subprocess.Popen([prometheus, f"--config.file={work / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={work / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                                    cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=dies_with_parent)
        yield {"api": base, "prometheus": f"http://127.0.0.1:{prom_port}", "worker_port": worker_port,
               "embeddings": embeddings, "log": str(work / "prometheus.log")}
    finally:
        if prom is not None:
            _stop_group(prom)
        if worker is not None:
            stop_worker(worker)
        _stop_group(api)


def _health(base: str) -> bool:
    try:
        return _http("GET", f"{base}/health")[0] == 200
    except OSError:
        return False


def _query(prometheus: str, promql: str) -> list:
    status, body = _http("GET", f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert status == 200 and body["status"] == "success", body
    return body["data"]["result"]


def test_the_worker_endpoint_is_closed_without_the_token(stack):
    url = f"http://127.0.0.1:{stack['worker_port']}/metrics"
    assert _http("GET", url)[0] == 401
    assert _http("GET", url, headers={"Authorization": "Bearer wrong"})[0] == 401
    status, body = _http("GET", url, headers={"X-Internal-Token": TOKEN})
    assert status == 200 and b"gateway_task_failures_total" in body


def test_prometheus_scrapes_every_family_and_loads_the_alert_rules(stack):
    base, prometheus = stack["api"], stack["prometheus"]
    org = f"org-{uuid.uuid4().hex[:12]}"
    headers = {"Authorization": f"Bearer {token(scopes=('read', 'write', 'write:image-gen'), org=org)}"}
    entities = f"{base}/api/v1/entities"
    status, _ = _http("POST", f"{entities}/definitions", {"name": "things", "displayName": "Things", "schema": SCHEMA,
                                                          "embeddingsConfig": {"enabled": True, "fields": ["body"]}},
                      headers)
    assert status == 201
    status, record = _http("POST", f"{entities}/things/records", {"fields": {"body": "a red bicycle", "n": 1}},
                           headers)
    assert status == 201
    for _ in range(5):
        assert _http("GET", f"{entities}/things/records/{record['id']}", headers=headers)[0] == 200
    aggregate = {"aggregates": [{"function": "sum", "field": "n"}]}
    assert _http("POST", f"{entities}/things/records/aggregate", aggregate, headers)[0] == 200
    assert _http("POST", f"{entities}/things/records/aggregate", aggregate, headers)[0] == 429
    assert _http("POST", f"{entities}/things/records", {"fields": {"body": "x" * 8000}}, headers)[0] == 413
    assert _http("POST", f"{entities}/things/records", headers={**headers, "Content-Type": "text/plain"},
                 data=b"n=1")[0] == 415
    image = {"prompt": "a red bicycle", "provider": "provider-a", "model": "gpt-image-1"}
    assert _http("POST", f"{base}/api/v1/agents/images", image, headers)[0] == 200
    status, job = _http("POST", f"{entities}/things/records/bulk/create", {"records": [{"fields": {"n": 2}}]},
                        {**headers, "Prefer": "respond-async"})
    assert status == 202
    wait_for(lambda: stack["embeddings"].requests, timeout=60, what="the worker called the embeddings upstream")

    missing = FAMILIES
    def every_family_answers():
        nonlocal missing
        missing = [family for family in missing if not _query(prometheus, family)]
        return not missing
    wait_for(every_family_answers, timeout=90, interval=1, what=f"PromQL answers for every family (see {stack['log']})")

    # what the families say: per-route requests from both gunicorn workers, the refusals, the worker's tasks
    route = "/api/v1/entities/<string:entityName>/records/<string:recordId>"
    served = _query(prometheus, f'sum(gateway_http_request_duration_seconds_count{{route="{route}",status="200"}})')
    assert float(served[0]["value"][1]) >= 5
    for status_code in ("429", "413", "415"):
        assert _query(prometheus, f'gateway_http_refusals_total{{status="{status_code}"}} > 0'), status_code
    assert _query(prometheus, 'gateway_image_provider_request_duration_seconds_count{provider="provider-a",'
                              'outcome="ok"}')
    wait_for(lambda: _query(prometheus, 'gateway_task_duration_seconds_count{job="gateway-worker",'
                                        'task="bulk.entity_records",state="SUCCESS"} > 0'),
             timeout=60, interval=1, what="the bulk job's task counted by the worker's endpoint")
    assert _query(prometheus, 'gateway_embedding_request_duration_seconds_count{job="gateway-worker",backend="openai",'
                              'outcome="ok"} > 0')
    # the deployment gauges read every source
    up = {r["metric"]["source"]: r["value"][1] for r in _query(prometheus, "gateway_metrics_source_up")}
    assert up == {"queues": "1", "outbox": "1", "analytics": "1", "rollouts": "1"}
    # no organization or record id in any label of any series
    series = urllib.parse.urlencode({"match[]": '{__name__=~"gateway_.*"}'})
    status, body = _http("GET", f"{prometheus}/api/v1/series?{series}")
    assert status == 200 and org not in json.dumps(body) and record["id"] not in json.dumps(body)
    # the shipped alert rules are loaded and evaluated without error
    status, rules = _http("GET", f"{prometheus}/api/v1/rules")
    loaded = [rule for group in rules["data"]["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in loaded} >= {
        "GatewayOutboxBacklogOld", "GatewayQueueGrowing", "GatewayHttp5xxRate", "GatewayImageProviderErrors",
        "GatewayLeaseReaps", "GatewayAnalyticsLag"}

    def every_rule_evaluated():
        groups = _http("GET", f"{prometheus}/api/v1/rules")[1]["data"]["groups"]
        return all(rule.get("health") == "ok" for group in groups for rule in group["rules"])
    wait_for(every_rule_evaluated, timeout=30, interval=1, what="every rule evaluated (health ok)")
