"""Fairness between organizations: a per-organization concurrency limit on record query/count/aggregate
and event ingest (app.ratelimit `concurrency_limited`). An organization with its limit in flight gets 429
RATE_LIMITED with Retry-After at once; another organization is served. Requests really in flight are held
by a PostgreSQL lock on the records table (they wait inside the database, as a slow query would); the
slots other API processes hold are entries in the shared Redis set."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from tests.functional.entities_support import BASE, create_definition, org_headers
from tests.support import assert_error

SCHEMA = {"type": "object", "properties": {"n": {"type": "int"}}}
EVENT = {"eventType": "page_view", "eventCategory": "navigation", "sessionId": "s-1", "userId": "u-1"}


def _pg(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _assert_concurrency_limited(resp, limit: int, group: str):
    body = assert_error(resp, 429, "RATE_LIMITED")
    assert resp.headers["Retry-After"] == "1"
    details = body["error"]["details"]
    assert details["concurrencyLimit"] == limit and details["group"] == group
    assert details["retryAfterSeconds"] == 1 and details["inFlight"] >= limit


def _wait_for_lock_waiters(conn, count: int) -> None:
    """Until `count` backends wait for a lock (the held requests are inside the database)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()").fetchone()[0]
        if waiting >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} requests never reached the database")


class _InFlight:
    """Requests sent from threads (each with its own test client), answered when the lock is released."""

    def __init__(self, app):
        self.app, self.threads, self.statuses = app, [], []

    def send(self, method: str, path: str, headers: dict, body: dict | None = None) -> None:
        def run():
            resp = self.app.test_client().open(path, method=method, json=body, headers=headers)
            self.statuses.append(resp.status_code)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[int]:
        for thread in self.threads:
            thread.join(timeout=120)
        return sorted(self.statuses)


@pytest.fixture(params=["redis", "in-process"])
def limited_app(request, make_app, redis_url):
    """An app with 2 record slots per org: slots in Redis, or counted in-process (Redis unreachable)."""
    if request.param == "redis":
        return make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=f"test-fair-{uuid.uuid4().hex[:8]}:",
                        CONCURRENCY_LIMIT_RECORDS=2)
    return make_app(REDIS_URL="redis://127.0.0.1:1/0", CONCURRENCY_LIMIT_RECORDS=2)


def test_an_org_at_its_limit_gets_429_while_another_org_is_served(limited_app, database_url):
    client = limited_app.test_client()
    _, flooding = org_headers()
    _, other = org_headers()
    for headers in (flooding, other):
        create_definition(client, headers, "things", SCHEMA)
        assert client.post(f"{BASE}/things/records", json={"fields": {"n": 1}}, headers=headers).status_code == 201
    inflight = _InFlight(limited_app)
    with psycopg.connect(_pg(database_url), autocommit=True) as watcher, \
            psycopg.connect(_pg(database_url)) as locker:
        tables = [f'"{schema}".entity_records' for (schema,) in locker.execute(
            "SELECT schemaname FROM pg_tables WHERE tablename = 'entity_records'").fetchall()]
        locker.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        try:
            # the flooding org's two allowed requests: a query and a count, both held in the database
            inflight.send("POST", f"{BASE}/things/records/query", flooding, {"query": {}})
            inflight.send("POST", f"{BASE}/things/records/count", flooding, {"filters": {}})
            _wait_for_lock_waiters(watcher, 2)
            # its third (query, count or aggregate: one budget) is refused at once, not queued
            _assert_concurrency_limited(client.post(f"{BASE}/things/records/query", json={"query": {}},
                                                    headers=flooding), 2, "records")
            _assert_concurrency_limited(client.post(f"{BASE}/things/records/aggregate",
                                                    json={"aggregates": [{"function": "count"}]},
                                                    headers=flooding), 2, "records")
            # another organization gets its own slots: its query is admitted (it reaches the database)
            inflight.send("POST", f"{BASE}/things/records/query", other, {"query": {}})
            _wait_for_lock_waiters(watcher, 3)
            # routes outside the group are not limited for the flooding org
            assert client.get("/api/v1/me", headers=flooding).status_code == 200
        finally:
            locker.rollback()
    assert inflight.join() == [200, 200, 200]
    # every slot was freed when its request ended: the flooding org is served again
    for _ in range(3):
        assert client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=flooding).status_code == 200


def _redis_app(make_app, redis_url, **limits):
    prefix = f"test-fair-{uuid.uuid4().hex[:8]}:"
    import redis

    return make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix, **limits), redis.Redis.from_url(redis_url), prefix


def _hold(conn, key: str, count: int, lease_seconds: float) -> None:
    """Slots held by requests of other API processes (lease deadlines on Redis' clock, in ms)."""
    seconds, micros = conn.time()
    now_ms = seconds * 1000 + micros // 1000
    conn.zadd(key, {uuid.uuid4().hex: now_ms + int(lease_seconds * 1000) for _ in range(count)})
    conn.pexpire(key, 120_000)


def test_slots_are_shared_by_every_api_process_and_expire_with_their_lease(make_app, redis_url):
    app, conn, prefix = _redis_app(make_app, redis_url, CONCURRENCY_LIMIT_RECORDS=3)
    client = app.test_client()
    org, headers = org_headers()
    create_definition(client, headers, "things", SCHEMA)
    key = f"{prefix}inflight:records:{org}"
    try:
        _hold(conn, key, 3, lease_seconds=60)  # three requests of this org in flight elsewhere
        _assert_concurrency_limited(client.post(f"{BASE}/things/records/count", json={}, headers=headers),
                                    3, "records")
        conn.delete(key)
        # a process that died mid-request leaves tokens whose lease has passed: they hold nothing
        _hold(conn, key, 3, lease_seconds=-1)
        resp = client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=headers)
        assert resp.status_code == 200, resp.get_json()
        assert conn.zcard(key) == 0  # the expired tokens were dropped, this request's own slot freed
        # a request that fails frees its slot too (404: no such entity)
        assert client.post(f"{BASE}/nothing/records/query", json={"query": {}}, headers=headers).status_code == 404
        assert conn.zcard(key) == 0
    finally:
        conn.delete(key)


def test_event_ingest_has_its_own_per_org_slots(make_app, redis_url):
    app, conn, prefix = _redis_app(make_app, redis_url, CONCURRENCY_LIMIT_INGEST=2, CONCURRENCY_LIMIT_RECORDS=1)
    client = app.test_client()
    org, headers = org_headers()
    _, other = org_headers()
    key = f"{prefix}inflight:ingest:{org}"
    try:
        _hold(conn, key, 2, lease_seconds=60)
        _assert_concurrency_limited(client.post("/api/v1/analytics/events", json=EVENT, headers=headers),
                                    2, "ingest")
        _assert_concurrency_limited(client.post("/api/v1/analytics/events/batch", json={"events": [EVENT]},
                                                headers=headers), 2, "ingest")
        assert client.post("/api/v1/analytics/events", json=EVENT, headers=other).status_code == 202
        # the records group is a separate budget
        create_definition(client, headers, "things", SCHEMA)
        assert client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=headers).status_code == 200
    finally:
        conn.delete(key)


def test_limit_zero_turns_the_group_off_and_a_negative_limit_stops_start_up(make_app, redis_url):
    app, conn, prefix = _redis_app(make_app, redis_url, CONCURRENCY_LIMIT_RECORDS=0)
    client = app.test_client()
    org, headers = org_headers()
    create_definition(client, headers, "things", SCHEMA)
    key = f"{prefix}inflight:records:{org}"
    try:
        _hold(conn, key, 50, lease_seconds=60)
        assert client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=headers).status_code == 200
    finally:
        conn.delete(key)
    with pytest.raises(ValueError, match="CONCURRENCY_LIMIT_INGEST"):
        make_app(CONCURRENCY_LIMIT_INGEST=-1)


def test_openapi_documents_the_429_of_limited_routes(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    for path in ("/api/v1/entities/{entityName}/records/query", "/api/v1/entities/{entityName}/records/count",
                 "/api/v1/entities/{entityName}/records/aggregate", "/api/v1/analytics/events",
                 "/api/v1/analytics/events/batch"):
        described = spec["paths"][path]["post"]["responses"]["429"]["description"]
        assert "concurrency limit" in described, (path, described)
