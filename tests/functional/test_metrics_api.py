"""GET /metrics of the API (app.observability.metrics), in-process through the HTTP interface: who may
read it, what the request, refusal, upstream and deployment families say, and that no organization or
record id becomes a label. (The scrape by a real Prometheus of gunicorn + a worker, in multiprocess
mode: test_metrics_prometheus.py.)"""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.functional.entities_support import BASE, create_definition

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
TOKEN = "metrics-token-" + "m" * 32
INTERNAL = {"X-Internal-Token": TOKEN}


def scrape(client) -> dict[tuple[str, tuple], float]:
    resp = client.get("/metrics", headers=INTERNAL)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture()
def metrics_client(make_app):
    return make_app(INTERNAL_API_TOKEN=TOKEN, RATE_LIMIT_AGGREGATE="1/60", MAX_CONTENT_LENGTH=4096).test_client()


def test_metrics_are_closed_without_the_internal_token(make_app, client):
    # no INTERNAL_API_TOKEN on the deployment: closed to everyone, in the JSON envelope
    resp = client.get("/metrics", headers={"X-Internal-Token": "anything"})
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "UNAUTHORIZED"
    assert "INTERNAL_API_TOKEN" in resp.get_json()["error"]["message"]
    closed = make_app(INTERNAL_API_TOKEN=TOKEN).test_client()
    for headers in ({}, {"X-Internal-Token": "wrong"}, {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Basic {TOKEN}"}):
        resp = closed.get("/metrics", headers=headers)
        assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "UNAUTHORIZED", headers
    # the token as X-Internal-Token, or as a Bearer token (what Prometheus' `authorization` sends)
    assert closed.get("/metrics", headers=INTERNAL).status_code == 200
    assert closed.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_metrics_can_be_turned_off(make_app):
    off = make_app(INTERNAL_API_TOKEN=TOKEN, METRICS_ENABLED=False).test_client()
    assert off.get("/metrics", headers=INTERNAL).status_code == 404


def test_requests_are_counted_by_route_template_never_by_id(metrics_client, auth, org_id):
    headers = auth()
    create_definition(metrics_client, headers, "things", SCHEMA)
    record_id = str(uuid.uuid4())
    before = scrape(metrics_client)
    route = f"{BASE}/<string:entityName>/records/<string:recordId>"
    labels = {"route": route, "method": "GET", "status": "404"}
    for _ in range(3):
        assert metrics_client.get(f"{BASE}/things/records/{record_id}", headers=headers).status_code == 404
    after = scrape(metrics_client)
    counted = (value(after, "gateway_http_request_duration_seconds_count", **labels)
               - value(before, "gateway_http_request_duration_seconds_count", **labels))
    assert counted == 3
    assert value(after, "gateway_http_request_duration_seconds_bucket", le="+Inf", **labels) >= 3
    body = metrics_client.get("/metrics", headers=INTERNAL).get_data(as_text=True)
    assert record_id not in body and org_id not in body  # no ids as labels
    # a path no route matches is one label value, whatever the path
    metrics_client.get(f"/no-such-{uuid.uuid4().hex}", headers=headers)
    assert value(scrape(metrics_client), "gateway_http_request_duration_seconds_count", route="unmatched",
                 method="GET", status="404") >= 1
    # the request being answered (this scrape) is in flight
    assert value(after, "gateway_http_requests_in_flight") >= 1


def test_refusals_429_413_415_are_counted_by_route_group(metrics_client, auth):
    headers = auth()
    create_definition(metrics_client, headers, "things", SCHEMA)
    aggregate = {"aggregates": [{"function": "sum", "field": "n"}]}
    before = scrape(metrics_client)
    url = f"{BASE}/things/records/aggregate"
    assert metrics_client.post(url, json=aggregate, headers=headers).status_code == 200
    assert metrics_client.post(url, json=aggregate, headers=headers).status_code == 429
    too_big = {"records": [{"fields": {"n": 1, "body": "x" * 8000}}]}
    assert metrics_client.post(f"{BASE}/things/records/bulk/create", json=too_big, headers=headers).status_code == 413
    assert metrics_client.post(f"{BASE}/things/records", data="n=1", headers={**headers, "Content-Type": "text/plain"}
                               ).status_code == 415
    after = scrape(metrics_client)

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("gateway_rate_limited_total", group="aggregate") == 1
    refusals = {status: sum(v - value(before, name, **dict(labels)) for (name, labels), v in after.items()
                            if name == "gateway_http_refusals_total" and dict(labels)["status"] == status)
                for status in ("429", "413", "415")}
    assert refusals == {"429": 1, "413": 1, "415": 1}
    # the route group is the blueprint of the route (here the entity store's), never a path
    groups = {dict(labels)["group"] for (name, labels), v in after.items()
              if name == "gateway_http_refusals_total" and v > value(before, name, **dict(labels))}
    assert groups == {"entities", "entity_aggregation"}


def test_the_deployment_gauges_are_read_at_scrape_time(metrics_client):
    samples = scrape(metrics_client)
    for source in ("queues", "outbox", "analytics", "rollouts"):
        assert value(samples, "gateway_metrics_source_up", source=source) == 1, source
    for name in ("gateway_outbox_backlog_rows", "gateway_outbox_oldest_age_seconds",
                 "gateway_analytics_buffer_events", "gateway_analytics_buffer_oldest_age_seconds",
                 "gateway_rollouts_active", "gateway_rollout_orgs_total", "gateway_rollout_orgs_done"):
        assert (name, ()) in samples, name
    # families known in advance exist before their first event
    assert ("gateway_smtp_deliveries_total", (("outcome", "sent"),)) in samples
    assert ("gateway_lease_reaps_total", (("kind", "rollout"),)) in samples
    assert ("gateway_db_pool_connections_in_use", ()) in samples


def test_pooled_connections_in_use_are_this_processes_count_when_scraped(make_app):
    app = make_app(INTERNAL_API_TOKEN=TOKEN)
    client = app.test_client()
    engine = app.extensions["db"].engine
    before = value(scrape(client), "gateway_db_pool_connections_in_use")
    held = [engine.connect(), engine.connect()]
    try:
        # the scrape writes its own process's count before it reads (the others' are written each second)
        assert value(scrape(client), "gateway_db_pool_connections_in_use") == before + 2
    finally:
        for connection in held:
            connection.close()
    assert value(scrape(client), "gateway_db_pool_connections_in_use") == before


def test_an_image_provider_call_is_timed_by_provider_model_family_and_outcome(make_app, auth):
    from tests.images_fakes import FakeAzureImages, Reply

    fake = FakeAzureImages()
    try:
        client = make_app(INTERNAL_API_TOKEN=TOKEN, PROVIDER_A_ENDPOINT=fake.url,
                          PROVIDER_A_API_KEY=FakeAzureImages.API_KEY,
                          PROVIDER_A_API_VERSION=FakeAzureImages.GENERATION_VERSION,
                          PROVIDER_A_EDIT_API_VERSION=FakeAzureImages.EDIT_VERSION).test_client()
        before = scrape(client)
        body = {"prompt": "a red bicycle", "provider": "provider-a", "model": "gpt-image-1"}
        headers = auth("write:image-gen")
        assert client.post("/api/v1/agents/images", json=body, headers=headers).status_code == 200
        fake.reply(Reply(500, b'{"error": {"message": "boom"}}'), Reply(500, b'{"error": {"message": "boom"}}'))
        failed = client.post("/api/v1/agents/images", json=body, headers=headers)
        assert failed.status_code >= 500
        after = scrape(client)
    finally:
        fake.close()
    name = "gateway_image_provider_request_duration_seconds_count"
    ok = [labels for (n, labels), v in after.items()
          if n == name and dict(labels)["outcome"] == "ok" and v > value(before, n, **dict(labels))]
    assert len(ok) == 1 and dict(ok[0])["provider"] == "provider-a"
    code = failed.get_json()["error"]["code"]
    assert any(n == name and dict(labels)["outcome"] == code and v > value(before, n, **dict(labels))
               for (n, labels), v in after.items())


def test_a_second_worker_on_one_host_serves_its_metrics_on_the_next_free_port(make_app):
    import socket
    import urllib.error
    import urllib.request

    from app.observability.metrics import serve_worker

    with socket.socket() as probe:  # a free port to start from
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = make_app(INTERNAL_API_TOKEN=TOKEN, WORKER_METRICS_PORT=port)
    first, second = serve_worker(app), serve_worker(app)
    try:
        assert first is not None and second is not None
        assert first.server_port == port and second.server_port != port
        assert port < second.server_port < port + 10
        for server in (first, second):
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            with urllib.request.urlopen(urllib.request.Request(url, headers=INTERNAL), timeout=10) as resp:
                assert resp.status == 200 and b"# HELP" in resp.read()
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10)
            assert refused.value.code == 401
    finally:
        for server in (first, second):
            if server is not None:
                server.shutdown()
                server.server_close()
