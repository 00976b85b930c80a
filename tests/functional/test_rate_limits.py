"""Per-organization rate limits on the costly routes (issue 12): 429 RATE_LIMITED, Retry-After and
RateLimit-* headers, per-route settings, Redis shared counts and the in-process fallback."""

from __future__ import annotations

import uuid

import pytest

from app.ratelimit import Policy, parse_policy
from tests.functional.entities_support import BASE, create_definition, org_headers
from tests.support import assert_error

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
AGG = {"aggregates": [{"function": "sum", "field": "n"}]}


def _aggregate(client, headers):
    return client.post(f"{BASE}/things/records/aggregate", json=AGG, headers=headers)


def _assert_limited(resp, limit: int):
    body = assert_error(resp, 429, "RATE_LIMITED")
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.headers["RateLimit-Limit"] == str(limit) and resp.headers["RateLimit-Remaining"] == "0"
    assert body["error"]["details"]["limit"] == limit


def test_aggregate_limit_per_org_with_headers(make_app, auth):
    client = make_app(RATE_LIMIT_AGGREGATE="3/60").test_client()
    headers = auth()
    create_definition(client, headers, "things", SCHEMA)
    for remaining in (2, 1, 0):
        resp = _aggregate(client, headers)
        assert resp.status_code == 200, resp.get_json()
        assert resp.headers["RateLimit-Limit"] == "3"
        assert resp.headers["RateLimit-Remaining"] == str(remaining)
        assert 1 <= int(resp.headers["RateLimit-Reset"]) <= 60
        assert resp.headers["RateLimit-Policy"] == "3;w=60"
    _assert_limited(_aggregate(client, headers), 3)
    # another organization has its own budget; other routes are not limited by this one
    _, other = org_headers()
    create_definition(client, other, "things", SCHEMA)
    assert _aggregate(client, other).status_code == 200
    resp = client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=headers)
    assert resp.status_code == 200 and "RateLimit-Limit" not in resp.headers


def test_bulk_async_email_and_images_are_limited(make_app, auth):
    client = make_app(RATE_LIMIT_BULK="1/60", RATE_LIMIT_EMAIL="1/60", RATE_LIMIT_IMAGES="1/60").test_client()
    headers = auth()
    create_definition(client, headers, "things", SCHEMA)
    body = {"records": [{"fields": {"n": 1}}]}
    assert client.post(f"{BASE}/things/records/bulk/create", json=body, headers=headers).status_code == 200
    resp = client.post(f"{BASE}/things/records/bulk/create", json=body,
                       headers={**headers, "Prefer": "respond-async"})
    _assert_limited(resp, 1)
    mail = {"to": ["a@example.com"], "subject": "s", "body": "b"}
    mail_headers = auth("write:notifications")
    assert client.post("/api/v1/email/send", json=mail, headers=mail_headers).status_code == 200
    _assert_limited(client.post("/api/v1/email/send", json=mail, headers=mail_headers), 1)
    image = {"prompt": "a red bicycle", "provider": "provider-a", "model": "gpt-image-1"}
    image_headers = auth("write:image-gen")
    first = client.post("/api/v1/agents/images", json=image, headers=image_headers)
    assert first.status_code != 429  # (503 here: no provider configured; the attempt still counts)
    _assert_limited(client.post("/api/v1/agents/images", json=image, headers=image_headers), 1)


def test_bulk_email_and_newsletter_issues_count_against_the_email_limit(make_app, auth):
    """One `email` limit per org: a bulk send or a newsletter issue is one call, like a single send."""
    client = make_app(RATE_LIMIT_EMAIL="2/60").test_client()
    headers = auth("write:notifications")
    bulk = {"recipients": ["a@example.com", "b@example.com"], "subject": "s", "body": "b"}
    assert client.post("/api/v1/email/bulk-send", json=bulk, headers=headers).status_code == 202
    assert client.post("/api/v1/newsletter/issues", json={"subject": "s", "body": "b"},
                       headers=headers).status_code == 202
    _assert_limited(client.post("/api/v1/email/bulk-send", json=bulk, headers=headers), 2)
    _assert_limited(client.post("/api/v1/newsletter/issues", json={"subject": "s", "body": "b"}, headers=headers), 2)
    _assert_limited(client.post("/api/v1/email/send", json={"to": ["a@example.com"], "subject": "s", "body": "b"},
                                headers=headers), 2)


def test_similar_queries_are_limited_but_plain_queries_are_not(make_app, auth):
    client = make_app(RATE_LIMIT_SIMILAR="1/60").test_client()
    headers = auth()
    create_definition(client, headers, "things", SCHEMA, embeddingsConfig={"enabled": True, "fields": ["body"]})
    similar = {"query": {"filters": {"$similar": "bicycles"}}}
    assert client.post(f"{BASE}/things/records/query", json=similar, headers=headers).status_code == 200
    _assert_limited(client.post(f"{BASE}/things/records/query", json=similar, headers=headers), 1)
    for _ in range(3):
        assert client.post(f"{BASE}/things/records/query", json={"query": {}}, headers=headers).status_code == 200


def test_redis_counts_are_shared_between_processes(make_app, redis_url, auth):
    shared = {"REDIS_URL": redis_url, "CELERY_KEY_PREFIX": f"test-rl-{uuid.uuid4().hex[:8]}:",
              "RATE_LIMIT_AGGREGATE": "2/60"}
    first, second = make_app(**shared).test_client(), make_app(**shared).test_client()
    headers = auth()
    create_definition(first, headers, "things", SCHEMA)
    assert _aggregate(first, headers).status_code == 200
    assert _aggregate(second, headers).status_code == 200
    _assert_limited(_aggregate(first, headers), 2)  # the second app's request counted in Redis


def test_redis_outage_falls_back_to_in_process_limits(make_app, auth):
    dead = "redis://127.0.0.1:1/0"
    client = make_app(REDIS_URL=dead, RATE_LIMIT_AGGREGATE="2/60").test_client()
    headers = auth()
    create_definition(client, headers, "things", SCHEMA)
    assert _aggregate(client, headers).status_code == 200  # Redis down: the route still answers
    assert _aggregate(client, headers).status_code == 200
    _assert_limited(_aggregate(client, headers), 2)


def test_unlimited_by_setting_and_policy_parsing(make_app, auth):
    client = make_app(RATE_LIMIT_AGGREGATE="").test_client()
    headers = auth()
    create_definition(client, headers, "things", SCHEMA)
    for _ in range(3):
        resp = _aggregate(client, headers)
        assert resp.status_code == 200 and "RateLimit-Limit" not in resp.headers
    assert parse_policy("30/60") == Policy(30, 60) and parse_policy("5") == Policy(5, 60)
    assert parse_policy("0") is None and parse_policy(" ") is None
    for bad in ("x/60", "5/0", "-1/60"):
        with pytest.raises(ValueError):
            parse_policy(bad)
    with pytest.raises(ValueError):
        make_app(RATE_LIMIT_EMAIL="lots")


def test_openapi_declares_429_on_limited_operations_and_413_415_on_json_bodies(client):
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]
    limited = {("/api/v1/entities/{entityName}/records/aggregate", "post"),
               ("/api/v1/entities/{entityName}/records/bulk/create", "post"),
               ("/api/v1/entities/{entityName}/records/query", "post"),  # $similar
               ("/api/v1/entities/{entityName}/records/count", "post"),
               ("/api/v1/agents/images", "post"), ("/api/v1/email/send", "post"),
               ("/api/v1/email/bulk-send", "post"), ("/api/v1/newsletter/issues", "post")}
    for path, method in limited:
        responses = paths[path][method]["responses"]
        assert "429" in responses, path
        assert {"413", "415"} <= set(responses), path
    assert "429" not in paths["/api/v1/entities/{entityName}/records"]["post"]["responses"]
    assert {"413", "415"} <= set(paths["/api/v1/entities/{entityName}/records"]["post"]["responses"])
    record_get = paths["/api/v1/entities/{entityName}/records/{recordId}"]["get"]["responses"]
    assert not {"413", "415", "429"} & set(record_get)
