"""Reliability rules the foundation owns (docs/operations.md, "Failure behaviour")."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from sqlalchemy import Column, MetaData, String, Table, insert, select

from app.db import PRODUCT_PLACEHOLDER, db
from tests.conftest import ROOT, TEST_SECRET, TEST_VAR_DIR, dies_with_parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, proc, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "gunicorn exited early"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail("gunicorn did not become healthy")


def start_gunicorn(database_url: str, *args: str, **env_overrides):
    """gunicorn with docker/gunicorn.conf.py (then `args`) serving tests.slow_app on a free port, once
    healthy: (process, port)."""
    port = _free_port()
    env = dict(os.environ, PORT=str(port), DATABASE_URL=database_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, REDIS_URL="", WEB_CONCURRENCY="1", **env_overrides)
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                             "docker/gunicorn.conf.py", *args, "tests.slow_app:app"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_parent)
    try:
        _wait_healthy(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc, port


def test_sigterm_lets_in_flight_request_finish_and_refuses_new_ones(database_url):
    proc, port = start_gunicorn(database_url, SLOW_SECONDS="3")
    try:
        result = {}

        def call_slow():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_test/slow", timeout=20) as resp:
                result["status"], result["body"] = resp.status, resp.read()

        worker = threading.Thread(target=call_slow)
        worker.start()
        time.sleep(1.0)  # the request is in flight
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):  # listener closed: new connections are refused
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        worker.join(15)
        assert result.get("status") == 200 and b"finished" in result["body"]
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return int(lines[0].split()[1]), dict(line.split(": ", 1) for line in lines[1:]), body


def _new_connection_after_stop(port: int) -> str:
    """What a new client gets from a stopping server: `refused`, or `503` (never a hang: the
    socket timeout fails the test)."""
    import json

    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionRefusedError:
        return "refused"
    with sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            status, _headers, body = _read_response(sock)
        except TimeoutError:
            pytest.fail("a connection opened after SIGTERM hung with no answer")
        assert status == 503 and json.loads(body)["error"]["code"] == "SERVICE_UNAVAILABLE", body
        return "503"


def test_sigterm_closes_the_listener_and_answers_queued_requests_503(database_url, tmp_path):
    """SIGTERM: the worker stops listening at once (new connections are refused, so a proxy or another
    instance takes them), a request the kernel had queued for it gets a 503 in the envelope instead of
    waiting with no answer, and the request in flight finishes. One connection per worker
    (--worker-connections 1) keeps the second request in the listen queue while the slow one runs."""
    import json

    marker = tmp_path / "slow-started"
    proc, port = start_gunicorn(database_url, "--worker-connections", "1", SLOW_SECONDS="6",
                                SLOW_STARTED_FILE=str(marker))
    try:
        result = {}

        def call_slow():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_test/slow", timeout=60) as resp:
                result["status"], result["body"] = resp.status, resp.read()

        slow = threading.Thread(target=call_slow)
        slow.start()
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the slow request never started"
            time.sleep(0.05)
        queued = socket.create_connection(("127.0.0.1", port), timeout=5)
        queued.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        proc.send_signal(signal.SIGTERM)
        with queued:
            try:
                status, headers, body = _read_response(queued)
            except TimeoutError:
                pytest.fail("the queued request hung after SIGTERM with no answer")
        assert status == 503 and headers.get("Connection") == "close"
        envelope = json.loads(body)
        assert envelope["error"]["code"] == "SERVICE_UNAVAILABLE" and envelope["metadata"]["success"] is False
        outcomes = []
        while slow.is_alive() and len(outcomes) < 20:
            outcomes.append(_new_connection_after_stop(port))
            time.sleep(0.1)
        assert outcomes and set(outcomes) <= {"refused", "503"}, outcomes
        slow.join(60)
        assert result.get("status") == 200 and b"finished" in result["body"]
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_enqueue_with_redis_down_does_not_hang(make_app):
    from app.ops.tasks import ping
    from app.tasks import enqueue_after_commit

    app = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0")
    with app.app_context():
        start = time.monotonic()
        with db.product_session("default") as session:
            enqueue_after_commit(session, ping, "x")
        elapsed = time.monotonic() - start
        resp = app.test_client().get("/health")
    assert elapsed < 10, f"enqueue blocked {elapsed:.1f}s with the broker down"
    assert resp.status_code == 503 and resp.get_json()["checks"]["redis"]["status"] == "fail"
    assert resp.get_json()["checks"]["database"]["status"] == "ok"


def test_product_schemas_do_not_mix(app):
    """The schema_translate_map switch: the same Table addresses each product's own schema."""
    metadata = MetaData(schema=PRODUCT_PLACEHOLDER)
    probe = Table("foundation_probe", metadata, Column("org_id", String), Column("value", String))
    with app.app_context():
        for product in ("default", "other"):
            with db.engine_for(product).begin() as conn:
                probe.drop(conn, checkfirst=True)
                probe.create(conn)
        with db.engine_for("default").begin() as conn:
            conn.execute(insert(probe).values(org_id="o", value="in-default"))
        with db.engine_for("other").begin() as conn:
            conn.execute(insert(probe).values(org_id="o", value="in-other"))
        with db.engine_for("default").connect() as conn:
            assert conn.scalars(select(probe.c.value)).all() == ["in-default"]
        with db.engine_for("other").connect() as conn:
            assert conn.scalars(select(probe.c.value)).all() == ["in-other"]
        for product in ("default", "other"):
            with db.engine_for(product).begin() as conn:
                probe.drop(conn)


def test_a_second_app_does_not_take_over_the_first_apps_database(make_app, client, auth):
    """Database state is per app: a broken second app leaves the main app's engine alone."""
    broken = make_app(DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/nothing", DB_POOL_TIMEOUT=1)
    assert broken.test_client().get("/health").status_code == 503
    assert client.get("/health").status_code == 200
    assert client.get("/api/v1/me", headers=auth("read")).status_code == 200


def test_a_value_postgresql_cannot_convert_is_400_not_500(client, auth):
    """DataError (e.g. an impossible stored date cast to a timestamp) answers 400 INVALID_INPUT."""
    resp = client.get("/api/v1/_test/cast", headers=auth("read"))
    assert resp.status_code == 400
    assert resp.get_json()["error"]["code"] == "INVALID_INPUT"


def _backend_pid(app) -> int:
    from sqlalchemy import text

    with app.app_context():
        return db.session.scalar(text("SELECT pg_backend_pid()"))


def _terminate(pid: int) -> None:
    from sqlalchemy import text

    with db.engine.connect() as conn:  # the main test app's engine, not the pool under test
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


def test_a_pooled_connection_that_died_while_idle_is_replaced_before_use(make_app, app):
    """Idle longer than DB_PING_IDLE_SECONDS: pinged at checkout, a dead one replaced unseen."""
    idle = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=0)
    pid = _backend_pid(idle)
    with app.app_context():
        _terminate(pid)
    time.sleep(0.05)
    assert _backend_pid(idle) != pid


def test_a_connection_that_died_while_busy_costs_one_503_then_the_pool_reconnects(make_app, app, auth):
    """Busy connections are not pinged: the request that meets the dead one answers 503 and the
    pool is invalidated, so the next request works."""
    busy = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    pid = _backend_pid(busy)
    with app.app_context():
        _terminate(pid)
    time.sleep(0.05)
    client = busy.test_client()
    first = client.get("/api/v1/entities/nothing/records/r1", headers=auth("read"))
    assert first.status_code == 503
    assert first.get_json()["error"]["code"] == "SERVICE_UNAVAILABLE"
    second = client.get("/api/v1/entities/nothing/records/r1", headers=auth("read"))
    assert second.status_code == 404
    assert _backend_pid(busy) != pid


def test_read_first_runs_in_autocommit_and_leaves_the_pooled_connection_transactional(make_app):
    """db.read_first outside a transaction: one autocommit statement on a pooled connection, which
    the next request gets back in transaction mode (its writes stay atomic); inside the session's
    transaction it runs in that transaction."""
    from sqlalchemy import func, select, text

    single = make_app(DB_POOL_SIZE=1)
    pid_stmt = select(func.pg_backend_pid().label("pid"), func.now().label("started"),
                      func.statement_timestamp().label("stamp"))
    with single.app_context():
        row = db.read_first(pid_stmt, {})
        assert row["started"] == row["stamp"]  # its own transaction, begun by this statement
        assert g_session_absent()
    with single.app_context():
        session = db.session
        assert session.scalar(text("SELECT pg_backend_pid()")) == row["pid"]  # the same pooled connection
        assert session.connection().connection.dbapi_connection.autocommit is False
        session.execute(text("SET LOCAL application_name = 'read-first-probe'"))
        setting = select(func.current_setting("application_name").label("name"))
        assert db.read_first(setting, {})["name"] == "read-first-probe"


def test_read_first_sees_what_the_request_session_has_not_flushed_yet(make_app):
    """A pending object in the request session (no transaction begun yet) is flushed before the read,
    as a Session query's autoflush would: the read never misses this request's own write."""
    from sqlalchemy import select

    from app.platform_models import Organization

    org_id = f"org-pending-{uuid.uuid4().hex[:8]}"
    app = make_app()
    with app.app_context():
        session = db.session
        assert not session.in_transaction()
        session.add(Organization(id=org_id, title="Pending", product="default"))
        row = db.read_first(select(Organization.id).where(Organization.id == org_id), {})
        assert row == {"id": org_id}
        session.rollback()


def g_session_absent() -> bool:
    from flask import g

    return g.get("_db_session") is None


def test_pooled_connections_plan_prepared_statements_for_their_values(app, make_app, database_url):
    """psycopg prepares a statement after 5 runs; PostgreSQL's default may then plan it once for any
    values (a generic plan), which for filters over JSONB can be 5x slower (decisions.md). Every
    pooled connection plans for the values it gets; `auto` restores PostgreSQL's default."""
    from sqlalchemy import text

    from app.db import make_engine

    with app.app_context():
        with db.engine_for("default").connect() as conn:
            assert conn.scalar(text("SHOW plan_cache_mode")) == "force_custom_plan"
            assert conn.scalar(text("SHOW statement_timeout")) == "30s"
    other = make_app(DB_PLAN_CACHE_MODE="auto")
    with other.app_context():
        with db.engine_for("default").connect() as conn:
            assert conn.scalar(text("SHOW plan_cache_mode")) == "auto"
    with pytest.raises(ValueError, match="DB_PLAN_CACHE_MODE"):
        make_engine(database_url, {"DB_PLAN_CACHE_MODE": "sometimes; DROP TABLE x"})


def test_the_access_log_line_through_gunicorn(database_url):
    """docker/gunicorn.conf.py's access line (app.serving.AccessLogger): client, request line, status,
    bytes, duration and the request id the response carries."""
    import re

    port = _free_port()
    env = dict(os.environ, PORT=str(port), DATABASE_URL=database_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, REDIS_URL="", WEB_CONCURRENCY="1", GUNICORN_THREADS="4")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                             "docker/gunicorn.conf.py", "tests.slow_app:app"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=dies_with_parent)
    try:
        _wait_healthy(port, proc)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/health?x=%22q%22",
                                     headers={"X-Request-ID": "rid-of-the-test"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            size = len(resp.read())
        missing = urllib.request.Request(f"http://127.0.0.1:{port}/nowhere")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(missing, timeout=10)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert re.search(rf'^127\.0\.0\.1 "GET /health\?x=%22q%22 HTTP/1\.1" 200 {size} \d+ms rid=rid-of-the-test$',
                     out, re.M), out
    assert re.search(r'^127\.0\.0\.1 "GET /nowhere HTTP/1\.1" 404 \d+ \d+ms rid=[0-9a-f]{32}$', out, re.M), out


def _read_http_response(conn: socket.socket) -> bytes:
    """One response (headers + Content-Length body) from a raw socket; b"" when the server closed."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
            if len(body) >= length:
                return data
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_a_body_the_app_did_not_read_is_drained_and_the_connection_kept(database_url):
    """A request the app answers without reading its body (405 here; 401, 404, 429 alike) keeps its
    connection: gunicorn alone drains at most 64 KB of such a body and then closes with the rest
    unread, a reset that can destroy the answer on its way (an ingress that is still sending the body
    answers its client 502 and takes the API process out of rotation). The worker drains up to the
    largest body the app accepts."""
    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="4")
    try:
        body = b"x" * (4 * 1024 * 1024)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
            conn.sendall(b"POST /health HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            first = _read_http_response(conn)
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
            second = _read_http_response(conn)
        assert first.startswith(b"HTTP/1.1 405 "), first[:200]
        assert second.startswith(b"HTTP/1.1 200 "), second[:200]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_kept_alive_connection_is_served_however_its_next_request_comes(database_url):
    """After an answer, a worker thread waits briefly for the connection's next request
    (app.serving: KEEPALIVE_LINGER_SECONDS) and otherwise hands the connection back to gunicorn's
    poller: a next request sent at once, after a pause beyond that wait, or pipelined behind another
    is answered, and with two threads, three kept-alive connections taking turns are all served."""
    proc, port = start_gunicorn(database_url, GUNICORN_THREADS="2")
    request = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
            for pause in (0, 0.05, 0, 0.3, 0):
                time.sleep(pause)
                conn.sendall(request)
                answer = _read_http_response(conn)
                assert answer.startswith(b"HTTP/1.1 200 ") and b'"status":"ok"' in answer, answer[:300]
            conn.sendall(request * 3)
            data = b""
            while data.count(b"HTTP/1.1 200 ") < 3 or not data.endswith(b"}\n"):
                chunk = conn.recv(65536)
                assert chunk, data
                data += chunk
            assert data.count(b"HTTP/1.1 ") == 3
        conns = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(3)]
        try:
            for _turn in range(3):
                for conn in conns:
                    conn.sendall(request)
                    assert _read_http_response(conn).startswith(b"HTTP/1.1 200 ")
        finally:
            for conn in conns:
                conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
