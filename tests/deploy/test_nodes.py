"""Several nodes (the session's stack runs two API nodes and two worker nodes of each group, each under
its own runsv): a rolling restart under load, kill -9 of an API node and of a worker node mid-job, and
what the nodes share (definitions, rate limits) seen through each node's own port."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

from tests.conftest import ROOT, wait_for
from tests.deploy.conftest import _scrubbed_environ, record_figure
from tests.deploy.test_stack import domain, signed

BASE = "/api/v1/entities"
SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}


def call(url: str, method: str, path: str, body=None, headers=None, timeout: float = 60):
    """(status, parsed JSON or raw bytes) of one request on a new connection (urllib: Connection: close)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def node_url(stack, index: int) -> str:
    """An API node's own port (not through the ingress)."""
    return f"http://127.0.0.1:{stack.settings.api_ports[index - 1]}"


def new_org(stack, entity: str = "pings") -> dict:
    headers = signed(stack, domain(), scopes=["read", "write"], role="admin")
    status, body = call(stack.url, "POST", f"{BASE}/definitions",
                        {"name": entity, "displayName": entity.title(), "schema": SCHEMA}, headers)
    assert status == 201, body
    return headers


def descendants(pid: int) -> list[int]:
    from stack.__main__ import _children

    found, todo = [], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def gone(pid: int) -> bool:
    """Whether every thread of process `pid` has exited: its sockets are closed only then (a killed
    process's main thread is a zombie while its other threads still exit, its listening socket open)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return False
        except OSError:
            continue
    return True


def kill_node(node) -> list[int]:
    """kill -9 of the node's process and everything it started (as a machine that dies); returns when
    they are all gone."""
    pid = node.pid()
    assert pid, node
    pids = [pid, *descendants(pid)]
    for victim in pids:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: all(gone(victim) for victim in pids), 30, "the killed node's processes", interval=0.01)
    return pids


class Load:
    """A steady load through the ingress from a thread pool: each thread in turn creates a record (POST,
    not idempotent: never sent twice by the ingress) and reads it back (GET). Every answer is kept with
    when its request started and ended."""

    def __init__(self, stack, headers: dict, threads: int = 6, entity: str = "pings"):
        self.stack, self.headers, self.entity = stack, headers, entity
        self.results: list[tuple[float, float, str, int, object]] = []
        self.created: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _one(self, method: str, path: str, body=None):
        started = time.monotonic()
        try:
            status, answer = call(self.stack.url, method, path, body, self.headers, timeout=60)
        except (OSError, http.client.HTTPException) as exc:  # no answer, or a cut one: counted as a failure
            status, answer = 0, repr(exc)
        with self.lock:
            self.results.append((started, time.monotonic(), method, status, answer))
        return status, answer

    def _run(self, i: int) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            status, record = self._one("POST", f"{BASE}/{self.entity}/records",
                                       {"name": f"t{i}-{n}", "fields": {"body": "load", "n": n}})
            if status == 201:
                with self.lock:
                    self.created.append(record["id"])
                self._one("GET", f"{BASE}/{self.entity}/records/{record['id']}")

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        wait_for(lambda: len(self.ok()) >= 20, 60, "the load's first answers")
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(90)

    def ok(self) -> list:
        return [r for r in self.results if r[3] in (200, 201)]

    def failures(self) -> list:
        return [r for r in self.results if r[3] not in (200, 201)]

    def between(self, start: float, end: float) -> list:
        return [r for r in self.results if start <= r[0] <= end]

    def stored(self) -> int:
        """Records of the load's entity now in the database (each 201 exactly once)."""
        status, body = call(self.stack.url, "POST", f"{BASE}/{self.entity}/records/count", {"filters": {}},
                            self.headers)
        assert status == 200, body
        return body


def test_a_rolling_restart_of_every_api_node_under_load_loses_no_request(stack):
    """`python -m stack restart api` (the operator's command) while a steady load of creates and reads runs
    through the ingress: each API node is taken out of the ingress, restarted (a new gunicorn master) and
    put back, one after the other; not one request fails, and every created record is stored once."""
    headers = new_org(stack)
    before = {name: stack.node(name).pid() for name in ("api.1", "api.2")}
    env = {**_scrubbed_environ(), "STACK_DIR": stack.dir, "PYTHONPATH": ROOT}
    with Load(stack, headers) as load:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "stack", "restart", "api"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)
        finished = time.monotonic()
        time.sleep(1)
    assert out.returncode == 0, out.stdout + out.stderr
    after = {name: stack.node(name).pid() for name in before}
    assert all(after[name] and after[name] != before[name] for name in before), (before, after)
    during = load.between(started, finished)
    assert load.failures() == [], load.failures()[:5]
    assert len(during) >= 20
    assert load.stored() == len(load.created) == len({r[4]["id"] for r in load.ok() if r[2] == "POST"})
    timings = [float(x) for x in re.findall(r"restarted in ([0-9.]+) s", out.stderr)]
    assert len(timings) == 2, out.stderr
    record_figure("rolling_restart", {
        "api_nodes": 2, "load_threads": len(load.threads), "requests_during_restart": len(during),
        "failed": len(load.failures()), "node_restart_s": timings,
        "request_ms_median_during": round(statistics.median(r[1] - r[0] for r in during) * 1000, 1),
        "request_ms_max_during": round(max(r[1] - r[0] for r in during) * 1000, 1),
    })


def test_kill_9_of_an_api_node_loses_only_what_it_held_and_the_ingress_moves_on(stack):
    """kill -9 of api.2 (its gunicorn master and workers) under load: the only failures are requests that
    were in flight when it died (creates it held: a clean 503 from the ingress; a read it held is retried
    on api.1 by the ingress), every request started after its death is answered by api.1, the ingress
    marks it down, and runsv starts it again."""
    headers = new_org(stack)
    node = stack.node("api.2")
    port = node.port
    log_before = len(stack.log())
    with Load(stack, headers, threads=8) as load:
        time.sleep(1)
        kill_started = time.monotonic()
        killed = kill_node(node)
        killed_at = time.monotonic()
        time.sleep(5)  # the node is down (runsv starts it again; it migrates and boots meanwhile)

        def back():
            try:
                return call(node_url(stack, 2), "GET", "/health", timeout=3)[0] == 200
            except (OSError, http.client.HTTPException):
                return False

        wait_for(back, 240, "api.2 started again by its runsv")
        back_at = time.monotonic()
        time.sleep(2)
    assert node.pid() not in killed
    held = [r for r in load.results if r[0] < killed_at and r[1] > kill_started]
    failures = load.failures()
    proxy = [line for line in stack.log()[log_before:].splitlines() if line.split()[1:2] == ["proxy.1"]]
    stray = [r[:4] for r in failures if not (r[0] < killed_at and r[1] > kill_started)]
    assert not stray, (kill_started, killed_at, stray, [line[:400] for line in proxy if "[error]" in line][:12])
    assert len(failures) <= len(held)
    # a held request is answered 503 by the ingress, or cut (the node died between its head and its body)
    assert all(r[3] == 0 or (r[3] == 503 and r[4]["error"]["code"] == "SERVICE_UNAVAILABLE") for r in failures)
    after = [r for r in load.results if r[0] >= killed_at]
    assert len(after) >= 20 and all(r[3] in (200, 201) for r in after)
    # a create the node held may have been committed before it died (its answer lost): never twice
    assert len(load.created) <= load.stored() <= len(load.created) + sum(r[2] == "POST" for r in failures)
    assert any(f"127.0.0.1:{port}" in line and "temporarily disabled" in line for line in proxy), proxy[-5:]
    refused = [line for line in proxy if f"127.0.0.1:{port}" in line and "connect() failed" in line]
    record_figure("api_node_kill", {
        "load_threads": 8, "in_flight_at_kill": len(held), "failed": len(failures),
        "failed_methods": sorted({r[2] for r in failures}), "failed_cut_answers": sum(r[3] == 0 for r in failures),
        "requests_after_kill": len(after), "failed_after_kill": 0,
        "ingress_connect_tries_to_dead_node": len(refused), "node_down_s": round(back_at - killed_at, 1),
    })


def _active_bulk_node(stack) -> str | None:
    out = stack.cli("celery", "-A", "app.celery_probe", "inspect", "active", "--json", "--timeout", "3")
    if out.returncode != 0:
        return None
    active = json.loads(out.stdout.strip().splitlines()[-1])
    names = [name for name, tasks in active.items() if any(t["name"] == "bulk.entity_records" for t in tasks)]
    return names[0] if len(names) == 1 else None


def test_kill_9_of_a_worker_node_mid_job_loses_no_job(stack):
    """A 202 bulk update held mid-run (its record locked by this test): the worker node running it is
    killed with everything it started; the job's lease (its row lock) ends with the node's database
    connection, a live node's reaper sends it again, and it runs once: the record is written once."""
    import psycopg

    headers = new_org(stack)
    status, record = call(stack.url, "POST", f"{BASE}/pings/records", {"name": "r", "fields": {"n": 1}}, headers)
    assert status == 201, record
    url = stack.env["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url) as blocker, psycopg.connect(url, autocommit=True) as watcher:
        blocker.execute("SELECT id FROM product_default.entity_records WHERE id = %s FOR UPDATE", (record["id"],))
        me = blocker.execute("SELECT pg_backend_pid()").fetchone()[0]
        status, job = call(stack.url, "POST", f"{BASE}/pings/records/bulk/update",
                           {"records": [{"id": record["id"], "fields": {"n": 2}}]},
                           {**headers, "Prefer": "respond-async"})
        assert status == 202, job
        wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                         (me,)).fetchone()[0], 60, "the job waiting on the locked record")
        assert call(stack.url, "GET", f"/api/v1/jobs/{job['jobId']}", headers=headers)[1]["status"] == "running"
        name = wait_for(lambda: _active_bulk_node(stack), 60, "the worker node running the job")
        index = int(re.match(r"worker@node(\d+)\.", name).group(1))
        node = stack.node(f"worker.{index}")
        killed = kill_node(node)
        killed_at = time.monotonic()
        blocker.rollback()  # the dead node's transaction ends without a commit
    wait_for(lambda: call(stack.url, "GET", f"/api/v1/jobs/{job['jobId']}", headers=headers)[1]["status"]
             == "succeeded", 120, "the job re-run by a live worker node")
    succeeded_after = time.monotonic() - killed_at
    status, got = call(stack.url, "GET", f"{BASE}/pings/records/{record['id']}", headers=headers)
    assert got["fields"]["n"] == 2 and got["version"] == 2, got  # written exactly once
    status, done = call(stack.url, "GET", f"/api/v1/jobs/{job['jobId']}", headers=headers)
    assert done["result"]["count"] == 1, done
    wait_for(lambda: node.pid() and node.pid() not in killed, 60, "the worker node started again by its runsv")
    assert subprocess.run(["sv", "-w", "120", "check", node.service_dir], capture_output=True).returncode == 0
    record_figure("worker_node_kill", {"killed_node": name, "killed_processes": len(killed),
                                       "job_lease_s": 5, "job_succeeded_after_kill_s": round(succeeded_after, 1)})


def test_a_schema_change_through_node_1_is_seen_at_once_through_node_2(stack):
    """Node 2 has the definition cached (a query refused a filter on a field it does not have); a field
    added through node 1 is known to node 2's very next query, count and create."""
    headers = new_org(stack, "gadgets")
    one, two = node_url(stack, 1), node_url(stack, 2)
    assert call(one, "POST", f"{BASE}/gadgets/records", {"name": "a", "fields": {"n": 1}}, headers)[0] == 201
    for _ in range(2):  # read, then answered from node 2's cache
        status, body = call(two, "POST", f"{BASE}/gadgets/records/query", {"query": {"filters": {"n": 1}}}, headers)
        assert status == 200 and body["totalCount"] == 1, body
    assert call(two, "POST", f"{BASE}/gadgets/records/query", {"query": {"filters": {"color": "red"}}},
                headers)[0] == 400  # unknown field
    wider = {**SCHEMA, "properties": {**SCHEMA["properties"], "color": {"type": "string"}}}
    status, body = call(one, "PUT", f"{BASE}/definitions/gadgets", {"schema": wider}, headers)
    assert status == 200, body
    status, body = call(two, "POST", f"{BASE}/gadgets/records/query", {"query": {"filters": {"color": "red"}}},
                        headers)
    assert status == 200 and body["totalCount"] == 0, body
    assert call(two, "POST", f"{BASE}/gadgets/records", {"name": "b", "fields": {"color": "red"}}, headers)[0] == 201
    status, body = call(two, "POST", f"{BASE}/gadgets/records/count", {"filters": {"color": "red"}}, headers)
    assert status == 200 and body == 1, body


def test_a_rate_limit_counts_across_nodes(stack):
    """The stack's aggregate limit is 6 per organization and window (conftest): calls spread over both
    API nodes share one count, so the 7th is refused, on either node."""
    headers = new_org(stack)
    urls = [node_url(stack, 1), node_url(stack, 2)]
    body = {"aggregates": [{"function": "count"}]}
    answers = [call(urls[i % 2], "POST", f"{BASE}/pings/records/aggregate", body, headers) for i in range(8)]
    assert [status for status, _ in answers] == [200] * 6 + [429] * 2, answers
    assert all(answer["error"]["code"] == "RATE_LIMITED" for _, answer in answers[6:])


# -- image nodes (api-images.1, api-images.2: the image route's pool, each under its runsv) ------------------

def _image_call(stack, headers: dict, request_id: str, results: dict, prompt: str | None = "a fox") -> None:
    """POST /api/v1/agents/images through the ingress; without a prompt the app answers 400 at once."""
    body = {"provider": "provider-a", "model": "gpt-image-1", **({"prompt": prompt} if prompt else {})}
    try:
        status, answer = call(stack.url, "POST", "/api/v1/agents/images", body,
                              {**headers, "X-Request-ID": request_id}, timeout=180)
    except (OSError, http.client.HTTPException) as exc:
        status, answer = 0, repr(exc)
    results[request_id] = (status, answer, time.monotonic())


def _image_caller(stack) -> dict:
    """A token of a new organization (image calls are rate-limited per organization)."""
    from tests.deploy.test_stack import domain, signed

    return signed(stack, domain(), scopes=["write:image-gen", "read"])


def _served_by(stack, request_id: str) -> str:
    return wait_for(lambda: stack.served_by(request_id), 20, f"the access line of {request_id}")


def test_kill_9_of_an_image_node_is_started_again_and_the_other_serves_meanwhile(stack):
    """kill -9 of api-images.2 (its gunicorn master and workers): image calls sent while it is down are
    answered by api-images.1 (a refused connection goes to the next node of the image upstream), and
    runsv starts api-images.2 again, which then serves image calls too."""
    node = stack.node("api-images.2")
    killed = kill_node(node)
    killed_at = time.monotonic()
    results: dict[str, tuple] = {}
    valid = f"img-kill-{uuid.uuid4().hex}"
    slow = threading.Thread(target=_image_call, args=(stack, _image_caller(stack), valid, results))
    slow.start()
    quick = [f"img-kill-{uuid.uuid4().hex}" for _ in range(6)]
    for request_id in quick:  # invalid calls: answered at once by whichever image node takes them
        _image_call(stack, _image_caller(stack), request_id, results, prompt=None)
    slow.join(120)

    def back():
        try:
            return call(f"http://127.0.0.1:{node.port}/health", "GET", "", timeout=3)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    wait_for(back, 240, "api-images.2 started again by its runsv")
    back_at = time.monotonic()
    assert node.pid() and node.pid() not in killed
    assert results[valid][0] == 200 and results[valid][1]["data"]["mimeType"] == "image/png", results[valid]
    assert [results[rid][0] for rid in quick] == [400] * 6, [results[rid][:2] for rid in quick]
    sent_while_down = [rid for rid in [valid, *quick] if results[rid][2] < back_at]
    assert sent_while_down and {_served_by(stack, rid) for rid in sent_while_down} == {"api-images.1"}
    # back in the image upstream: calls reach it again (nginx tries it once its 2 s fail_timeout is over)
    served = set()
    for _ in range(40):
        request_id = f"img-back-{uuid.uuid4().hex}"
        _image_call(stack, _image_caller(stack), request_id, results, prompt=None)
        assert results[request_id][0] == 400, results[request_id]
        served.add(_served_by(stack, request_id))
        if served == {"api-images.1", "api-images.2"}:
            break
        time.sleep(0.5)
    assert served == {"api-images.1", "api-images.2"}, served
    record_figure("image_node_kill", {"image_calls_while_down": len(sent_while_down),
                                      "node_down_s": round(back_at - killed_at, 1)})


def test_a_rolling_restart_of_the_image_nodes_finishes_the_image_calls_they_hold(stack):
    """Two image calls wait on a slow provider (45 s), one on each image node (round robin), when
    `python -m stack restart api-images` runs: each node leaves the image upstream, drains its call
    (gunicorn's graceful stop: the image budget) and comes back. Both calls are answered 200, the call
    held by api-images.1 was still in flight when that node got its SIGTERM, and the image route answered
    every request sent during the restart (none refused)."""
    stack.fake_images.delay = 45.0
    results: dict[str, tuple] = {}
    held = [f"img-roll-{uuid.uuid4().hex}" for _ in range(2)]
    before = len(stack.fake_images.received)
    pids = {name: stack.node(name).pid() for name in ("api-images.1", "api-images.2")}
    log_before = len(stack.log())
    threads = [threading.Thread(target=_image_call, args=(stack, _image_caller(stack), rid, results)) for rid in held]
    try:
        for thread in threads:
            thread.start()
            time.sleep(0.3)
        wait_for(lambda: len(stack.fake_images.received) - before >= 2, 30, "the image calls upstream", interval=0.05)
        env = {**_scrubbed_environ(), "STACK_DIR": stack.dir, "PYTHONPATH": ROOT}
        restart = subprocess.Popen([sys.executable, "-m", "stack", "restart", "api-images"], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        during = []
        while restart.poll() is None:  # the image route keeps answering (invalid calls: 400 at once)
            request_id = f"img-during-{uuid.uuid4().hex}"
            _image_call(stack, _image_caller(stack), request_id, results, prompt=None)
            during.append(request_id)
            time.sleep(0.5)
        out = restart.communicate(timeout=900)[0]
        for thread in threads:
            thread.join(120)
    finally:
        stack.fake_images.delay = 12.0
    assert restart.returncode == 0, out
    assert [results[rid][0] for rid in held] == [200, 200], [results[rid][:2] for rid in held]
    served = {rid: _served_by(stack, rid) for rid in held}
    assert sorted(served.values()) == ["api-images.1", "api-images.2"], served
    log = stack.log()[log_before:]
    on_first = next(rid for rid, name in served.items() if name == "api-images.1")
    term = re.search(r"^\S+ api-images\.1\s+\|.*Handling signal: term", log, re.M)
    answered = re.search(rf"^\S+ api-images\.1\s+\|.* rid={on_first}$", log, re.M)
    assert term and answered and term.start() < answered.start(), "api-images.1 stopped after its call ended"
    assert all(stack.node(name).pid() not in (None, pids[name]) for name in pids), pids
    assert during and all(results[rid][0] == 400 for rid in during), \
        [results[rid][:2] for rid in during if results[rid][0] != 400]
    timings = [float(x) for x in re.findall(r"restarted in ([0-9.]+) s", out)]
    assert len(timings) == 2, out
    record_figure("image_rolling_restart", {"held_image_calls": 2, "held_answered_200": 2,
                                            "image_route_requests_during": len(during), "refused": 0,
                                            "node_restart_s": timings})
