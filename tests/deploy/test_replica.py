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
    with started_stack(name, fake_images, STACK_REPLICA="1", STACK_REPLICA_PORT=str(free_port()),
                       STACK_API_PROCESSES="1", STACK_IMAGES_PROCESSES="1", STACK_WORKER_NODES="1") as handle:
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
