"""`make stack REPLICA=1`: a stack of its own (one node of each kind) with a streaming replica of its
PostgreSQL, copied through a physical replication slot; the API and the workers get DATABASE_REPLICA_URL,
so a dashboard through the ingress reads the replica, and the API's /metrics exports its lag."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

from stack import free_port
from tests.conftest import wait_for
from tests.deploy.conftest import _need_tools, started_stack
from tests.deploy.test_stack import domain, internal, signed

DAY = "2026-03-09"
WINDOW = f"from={DAY}&to={DAY}"


@pytest.fixture(scope="module")
def replica_stack(fake_images):
    _need_tools()
    name = f"replica-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    # a max lag of 2 s: the lag test below need not hold replay paused for the default 30 s
    with started_stack(name, fake_images, STACK_REPLICA="1", STACK_REPLICA_PORT=str(free_port()),
                       STACK_API_PROCESSES="1", STACK_IMAGES_PROCESSES="1", STACK_WORKER_NODES="1",
                       DB_REPLICA_MAX_LAG_SECONDS="2") as handle:
        yield handle


def _sql(url: str, statement: str):
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(statement).fetchone()


def _chat(chat_id: str) -> list[dict]:
    base = {"sessionId": f"s-{chat_id}", "userId": f"u-{chat_id}", "eventCategory": "chat"}
    props = {"chatId": chat_id, "agentId": "agent-1", "channel": "web"}
    return [{**base, "eventId": f"{chat_id}-start", "eventType": "chat_started", "timestamp": f"{DAY}T09:00:00Z",
             "properties": props},
            {**base, "eventId": f"{chat_id}-m", "eventType": "message", "timestamp": f"{DAY}T09:01:00Z",
             "properties": {**props, "direction": "inbound", "model": "m", "service": "chat", "inputTokens": 1,
                            "outputTokens": 2, "cost": 0.01}}]


def _metrics(stack) -> dict[str, float]:
    status, _h, body = stack.http("GET", "/metrics", headers=internal(stack))
    assert status == 200, body
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_replica_stack_serves_dashboards_and_exports_the_replicas_lag(replica_stack):
    stack = replica_stack
    settings = stack.settings
    assert stack.env["DATABASE_REPLICA_URL"] == f"postgresql+psycopg://postgres@127.0.0.1:{settings.replica_port}/"
    primary = f"host=127.0.0.1 port={settings.pg_port} user=postgres dbname=postgres"
    replica = f"host=127.0.0.1 port={settings.replica_port} user=postgres dbname=postgres"
    assert _sql(replica, "SELECT pg_is_in_recovery()")[0] is True
    # the replica streams through its slot (the primary keeps the WAL it has not received)
    wait_for(lambda: _sql(primary, "SELECT active FROM pg_replication_slots WHERE slot_name = 'stack_replica'")
             == (True,), 60, "the replica streaming through the slot stack_replica")
    assert _sql(replica, "SHOW primary_slot_name")[0] == "stack_replica"

    org = domain()
    headers = signed(stack, org, scopes=["read", "write"])
    status, _h, body = stack.http("POST", "/api/v1/analytics/events/batch",
                                  {"events": _chat(f"c-{uuid.uuid4().hex[:8]}")}, headers=headers)
    assert status == 202, body

    def summary():
        status, _h, body = stack.http("GET", f"/api/v1/analytics/summary?{WINDOW}", headers=headers)
        assert status == 200, body
        return body["data"]["total_chats"] == 1

    # stored by a worker on the primary, replayed by the replica, read from it by the dashboard
    wait_for(summary, 90, "the chat on the dashboard through the ingress")

    def lag_exported():
        metrics = _metrics(stack)
        return metrics if "gateway_db_replica_lag_seconds" in metrics else None

    metrics = wait_for(lag_exported, 60, "gateway_db_replica_lag_seconds on the API's /metrics")
    assert metrics['gateway_metrics_source_up{source="replica"}'] == 1
    assert metrics["gateway_db_replica_lag_seconds"] >= 0 and "gateway_db_replica_lag_bytes" in metrics


# the replica's families of docs/operations.md "Metrics" (the Prometheus test's API has no replica, so its
# PromQL check cannot see them: they are checked here, on the API's /metrics of a stack with one)
REPLICA_FAMILIES = ["gateway_db_replica_lag_seconds", "gateway_db_replica_lag_bytes",
                    "gateway_db_replica_fallbacks_total"]


def test_a_lagging_replica_is_skipped_and_every_replica_family_is_exported(replica_stack):
    """Replay paused on the replica and a write on the primary: once the replica is further behind than
    DB_REPLICA_MAX_LAG_SECONDS, the dashboard answers from the primary and counts the fallback
    (`reason="lag"`); /metrics then carries all three replica families, the lag's bytes above 0."""
    stack = replica_stack
    settings = stack.settings
    primary = f"host=127.0.0.1 port={settings.pg_port} user=postgres dbname=postgres"
    replica = f"host=127.0.0.1 port={settings.replica_port} user=postgres dbname=postgres"
    headers = signed(stack, domain(), scopes=["read", "write"])

    def lag_fallbacks(metrics) -> float:
        return sum(value for name, value in metrics.items()
                   if name.startswith("gateway_db_replica_fallbacks_total{") and 'reason="lag"' in name)

    before = lag_fallbacks(_metrics(stack))  # the test above may have met a moment of lag already
    _sql(replica, "SELECT pg_wal_replay_pause()")
    try:
        _sql(primary, "SELECT txid_current()")  # a committed transaction the replica has not replayed

        def counted():
            status, _h, body = stack.http("GET", f"/api/v1/analytics/summary?{WINDOW}", headers=headers)
            assert status == 200, body
            metrics = _metrics(stack)  # the lag gauges are measured at most every 5 s (their cache)
            return metrics if lag_fallbacks(metrics) > before and metrics.get("gateway_db_replica_lag_bytes") else None

        metrics = wait_for(counted, 60, "a lag fallback counted and the paused replica's lag on the API's /metrics")
    finally:
        _sql(replica, "SELECT pg_wal_replay_resume()")
    families = {name.split("{")[0] for name in metrics}
    assert set(REPLICA_FAMILIES) <= families, sorted(f for f in families if "replica" in f)
    assert metrics["gateway_db_replica_lag_bytes"] > 0 and metrics["gateway_db_replica_lag_seconds"] > 0
