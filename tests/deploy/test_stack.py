"""The deployed topology, black box: the session's stack (conftest) driven as operators drive it —
HTTP through the ingress, Flower, and the documented console scripts with the stack's environment."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.conftest import wait_for
from tests.deploy.conftest import record_figure


def domain() -> str:
    return f"acme-{uuid.uuid4().hex[:10]}.example.com"


def seed_body(d: str, product: str = "default") -> dict:
    return {"org": {"title": "Acme Inc", "mainDomain": d, "product": product},
            "admin": {"email": "admin@example.com", "firstName": "Ada", "lastName": "Admin"}}


def internal(stack) -> dict:
    return {"X-Internal-Token": stack.env["INTERNAL_API_TOKEN"]}


def mint(stack, *args: str) -> str:
    out = stack.cli("flask", "--app", "wsgi", "token", "mint", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def bearer(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


def signed(stack, org: str, **claims) -> dict:
    """A token signed with the stack's secret (the CLI's `token mint` is tested on its own)."""
    from tests.support import token

    return bearer(token(org=org, secret=stack.env["JWT_SECRET"], **claims))


def seeded(stack, d: str, product: str = "default"):
    status, _h, report = stack.http("GET", f"/internal/seed/{d}?product={product}", headers=internal(stack))
    return status == 200 and report["summary"] == {"total": 15, "existing": 15, "missing": 0}


def assert_artifacts_usable(stack, d: str, product: str = "default") -> None:
    """The 15 artifacts, used over HTTP by the org's admin (a token minted by the CLI)."""
    admin = signed(stack, d, user="ada", role="admin", product=product)
    status, _h, body = stack.http("GET", "/api/v1/entities/definitions", headers=admin)
    assert status == 200, body
    defs = body["definitions"]
    assert {x["name"] for x in defs} == {"contacts", "companies", "deals", "tasks", "notes"}
    assert all(x["artifactVersion"] == 1 and x["defaultViewId"] for x in defs)
    assert stack.http("GET", "/api/v1/entities/definitions/deals/views", headers=admin)[0] == 200
    status, _h, rec = stack.http("POST", "/api/v1/entities/deals/records", {"name": "Big one",
                                 "fields": {"stage": "new", "amount": 10}}, headers=admin)
    assert status == 201, rec
    agents = stack.http("GET", "/api/v1/agents", headers=admin)[2]["agents"]
    assert {a["name"] for a in agents} == {"assistant", "support", "sales", "researcher"}
    assistant = next(a for a in agents if a["name"] == "assistant")
    assert assistant["isDefault"] is True and [s["skillName"] for s in assistant["skills"]] == ["summarize",
                                                                                                 "web-search"]
    assert len(stack.http("GET", "/api/v1/skills", headers=admin)[2]["skills"]) == 4
    status, _h, report = stack.http("GET", f"/internal/seed/{d}?product={product}", headers=internal(stack))
    storage = next(a for a in report["artifacts"] if a["kind"] == "storage")
    status, _h, readme = stack.http("GET", f"/blobs/{storage['objectId']}README.txt")
    assert status == 200 and d.encode() in readme


# -- seeding ------------------------------------------------------------------------------------------

def test_celery_call_seed_org_then_the_15_artifacts_work_over_http(stack):
    """`celery -A workers call seed.org --kwargs '{…}'` (docs/operations.md) on the stack's broker: the
    seed worker provisions a new product's schema and the 15 artifacts, usable at once through the ingress."""
    d, product = domain(), f"p{uuid.uuid4().hex[:8]}"
    out = stack.cli("celery", "-A", "workers", "call", "seed.org", "--kwargs", json.dumps(seed_body(d, product)))
    assert out.returncode == 0, out.stderr
    wait_for(lambda: seeded(stack, d, product), 90, "seed.org through celery call")
    assert_artifacts_usable(stack, d, product)


def test_respond_async_seed_completes_on_the_seed_worker(stack):
    d = domain()
    status, _h, queued = stack.http("POST", "/internal/seed", seed_body(d),
                                    headers={**internal(stack), "Prefer": "respond-async"})
    assert status == 202, queued
    assert queued["statusUrl"] == f"/internal/seed/{d}?product=default"
    wait_for(lambda: seeded(stack, d), 90, "Prefer: respond-async seeding")
    assert_artifacts_usable(stack, d)


# -- the CLI reaches the running stack ---------------------------------------------------------------

def test_flask_cli_reaches_the_stacks_database_and_secret(stack):
    """`flask seed org` writes into the stack's database; `flask token mint` signs with the stack's
    secret (the token works through the ingress)."""
    d = domain()
    out = stack.cli("flask", "--app", "wsgi", "seed", "org", "--title", "Cli Org", "--domain", d,
                    "--admin-email", "ops@example.com", "--first-name", "Op", "--last-name", "Erator")
    assert out.returncode == 0 and "15 created" in out.stdout, out.stdout + out.stderr
    assert seeded(stack, d)
    tok = mint(stack, "--org", d, "--user", "alice", "--scopes", "read,write")
    status, _h, me = stack.http("GET", "/api/v1/me", headers=bearer(tok))
    assert status == 200 and me["orgId"] == d and me["userId"] == "alice", me
    # VAR_DIR alone (what a command that misses the stack is told to set) finds the same database and secret
    out = stack.cli("flask", "--app", "wsgi", "token", "mint", "--org", d, "--user", "bob",
                    env={"ENV_FILE": "", "VAR_DIR": stack.dir})
    assert out.returncode == 0, out.stderr
    status, _h, me = stack.http("GET", "/api/v1/me", headers=bearer(out.stdout.strip().splitlines()[-1]))
    assert status == 200 and me["userId"] == "bob", me


# -- workers, queues, Flower ----------------------------------------------------------------------------

def _call(stack, *args: str) -> str:
    out = stack.cli("celery", "-A", "workers", "call", "ops.ping", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def _task(stack, task_id: str):
    status, info = stack.flower_get(f"/api/task/info/{task_id}", stack.env["FLOWER_BASIC_AUTH"])
    return info if status == 200 and isinstance(info, dict) and info.get("state") == "SUCCESS" else None


def test_a_worker_started_for_one_queue_takes_only_that_queue(stack):
    status, workers = stack.flower_get("/api/workers?refresh=1", stack.env["FLOWER_BASIC_AUTH"])
    assert status == 200
    queues = {name.split("@")[0]: sorted(q["name"] for q in info["active_queues"]) for name, info in workers.items()}
    assert queues["worker-embeddings"] == ["embeddings"]
    assert queues["worker"] == ["analytics", "bulk", "default", "email", "seed"]
    on_embeddings, on_default = _call(stack, "--queue", "embeddings"), _call(stack)
    ran = wait_for(lambda: _task(stack, on_embeddings), 60, "ping on the embeddings queue")
    assert ran["worker"].startswith("worker-embeddings@")
    ran = wait_for(lambda: _task(stack, on_default), 60, "ping on the default queue")
    assert ran["worker"].startswith("worker@")


def test_flower_refuses_without_login_and_lists_tasks_with_it(stack):
    assert stack.flower_get("/api/workers")[0] == 401
    assert stack.flower_get("/api/tasks", "ops:wrong-password")[0] == 401
    assert stack.flower_get("/")[0] == 401
    task_id = _call(stack)
    wait_for(lambda: _task(stack, task_id), 60, "ping")
    status, tasks = stack.flower_get("/api/tasks?limit=1000", stack.env["FLOWER_BASIC_AUTH"])
    assert status == 200 and tasks[task_id]["name"] == "ops.ping" and tasks[task_id]["state"] == "SUCCESS"


def test_the_workers_periodic_work_runs_without_a_beat(stack):
    """No beat process (compose has none, so neither has the Procfile): the periodic work is each worker's
    maintenance loop. A task the broker never got (a row of platform.task_outbox, as a commit during a
    Redis outage leaves it) is sent by the stack's workers and runs."""
    import psycopg

    assert not re.search(r"^\S+ system\s+\| beat\.\d+ started", stack.log(), re.M)
    task_id = str(uuid.uuid4())
    url = stack.env["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO platform.task_outbox (id, key_prefix, task_name, args, kwargs, created_at, "
                     "attempts) VALUES (%s, '', 'ops.ping', '[\"from-the-outbox\"]', '{}', "
                     "now() - interval '1 minute', 0)", (task_id,))
    ran = wait_for(lambda: _task(stack, task_id), 60, "the outbox row sent by a worker's maintenance loop")
    assert ran["name"] == "ops.ping" and "from-the-outbox" in ran["result"]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM platform.task_outbox WHERE id = %s", (task_id,)).fetchone()[0] == 0


# -- the ingress ------------------------------------------------------------------------------------------

def test_the_ingress_passes_large_bodies_and_refuses_above_100_mb_in_the_envelope(stack):
    """20 MB (above nginx's 1 MB default) reaches the app, which answers it; here before reading it (405),
    so the API process must drain the body for the answer to survive (app.serving); above 100 MB the
    ingress itself refuses, in the envelope."""
    big = b"x" * (20 * 1024 * 1024)
    for _ in range(4):  # both API processes, twice
        request = urllib.request.Request(stack.url + "/api/v1/me", data=big, method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 405, refused.value.read()[:300]
        assert json.loads(refused.value.read())["error"]["code"] == "INVALID_INPUT"
    with socket.create_connection(("127.0.0.1", stack.settings.port), timeout=10) as conn:
        conn.sendall(b"POST /api/v1/analytics/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 104857601\r\n\r\n")
        head, _sep, body = _read_response(conn).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    envelope = json.loads(body)
    assert envelope["error"]["code"] == "PAYLOAD_TOO_LARGE" and envelope["metadata"]["success"] is False
    assert isinstance(envelope["metadata"]["timestamp"], int) and b"X-Request-ID: " in head


def _read_response(conn: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and b"Content-Length:" in head:
            length = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
            if len(body) >= length:
                return data


def _health_latencies(stack, stop: threading.Event, out: list, errors: list) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            with urllib.request.urlopen(stack.url + "/health", timeout=10) as resp:
                resp.read()
                assert resp.status == 200
            out.append(time.monotonic() - start)
        except Exception as exc:  # noqa: BLE001 - every failure is counted
            errors.append(repr(exc))
        time.sleep(0.1)


def test_slow_loris_leaves_health_answering_through_the_ingress(stack):
    """400 connections trickle header lines (one every second, never finishing the request): /health keeps
    answering through the ingress, and the ingress drops each of them at its header timeout."""
    baseline: list[float] = []
    errors: list[str] = []
    stop = threading.Event()
    probe = threading.Thread(target=_health_latencies, args=(stack, stop, baseline, errors))
    probe.start()
    time.sleep(2)
    stop.set()
    probe.join()

    conns = []
    for _ in range(400):
        conn = socket.create_connection(("127.0.0.1", stack.settings.port), timeout=10)
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: stack\r\n")
        conns.append(conn)
    opened = time.monotonic()
    during: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=_health_latencies, args=(stack, stop, during, errors))
    probe.start()
    closed_after: dict[int, float] = {}
    try:
        for second in range(30):  # bounded: the ingress's header timeout is 10 s
            for i, conn in enumerate(conns):
                if i in closed_after:
                    continue
                try:
                    conn.sendall(f"X-Trickle-{second}: {i}\r\n".encode())
                    conn.setblocking(False)
                    conn.recv(4096)  # EOF or a 408: the ingress gave up on this request
                    closed_after[i] = time.monotonic() - opened
                except BlockingIOError:
                    pass
                except OSError:
                    closed_after[i] = time.monotonic() - opened
                finally:
                    conn.setblocking(True)
            if len(closed_after) == len(conns):
                break
            time.sleep(1)
    finally:
        stop.set()
        probe.join()
        for conn in conns:
            conn.close()
    assert not errors, errors[:5]
    assert len(during) >= 10
    assert len(closed_after) == 400, f"{400 - len(closed_after)} trickling connections still open after 30 s"
    record_figure("slow_loris", {
        "connections": 400,
        "health_ms_baseline_median": round(statistics.median(baseline) * 1000, 1),
        "health_ms_during_median": round(statistics.median(during) * 1000, 1),
        "health_ms_during_max": round(max(during) * 1000, 1),
        "health_requests_during": len(during),
        "health_failures_during": len(errors),
        "dropped_by_ingress_after_s": [round(min(closed_after.values()), 1), round(max(closed_after.values()), 1)],
    })


# -- the two API pools ----------------------------------------------------------------------------------------

def _pool(stack, request_id: str) -> str:
    return wait_for(lambda: stack.served_by(request_id), 20, f"the access line of {request_id}").split(".")[0]


def test_image_calls_have_their_own_pool_and_other_routes_answer_while_they_wait(stack):
    """Ten image calls wait on the provider (the fake answers after 12 s): more than the image pool's
    threads (2 processes × 4) and more than the API pool's (2 × 4), so if they shared a pool with the
    other routes, those would queue behind them. Meanwhile a record GET, /api/v1/me and /health answer,
    each within 10 s (a request queued behind an image call would wait for it); the gunicorn access
    lines (request ids) show the image calls served by api-images, the rest by api."""
    d = domain()
    status, _h, body = stack.http("POST", "/internal/seed", seed_body(d), headers=internal(stack), timeout=120)
    assert status in (200, 201), body
    admin = signed(stack, d, user="ada", role="admin", scopes=["read", "write", "write:image-gen"])
    status, _h, record = stack.http("POST", "/api/v1/entities/deals/records", {"name": "Pooled",
                                    "fields": {"stage": "new", "amount": 1}}, headers=admin)
    assert status == 201, record
    record_path = f"/api/v1/entities/deals/records/{record['id']}"
    before = len(stack.fake_images.received)
    results: dict[str, int] = {}

    def image_call(request_id: str):
        status, _h, _body = stack.http("POST", "/api/v1/agents/images", {"provider": "provider-a",
                                       "model": "gpt-image-1", "prompt": "a fox"},
                                       headers={**admin, "X-Request-ID": request_id}, timeout=120)
        results[request_id] = status

    image_ids = [f"img-{uuid.uuid4().hex}" for _ in range(10)]
    calls = [threading.Thread(target=image_call, args=(rid,)) for rid in image_ids]
    for thread in calls:
        thread.start()
    try:
        wait_for(lambda: len(stack.fake_images.received) - before >= 8, 30, "8 image calls waiting upstream",
                 interval=0.05)
        other_ids = {}
        for path in (record_path, "/api/v1/me", "/health", record_path):
            request_id = f"other-{uuid.uuid4().hex}"
            status, _h, body = stack.http("GET", path, headers={**admin, "X-Request-ID": request_id}, timeout=10)
            assert status == 200, (path, body)
            other_ids[request_id] = path
        assert not results  # all answered while every image call still waited
    finally:
        for thread in calls:
            thread.join(120)
    assert sorted(results.values()) == [200] * 10, results
    assert {_pool(stack, rid) for rid in image_ids} == {"api-images"}
    assert {_pool(stack, rid) for rid in other_ids} == {"api"}


# -- SIGTERM of an image node, unannounced to the ingress -------------------------------------------------------

def test_sigterm_of_an_image_node_drains_behind_the_ingress(stack):
    """Image calls (the fake upstream answers after 12 s) are in flight on both image nodes; api-images.2
    gets SIGTERM through its supervisor (`sv term`: runsv's control/t signals the node's process, as
    `docker stop` signals a container's PID 1) while the ingress still lists it: its in-flight calls
    finish; new requests on the image route (invalid ones, so the app answers them at once) are served by
    api-images.1, the other routes by the API pool, none hangs; api-images.2's gunicorn exits once drained,
    and runsv starts it again."""
    import subprocess

    node = stack.node("api-images.2")
    master = stack.gunicorn_master("api-images.2")
    assert node.pid() == master  # the Procfile's `exec`: the node's process is gunicorn's master
    admin = signed(stack, domain(), scopes=["write:image-gen", "read"])
    before = len(stack.fake_images.received)
    results: dict[str, tuple] = {}

    def image_call(request_id: str):
        start = time.monotonic()
        status, _h, body = stack.http("POST", "/api/v1/agents/images", {"provider": "provider-a",
                                      "model": "gpt-image-1", "prompt": "a red fox in snow"},
                                      headers={**admin, "X-Request-ID": request_id}, timeout=120)
        results[request_id] = (status, body, time.monotonic() - start)

    inflight_ids = [f"drain-{uuid.uuid4().hex}" for _ in range(6)]
    inflight = [threading.Thread(target=image_call, args=(rid,)) for rid in inflight_ids]
    for thread in inflight:
        thread.start()
    wait_for(lambda: len(stack.fake_images.received) - before >= 6, 30, "image calls in flight", interval=0.05)
    sigterm_at = time.monotonic()
    log_at_signal = len(stack.log())
    assert subprocess.run(["sv", "term", node.service_dir], capture_output=True, timeout=30).returncode == 0
    # `sv term` returns once runsv has the command; the node has stopped listening when its worker says so
    wait_for(lambda: re.search(r"^\S+ api-images\.2\s+\|.*listening sockets closed", stack.log()[log_at_signal:],
                               re.M), 30, "api-images.2 closing its listening socket", interval=0.02)

    outcomes = {"ok": 0, "clean_503": 0, "other": [], "hung": 0}
    new_image_route: dict[str, int] = {}
    latencies = []
    turn = 0
    while any(thread.is_alive() for thread in inflight):  # new requests while api-images.2 drains
        turn += 1
        request_id = f"new-{uuid.uuid4().hex}"
        started = time.monotonic()
        try:
            if turn % 2:  # the image route, without a prompt: a 400 from whichever image process takes it
                caller = signed(stack, domain(), scopes=["write:image-gen"])  # image calls are limited per org
                status, headers, body = stack.http("POST", "/api/v1/agents/images", {"provider": "provider-a"},
                                                   headers={**caller, "X-Request-ID": request_id}, timeout=10)
                expected = 400
                if status == 400:
                    new_image_route[request_id] = status
            else:
                status, headers, body = stack.http("GET", "/api/v1/me", headers=admin, timeout=10)
                expected = 200
            latencies.append(time.monotonic() - started)
            if status == expected:
                outcomes["ok"] += 1
            elif status == 503 and isinstance(body, dict) and body["error"]["code"] == "SERVICE_UNAVAILABLE":
                outcomes["clean_503"] += 1
            else:
                outcomes["other"].append((status, body))
        except (TimeoutError, urllib.error.URLError) as exc:
            if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
                outcomes["hung"] += 1
            else:
                outcomes["other"].append(repr(exc))
        time.sleep(0.05)
    for thread in inflight:
        thread.join()
    drained_at = time.monotonic()

    def exited():
        try:
            os.kill(master, 0)
            return False
        except ProcessLookupError:
            return True

    wait_for(exited, 60, "api-images.2's gunicorn exit", interval=0.05)
    exit_at = time.monotonic()

    def back():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.port}/health", timeout=3) as resp:
                return resp.status == 200 and node.pid() not in (None, master)
        except OSError:
            return False

    wait_for(back, 240, "api-images.2 started again by its runsv")
    assert [results[rid][0] for rid in inflight_ids] == [200] * 6, results
    assert all(results[rid][1]["data"]["mimeType"] == "image/png" for rid in inflight_ids)
    served = [stack.served_by(rid) for rid in inflight_ids]
    assert set(served) <= {"api-images.1", "api-images.2"} and "api-images.2" in served, served
    assert outcomes["hung"] == 0 and outcomes["other"] == [], outcomes
    assert outcomes["ok"] > 0 and new_image_route
    # after the SIGTERM the image route is served by the node that is not stopping
    assert {stack.served_by(rid) for rid in new_image_route} == {"api-images.1"}
    record_figure("drain", {
        "in_flight_image_calls": 6, "in_flight_finished_200": sum(results[rid][0] == 200 for rid in inflight_ids),
        "in_flight_on_the_stopped_process": served.count("api-images.2"),
        "new_requests_during_drain": outcomes["ok"] + outcomes["clean_503"] + len(outcomes["other"]),
        "new_image_route_requests": len(new_image_route),
        "new_ok": outcomes["ok"], "new_clean_503": outcomes["clean_503"], "hung": outcomes["hung"],
        "sigterm_to_last_in_flight_done_s": round(drained_at - sigterm_at, 2),
        "new_ms_median": round(statistics.median(latencies) * 1000, 1),
        "new_ms_max": round(max(latencies) * 1000, 1),
        "sigterm_to_exit_s": round(exit_at - sigterm_at, 2),
    })
