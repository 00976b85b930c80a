"""LOG_FORMAT=json (app.observability.logs): every line the API under gunicorn (started as the Procfile
starts it) and a Celery worker write is one JSON object; access lines carry the request's id, route
template, tenant, status, duration and trace id."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from tests.conftest import ROOT, TEST_SECRET, TEST_VAR_DIR, dies_with_parent, start_worker, stop_worker, wait_for
from tests.functional.entities_support import BASE, create_definition
from tests.functional.test_reliability import _free_port, _wait_healthy
from tests.otlp_sink import OtlpSink

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")


def _json_lines(path: str) -> list[dict]:
    """Every line of the file, each parsed as one JSON object (a line that is not fails the test)."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    parsed, bad = [], []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if isinstance(entry, dict):
            parsed.append(entry)
        else:
            bad.append(line)
    assert not bad, f"lines of {path} that are not JSON objects: {bad[:10]}"
    for entry in parsed:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", entry["time"]), entry
    return parsed


def _call(port: int, method: str, path: str, token: str | None = None, body=None, request_id=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if request_id:
        headers["X-Request-ID"] = request_id
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null"), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), exc.headers


def test_gunicorn_writes_one_json_object_per_line(database_url, org_id, make_token):
    """`gunicorn -c docker/gunicorn.conf.py wsgi:app` with LOG_FORMAT=json and tracing exported by OTLP,
    configured by the environment alone: stdout (access log) and stderr (gunicorn's and the app's log)
    are JSON lines, and an access line's trace id is the trace the collector received."""
    port = _free_port()
    out_path = os.path.join(TEST_VAR_DIR, f"gunicorn-json-{uuid.uuid4().hex[:6]}.out")
    err_path = out_path[:-4] + ".err"
    os.makedirs(TEST_VAR_DIR, exist_ok=True)
    token = make_token()
    with OtlpSink() as sink:
        env = dict(os.environ, PORT=str(port), DATABASE_URL=database_url, JWT_SECRET=TEST_SECRET,
                   VAR_DIR=TEST_VAR_DIR, REDIS_URL="", WEB_CONCURRENCY="1", GUNICORN_THREADS="4",
                   MAX_RESPONSE_BYTES="400", LOG_FORMAT="json", LOG_LEVEL="INFO", OTEL_TRACES_EXPORTER="otlp",
                   OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_EXPORTER_OTLP_ENDPOINT=sink.url,
                   OTEL_SERVICE_NAME="gateway-under-test")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                                     "docker/gunicorn.conf.py", "wsgi:app"], cwd=ROOT, env=env, stdout=out,
                                    stderr=err, preexec_fn=dies_with_parent)
        try:
            _wait_healthy(port, proc)
            status, _, _ = _call(port, "POST", f"{BASE}/definitions", token,
                                 {"name": "notes", "displayName": "Notes", "schema": SCHEMA})
            assert status == 201
            status, record, _ = _call(port, "POST", f"{BASE}/notes/records", token, {"fields": {"body": "x", "n": 1}})
            assert status == 201
            status, _, headers = _call(port, "GET", f"{BASE}/notes/records/{record['id']}", token,
                                       request_id="rid-of-the-json-test")
            assert status == 200 and headers["X-Request-ID"] == "rid-of-the-json-test"
            status, _, unauthorized = _call(port, "GET", f"{BASE}/notes/records/{record['id']}", "not-a-jwt")
            assert status == 401
            assert _call(port, "GET", "/nowhere")[0] == 404
            # an app log line inside a request: the service refuses a response above MAX_RESPONSE_BYTES
            status, _, oversized = _call(port, "POST", f"{BASE}/notes/records/query", token, {"query": {}},
                                         request_id="rid-oversized")
            assert status == 413
        finally:
            proc.terminate()
            proc.wait(30)
        assert proc.returncode == 0
        spans = sink.snapshot()

    out, err = _json_lines(out_path), _json_lines(err_path)
    assert out and err
    access = [e for e in out if e["logger"] == "gunicorn.access"]
    assert len(access) == len(out)  # stdout is the access log

    read = [e for e in access if e.get("request_id") == "rid-of-the-json-test"]
    assert len(read) == 1
    line = read[0]
    assert line["method"] == "GET" and line["status"] == 200 and line["path"] == f"{BASE}/notes/records/{record['id']}"
    assert line["route"] == "/api/v1/entities/<string:entityName>/records/<string:recordId>"  # no ids in it
    assert (line["org"], line["product"]) == (org_id, "default")
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert HEX32.match(line["trace_id"]) and HEX16.match(line["span_id"])
    server = [s for s in spans if s.trace_id == line["trace_id"] and s.kind == "SERVER"]
    assert len(server) == 1 and server[0].span_id == line["span_id"]
    assert server[0].service == "gateway-under-test" and server[0].name == f"GET {line['route']}"

    refused = [e for e in access if e.get("request_id") == unauthorized["X-Request-ID"]]
    assert len(refused) == 1 and refused[0]["status"] == 401 and "org" not in refused[0]
    assert refused[0]["trace_id"] != line["trace_id"]  # a span of its own, authentication included
    missing = [e for e in access if e["path"] == "/nowhere"]
    assert len(missing) == 1 and missing[0]["status"] == 404 and HEX32.match(missing[0]["request_id"])

    # the app's log line in that request carries the request's fields and trace
    warned = [e for e in err if e.get("request_id") == "rid-oversized"]
    assert len(warned) == 1 and warned[0]["logger"] == "app" and warned[0]["level"] == "WARNING", err
    assert "MAX_RESPONSE_BYTES" in warned[0]["message"]
    assert (warned[0]["org"], warned[0]["product"], warned[0]["method"]) == (org_id, "default", "POST")
    assert warned[0]["route"] == "/api/v1/entities/<string:entityName>/records/query"
    refused_query = next(e for e in access if e.get("request_id") == "rid-oversized")
    assert refused_query["status"] == 413 and refused_query["trace_id"] == warned[0]["trace_id"]
    assert oversized["X-Request-ID"] == "rid-oversized"

    # gunicorn's own log (start, worker boot, shutdown) is JSON too, on stderr
    assert any(e["logger"] == "gunicorn.error" and "Booting worker" in e["message"] for e in err)
    assert any(e["logger"] == "gunicorn.error" and "tracing on" in e["message"] for e in err)


def test_plain_text_stays_the_default(database_url):
    """Without LOG_FORMAT the access line is the plain one (tests/functional/test_reliability.py holds
    its exact shape) and nothing is JSON."""
    from app.config import SETTINGS

    assert SETTINGS["LOG_FORMAT"][0] == "text"
    from app import create_app
    from tests.conftest import app_config

    app = create_app(app_config(database_url, LOG_LEVEL="WARNING"))
    import logging

    handler = next(h for h in logging.getLogger().handlers if getattr(h, "_platform_gateway", False))
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    assert handler.filter(record) and handler.format(record).endswith(" WARNING [-] x: hello world")
    with pytest.raises(RuntimeError, match="LOG_FORMAT='yaml'"):
        create_app(app_config(database_url, LOG_FORMAT="yaml"))
    app.extensions["db"].engine.dispose()


def test_a_celery_worker_writes_json_lines_with_the_task(make_app, database_url, redis_url, auth):
    """`celery -A workers worker` with LOG_FORMAT=json: every line of its output is a JSON object, and
    the lines a task logs name the task and its id."""
    prefix = f"test-jsonlog-{uuid.uuid4().hex[:8]}:"
    app = make_app(CELERY_KEY_PREFIX=prefix)
    client, headers = app.test_client(), auth()
    worker = start_worker(database_url, redis_url, prefix=prefix, queues="bulk", log_name="worker-json.log",
                          extra_env={"LOG_FORMAT": "json"})
    try:
        create_definition(client, headers, "notes", SCHEMA)
        resp = client.post(f"{BASE}/notes/records/bulk/create", headers={**headers, "Prefer": "respond-async"},
                           json={"records": [{"fields": {"body": "a", "n": 1}}]})
        assert resp.status_code == 202
        job_id = resp.get_json()["jobId"]
        wait_for(lambda: client.get(f"/api/v1/jobs/{job_id}", headers=headers).get_json()["status"] == "succeeded",
                 timeout=60, what="bulk job done")
    finally:  # a warm shutdown lets the task finish (and log its success) first

        stop_worker(worker)
    lines = _json_lines(worker.log_path)
    assert any(e["logger"] == "celery.worker.consumer.consumer" or "ready" in e["message"] for e in lines)
    received = [e for e in lines if e["message"].startswith("Task bulk.entity_records[") and "received" in e["message"]]
    assert len(received) == 1 and job_id in received[0]["data"]["args"]
    task_id = received[0]["data"]["id"]
    in_task = [e for e in lines if e.get("task_name") == "bulk.entity_records"]
    assert in_task and all(e["task_id"] == task_id for e in in_task), lines
    assert any("succeeded" in e["message"] for e in in_task)
    assert any("shutdown" in e["message"] for e in lines)  # Celery's own notice, as JSON too
