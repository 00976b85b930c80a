"""The read replica (DATABASE_REPLICA_URL) against a real PostgreSQL streaming replica: a second embedded
server made from the test server with the wheel's `pg_basebackup -R` by `python -m app.embedded_pg replica
start`, on a free port for this module, and stopped by it.

What the replica serves is told apart from what the primary serves by pausing its replay
(`pg_wal_replay_pause()`): events posted on the primary meanwhile are not on the replica, so a dashboard
that answers the older figures answered from the replica, and a route that must read its own writes shows
them. Then the replica is stopped: dashboards still answer 200, from the primary."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys

import psycopg
import pytest

from tests.conftest import ROOT, TEST_VAR_DIR, wait_for
from tests.functional.agents_support import agent_body

API = "/api/v1/analytics"
DAY = "2026-02-17"  # this module's day (global roll-ups read every org of the product on it)
WINDOW = {"from": DAY, "to": DAY}
TOKEN = "replica-internal-" + "r" * 32

pytestmark = pytest.mark.skipif(bool(os.environ.get("TEST_DATABASE_URL")),
                                reason="the replica is copied from the embedded test server (TEST_DATABASE_URL "
                                       "names another server)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, pgdata: str, port: int) -> None:
        self.pgdata, self.port = pgdata, port

    @property
    def url(self) -> str:
        from app.embedded_pg import replica_url

        return replica_url(self.port)

    def sql(self, statement: str, database: str = "postgres"):
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname={database}", autocommit=True,
                             connect_timeout=5) as conn:
            return conn.execute(statement).fetchone()

    def pause(self) -> None:
        self.sql("SELECT pg_wal_replay_pause()")
        wait_for(lambda: self.sql("SELECT pg_get_wal_replay_pause_state()")[0] == "paused", what="replay paused")

    def resume(self) -> None:
        self.sql("SELECT pg_wal_replay_resume()")

    def start(self) -> None:
        from app.embedded_pg import start_replica

        start_replica(self.pgdata, self.port, timeout=60)

    def stop(self, mode: str = "fast") -> None:
        from app.embedded_pg import stop_replica

        stop_replica(self.pgdata, mode=mode, timeout=60)


def _cli(*args: str) -> str:
    """`python -m app.embedded_pg replica …` as a developer runs it, for the test server's VAR_DIR."""
    result = subprocess.run([sys.executable, "-m", "app.embedded_pg", "replica", *args], cwd=ROOT,
                            env=dict(os.environ, VAR_DIR=os.path.join(ROOT, "var"), ENV_FILE=""),
                            capture_output=True, text=True, timeout=360)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def replica(database_url):
    """A streaming replica of the test server (all its databases) made and started by the command line,
    stopped and deleted at the end."""
    pgdata = os.path.join(TEST_VAR_DIR, "pg-replica")
    leftover = Replica(pgdata, 0)
    with contextlib.suppress(Exception):
        leftover.stop(mode="immediate")  # an interrupted run's
    shutil.rmtree(pgdata, ignore_errors=True)
    os.makedirs(TEST_VAR_DIR, exist_ok=True)
    server = Replica(pgdata, _free_port())
    try:
        out = _cli("start", "--dir", pgdata, "--port", str(server.port))
        assert f"DATABASE_REPLICA_URL={server.url}" in out
        assert server.sql("SELECT pg_is_in_recovery()")[0] is True
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.resume()
        with contextlib.suppress(Exception):
            _cli("stop", "--dir", pgdata)
        server.stop(mode="immediate")  # (nothing when the command stopped it)
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.fixture()
def replica_app(make_app, replica):
    """An app reading dashboards from the replica (no lag guard: the tests pause replay at will); events
    are stored inline (no REDIS_URL), so the primary has them when the POST answers."""
    made = []

    def factory(**overrides):
        settings = {"REDIS_URL": "", "DATABASE_REPLICA_URL": replica.url, "DB_REPLICA_MAX_LAG_SECONDS": 0,
                    "INTERNAL_API_TOKEN": TOKEN, **overrides}
        made.append(make_app(**settings))
        return made[-1]

    yield factory
    for app in made:
        state = app.extensions["db"]
        if state.replica is not None:
            state.replica.engine.dispose()


@pytest.fixture()
def primary_client(make_app):
    return make_app(REDIS_URL="").test_client()


def chat(chat_id: str, hour: int) -> list[dict]:
    base = {"sessionId": f"s-{chat_id}", "userId": f"u-{chat_id}", "eventCategory": "chat"}
    props = {"chatId": chat_id, "agentId": "agent-1", "channel": "web"}
    return [{**base, "eventId": f"{chat_id}-start", "eventType": "chat_started",
             "timestamp": f"{DAY}T{hour:02d}:00:00Z", "properties": props},
            {**base, "eventId": f"{chat_id}-m", "eventType": "message", "timestamp": f"{DAY}T{hour:02d}:01:00Z",
             "properties": {**props, "direction": "inbound", "model": "m", "service": "chat", "inputTokens": 1,
                            "outputTokens": 2, "cost": 0.01}}]


def post(client, headers, events) -> None:
    r = client.post(f"{API}/events/batch", json={"events": events}, headers=headers)
    assert r.status_code == 202, r.get_json()


def chats(client, headers, path="summary", key="total_chats", **params) -> int:
    r = client.get(f"{API}/{path}", query_string={**WINDOW, **params}, headers=headers)
    assert r.status_code == 200, r.get_json()
    data = r.get_json()["data"]
    return data["totals"][key] if path.endswith("series") else data[key]


def scrape(client) -> dict[str, float]:
    r = client.get("/metrics", headers={"X-Internal-Token": TOKEN})
    assert r.status_code == 200
    values = {}
    for line in r.get_data(as_text=True).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def fallbacks(reason: str) -> float:
    from app.observability.metrics import DB_REPLICA_FALLBACKS

    return DB_REPLICA_FALLBACKS.labels(reason)._value.get()


def test_dashboards_answer_from_the_replica_and_own_writes_from_the_primary(replica_app, replica, primary_client,
                                                                            auth, make_token, org_id):
    client = replica_app().test_client()
    h = auth("read", "write")
    admin = {"Authorization": f"Bearer {make_token(role='admin')}"}
    post(client, h, chat("c1", 9))
    wait_for(lambda: chats(client, h) == 1, what="the replica replayed the first chat")
    before_global = chats(client, admin, "global/summary")
    replica.pause()
    try:
        post(client, h, chat("c2", 10) + chat("c3", 11))
        assert chats(primary_client, h) == 3  # the primary has them ...
        # ... every dashboard of the replica's app shows the replica's older state
        assert chats(client, h) == 1
        assert chats(client, h, "series", interval="day") == 1
        assert chats(client, h, "series", interval="day", tz="Europe/Berlin") == 1
        assert chats(client, admin, "global/summary") == before_global
        assert sum(o["total_chats"] for o in client.get(f"{API}/global/orgs", query_string=WINDOW,
                                                        headers=admin).get_json()["data"]
                   if o["org_id"] == org_id) == 1
        assert len(client.get(f"{API}/chats", query_string=WINDOW, headers=h).get_json()["data"]) == 1
        # a write and the read of it never touch the replica
        created = client.post("/api/v1/agents", json=agent_body(), headers=h)
        assert created.status_code == 201, created.get_json()
        agent_id = created.get_json()["agent"]["id"]
        assert client.get(f"/api/v1/agents/{agent_id}", headers=h).status_code == 200
        assert agent_id in {a["id"] for a in client.get("/api/v1/agents", headers=h).get_json()["agents"]}
        # the lag is exported while replay waits
        metrics = scrape(client)
        assert metrics['gateway_metrics_source_up{source="replica"}'] == 1
        assert metrics["gateway_db_replica_lag_bytes"] > 0
        assert metrics["gateway_db_replica_lag_seconds"] > 0
    finally:
        replica.resume()
    wait_for(lambda: chats(client, h) == 3, what="the replica caught up after replay resumed")


def test_a_lagging_replica_is_skipped_past_the_max_lag(replica_app, replica, auth):
    client = replica_app(DB_REPLICA_MAX_LAG_SECONDS=0.5).test_client()
    h = auth("read", "write")
    post(client, h, chat("c1", 9))
    wait_for(lambda: chats(client, h) == 1, what="the replica replayed the first chat")
    lagged = fallbacks("lag")
    replica.pause()
    try:
        post(client, h, chat("c2", 10))
        # at once the sample may be fresh and the replica answer; once it is further behind than the
        # guard, the primary answers
        wait_for(lambda: chats(client, h) == 2, what="the primary answered past the max lag")
        assert fallbacks("lag") > lagged
    finally:
        replica.resume()


@pytest.mark.parametrize("max_lag", [30, 0], ids=["found-by-the-lag-sample", "found-by-the-checkout"])
def test_an_unreachable_replica_falls_back_to_the_primary(make_app, auth, max_lag):
    app = make_app(REDIS_URL="", DATABASE_REPLICA_URL=f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/",
                   DB_REPLICA_MAX_LAG_SECONDS=max_lag, INTERNAL_API_TOKEN=TOKEN)
    client = app.test_client()
    h = auth("read", "write")
    down = fallbacks("down")
    post(client, h, chat("c1", 9))
    assert chats(client, h) == 1
    assert fallbacks("down") == down + 1
    assert chats(client, h) == 1  # within DB_REPLICA_RETRY_SECONDS: no connect attempt, the primary at once
    assert fallbacks("down") == down + 2
    assert app.extensions["db"].replica.down_until > 0
    metrics = scrape(client)
    assert metrics['gateway_metrics_source_up{source="replica"}'] == 0
    assert "gateway_db_replica_lag_seconds" not in metrics


def test_the_replica_stopped_dashboards_answer_from_the_primary(replica_app, replica, auth, make_token):
    client = replica_app().test_client()
    h = auth("read", "write")
    admin = {"Authorization": f"Bearer {make_token(role='admin')}"}
    post(client, h, chat("c1", 9))
    wait_for(lambda: chats(client, h) == 1, what="the replica replayed the first chat")
    down = fallbacks("down")
    replica.stop()
    try:
        post(client, h, chat("c2", 10))
        # the pooled replica connection is dead: the read runs again on the primary, no error
        assert chats(client, h) == 2
        assert chats(client, h, "series", interval="week") == 2
        assert chats(client, admin, "global/summary") >= 2
        assert fallbacks("down") > down
    finally:
        replica.start()
    assert replica.sql("SELECT pg_is_in_recovery()")[0] is True
