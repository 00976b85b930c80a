"""platform_gateway_client against the live gateway (tests/client/conftest.py): every area, typed errors,
retries, paging, wait() and the token provider. Each test has its own organization."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid

import httpx
import pytest
from platform_gateway_client import (
    AsyncClient,
    Call,
    Client,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    RateLimitedError,
    RetryPolicy,
    ServiceUnavailableError,
    TransportError,
    UnauthorizedError,
    ValidationError,
)

from tests.client.conftest import INTERNAL_TOKEN, Sent, Sleeps
from tests.conftest import wait_for
from tests.images_fakes import Reply
from tests.support import token

SCHEMA = {"type": "object", "required": ["title"], "properties": {
    "title": {"type": "string"}, "amount": {"type": "float"}, "stage": {"type": "dropdown",
                                                                        "options": ["lead", "won", "lost"]}}}
AGENT = {"name": "support", "title": "Support", "type": "chat", "provider": "provider-x", "model": "large-chat"}


def _deals(api: Client, n: int = 0) -> list[dict]:
    api.entities.definitions.create({"name": "deals", "displayName": "Deals", "schema": SCHEMA})
    return [api.entities.records.create("deals", {"name": f"deal {i}", "fields": {
        "title": f"deal {i}", "amount": float(i * 100), "stage": "won" if i % 2 else "lead"}}) for i in range(n)]


# -- identity, health ------------------------------------------------------------------------------------------

def test_me_and_health(api, org_id, sent):
    me = api.me()
    assert me["orgId"] == org_id and me["product"] == "default" and set(me["scopes"]) == {"read", "write"}
    assert api.health()["status"] in ("ok", "degraded")
    assert "Authorization" not in sent.requests[-1].headers  # /health is called without the token
    assert sent.requests[0].headers["User-Agent"].startswith("platform-gateway-client/")


# -- agent registry ------------------------------------------------------------------------------------------------

def test_agents_crud_export_import_and_paging(api, sent):
    created = api.agents.create({**AGENT, "isDefault": True})
    assert created["id"] and created["status"] == "draft"
    assert api.agents.get(created["id"])["name"] == "support"
    assert api.agents.by_name("support")["id"] == created["id"]
    assert api.agents.default()["id"] == created["id"]
    updated = api.agents.update(created["id"], {"status": "active", "temperature": 0.3})
    assert updated["status"] == "active" and updated["temperature"] == 0.3

    exported = api.agents.export(created["id"])
    with pytest.raises(ConflictError) as taken:
        api.agents.import_(exported)
    assert taken.value.status == 409 and taken.value.code == "CONFLICT"
    assert api.agents.import_(exported, overwrite=True)["name"] == "support"

    for i in range(4):
        api.agents.create({**AGENT, "name": f"agent-{i}", "title": f"Agent {i}"})
    sent.requests.clear()
    names = [a["name"] for a in api.agents.iter(page_size=2)]
    assert names == sorted(names) and len(names) == len(set(names)) == 5
    assert len(sent.paths("GET")) == 3  # pages of 2, 2 and 1, following nextCursor
    assert [r.url.params.get("cursor") is not None for r in sent.requests] == [False, True, True]
    assert {s["name"] for s in api.agents.iter_summary(page_size=3)} == set(names)
    page = api.agents.list(limit=2)
    assert len(page["agents"]) == 2 and page["nextCursor"]

    assert api.agents.delete(created["id"]) == {"success": True}
    with pytest.raises(NotFoundError) as missing:
        api.agents.get(created["id"])
    assert missing.value.status == 404 and missing.value.request_id


def test_skills_tools_subagents_widgets(api):
    tool = api.tools.create({"name": "lookup_order", "description": "Find an order", "type": "api",
                             "inputSchema": {"type": "object", "properties": {"number": {"type": "string"}}}})
    assert api.tools.get(tool["id"])["name"] == "lookup_order"
    assert [t["id"] for t in api.tools.by_ids([tool["id"], "unknown"])] == [tool["id"]]
    assert api.tools.update(tool["id"], {"description": "Find an order by number"})["description"].endswith("number")
    assert [t["id"] for t in api.tools.iter()] == [tool["id"]]

    skill = api.skills.create({"name": "order-help", "title": "Order help", "category": "support",
                               "tools": [{"toolId": tool["id"], "toolName": "lookup_order", "enabled": True}]})
    assert api.skills.get(skill["id"])["name"] == "order-help"
    assert api.skills.by_name("order-help")["id"] == skill["id"]
    assert api.skills.update("order-help", {"title": "Order help v2"})["title"] == "Order help v2"
    assert api.skills.categories() == ["support"]
    assert [s["name"] for s in api.skills.iter()] == ["order-help"]

    sub = api.subagents.create({"name": "researcher", "model": "small-chat"})
    agent = api.agents.create({**AGENT, "subAgentIds": [sub["id"]]})
    with pytest.raises(ConflictError):
        api.subagents.delete(sub["id"])  # referenced by the agent
    assert api.subagents.update(sub["id"], {"description": "digs"})["description"] == "digs"
    assert [s["id"] for s in api.subagents.iter()] == [sub["id"]]

    first = api.widgets.create(agent["id"], {"name": "website", "greeting": "Hi!"})
    second = api.widgets.create(agent["id"], {"name": "app"})
    assert api.widgets.set_default(second["id"], agent["id"]) == {"success": True}
    assert api.widgets.default(agent["id"])["id"] == second["id"]
    assert api.widgets.update(first["id"], {"greeting": "Hello"})["greeting"] == "Hello"
    assert {w["id"] for w in api.widgets.iter(agent["id"], page_size=1)} == {first["id"], second["id"]}
    assert api.widgets.get(first["id"])["name"] == "website"
    assert api.widgets.delete(first["id"]) == {"success": True}

    assert api.subagents.delete(sub["id"], force=True) == {"success": True}
    assert api.skills.delete("order-help") == {"success": True}
    assert api.tools.delete(tool["id"]) == {"success": True}


# -- entity store ----------------------------------------------------------------------------------------------------

def test_definitions_views_and_records(api):
    _deals(api)
    assert api.entities.definitions.get("deals")["displayName"] == "Deals"
    assert [d["name"] for d in api.entities.definitions.list()] == ["deals"]
    assert api.entities.definitions.update("deals", {"description": "pipeline"}) == {"success": True}
    view_id = api.entities.views.create("deals", {"name": "Pipeline", "type": "kanban", "columns": ["title"]})
    assert [v["id"] for v in api.entities.views.list("deals")] == [view_id]
    other = api.entities.views.create("deals", {"name": "Table", "columns": ["title"]})
    assert [v["id"] for v in api.entities.views.iter("deals", page_size=1)] == [view_id, other]
    assert [d["name"] for d in api.entities.definitions.iter(page_size=1)] == ["deals"]
    assert api.entities.views.delete("deals", other) == {"success": True}
    assert api.entities.views.update("deals", view_id, {"name": "Board"}) == {"success": True}
    assert api.entities.views.delete("deals", view_id) == {"success": True}

    record = api.entities.records.create("deals", {"name": "ACME", "fields": {"title": "ACME", "stage": "lead"}})
    assert api.entities.records.get("deals", record["id"])["fields"]["title"] == "ACME"
    assert api.entities.records.update("deals", record["id"], {"fields": {"stage": "won"}}) == {"success": True}
    assert api.entities.records.get("deals", record["id"])["fields"]["stage"] == "won"

    with pytest.raises(ValidationError) as invalid:
        api.entities.records.create("deals", {"fields": {"title": 42}})
    assert invalid.value.status == 400 and invalid.value.code == "VALIDATION_ERROR"
    assert invalid.value.details  # the envelope's details, as sent

    other = api.entities.records.create("deals", {"name": "Globex", "fields": {"title": "Globex"}})
    rel = api.entities.records.relate("deals", record["id"], {"toEntityName": "deals", "toRecordId": other["id"],
                                                              "relationshipType": "partner"})
    listed = api.entities.records.relationships("deals", record["id"], direction="outgoing")
    assert [r["id"] for r in listed] == [rel["id"]]
    assert api.entities.records.unrelate("deals", record["id"], rel["id"]) == {"success": True}

    assert api.entities.records.delete("deals", record["id"]) == {"success": True}
    with pytest.raises(NotFoundError):
        api.entities.records.get("deals", record["id"])
    assert api.entities.definitions.delete("deals", delete_records=True) == {"success": True}


def test_query_iter_follows_next_cursor_and_count_aggregate(api, sent):
    _deals(api, 7)
    page = api.entities.records.query("deals", filters={"stage": "won"}, sort_by="amount", sort_order="desc")
    assert [r["fields"]["amount"] for r in page["records"]] == [500.0, 300.0, 100.0]
    assert sent.requests[-1].read() and b'"sortOrder":-1' in sent.requests[-1].content.replace(b" ", b"")

    sent.requests.clear()
    amounts = [r["fields"]["amount"] for r in api.entities.records.iter("deals", page_size=3, sort_by="amount")]
    assert amounts == [i * 100.0 for i in range(7)]
    queries = [r for r in sent.requests if r.url.path.endswith("/query")]
    assert len(queries) == 3  # 3 + 3 + 1, the 2nd and 3rd by the previous page's nextCursor
    assert [b'"cursor"' in r.content for r in queries] == [False, True, True]

    assert api.entities.records.count("deals", {"stage": "lead"}) == 4
    agg = api.entities.records.aggregate("deals", [{"function": "count"}, {"function": "sum", "field": "amount",
                                                                           "alias": "total"}],
                                         group_by=["stage"], sort_by="total", sort_order="desc")
    assert [(g["key"]["stage"], g["values"]["total"]) for g in agg["groups"]] == [("lead", 1200.0), ("won", 900.0)]


def test_bulk_sync_and_as_a_job_with_wait(api):
    _deals(api)
    result = api.entities.records.bulk_create("deals", [{"fields": {"title": f"b{i}"}} for i in range(3)])
    assert result["count"] == 3
    ids = [r["id"] for r in api.entities.records.iter("deals")]
    changes = [{"id": i, "fields": {"stage": "lost"}} for i in ids]
    assert api.entities.records.bulk_update("deals", changes)["count"] == 3

    accepted = api.entities.records.start_bulk_create("deals", [{"fields": {"title": f"j{i}"}} for i in range(4)])
    job = api.jobs.wait(accepted["jobId"], timeout=120)
    assert job["status"] == "succeeded" and job["result"]["count"] == 4
    assert api.entities.records.count("deals") == 7

    accepted = api.entities.records.start_bulk_delete("deals", ids)
    assert api.jobs.wait(accepted["jobId"], timeout=120)["result"]["count"] == 3
    assert api.jobs.get(accepted["jobId"])["status"] == "succeeded"
    remaining = [r["id"] for r in api.entities.records.iter("deals")]
    assert api.entities.records.bulk_delete("deals", remaining)["count"] == 4


def test_admin_upsert_definitions_needs_the_admin_role(make_client):
    with pytest.raises(ForbiddenError) as refused:
        make_client().admin.upsert_definitions([{"name": "deals", "displayName": "Deals", "schema": SCHEMA}])
    assert refused.value.status == 403 and refused.value.code == "FORBIDDEN"
    admin = make_client(role="admin")
    assert admin.admin.upsert_definitions([{"name": "deals", "displayName": "Deals", "schema": SCHEMA}])["created"] == 1


# -- analytics, email, newsletter, seeding -------------------------------------------------------------------------

def test_analytics_ingest_and_dashboards(api, make_client):
    event_id = api.analytics.record_event({"sessionId": "tab-1", "userId": "u-1", "eventType": "page_view",
                                           "eventCategory": "navigation", "pagePath": "/pricing"})
    batch = api.analytics.record_events([{"sessionId": "tab-1", "userId": "u-1", "eventType": "click",
                                          "eventCategory": "ui"} for _ in range(3)])
    assert batch["accepted"] == 3 and len(batch["eventIds"]) == 3
    assert api.analytics.track({"sessionId": "tab-1", "userId": "u-1", "eventType": "scroll",
                                "eventCategory": "ui"}) is True
    assert api.analytics.track({"sessionId": "", "eventType": "x"}) is False  # refused, and swallowed
    events = wait_for(lambda: (lambda found: found if len(found) == 5 else None)(
        list(api.analytics.iter_events(page_size=2))), timeout=60, what="5 events stored")
    assert event_id in {e.get("eventId") for e in events}
    assert api.analytics.events(event_type="page_view")["data"][0]["pagePath"] == "/pricing"
    assert api.analytics.summary()["success"] is True
    assert isinstance(api.analytics.daily()["data"], list) and isinstance(api.analytics.usage()["data"], list)
    assert isinstance(api.analytics.agents()["data"], list) and list(api.analytics.iter_chats()) == []
    with pytest.raises(ForbiddenError):
        api.analytics.global_summary()
    admin = make_client(role="admin")
    assert admin.analytics.global_summary()["success"] is True
    assert isinstance(admin.analytics.global_orgs()["data"], list)
    assert isinstance(admin.analytics.global_channels()["data"], list)
    assert isinstance(admin.analytics.channel_daily("web")["data"], list)
    assert isinstance(admin.analytics.channel_orgs("web")["data"], list)


def test_email_bulk_wait_and_newsletter(api):
    sent_one = api.email.send(to=["ann@example.com"], subject="Welcome", body="<p>Hi</p>")
    assert sent_one["success"] is True
    accepted = api.email.bulk_send(recipients=["a@example.com", "b@example.com", "a@example.com"],
                                   subject="Launch", body="<p>We launched</p>")
    assert accepted["total"] == 2
    job = api.email.wait(accepted["jobId"], timeout=120, poll_interval=0.2)
    assert job["status"] == "done" and job["counts"]["sent"] == 2
    assert api.email.job(accepted["jobId"])["id"] == accepted["jobId"]
    assert sorted(d["to"] for d in api.email.iter_recipients(accepted["jobId"], page_size=1)) == [
        "a@example.com", "b@example.com"]

    for address in ("x@example.com", "y@example.com", "z@example.com"):
        assert api.newsletter.subscribe(address, name=address[0])["status"] == "active"
    assert len(list(api.newsletter.iter_subscribers(page_size=2))) == 3
    assert api.newsletter.unsubscribe("z@example.com")["status"] == "unsubscribed"
    assert len(api.newsletter.subscribers(status="active")["subscribers"]) == 2
    issue = api.newsletter.send_issue(subject="November", body="<h1>News</h1>")
    assert api.email.wait(issue["jobId"], timeout=120, poll_interval=0.2)["counts"]["sent"] == 2
    assert [i["id"] for i in api.newsletter.issues()] == [issue["jobId"]]


def test_seed_with_the_internal_token_sync_and_as_a_task(gateway, sent, sleeps):
    org = f"seed-{uuid.uuid4().hex[:8]}.example.com"
    with Client(gateway.url, internal_token=INTERNAL_TOKEN, sleep=sleeps) as ops:
        report = ops.admin.seed({"title": "Acme", "mainDomain": org, "product": "default"},
                                {"email": f"ada@{org}", "firstName": "Ada", "lastName": "Lovelace"})
        assert report["created"] is True and report["summary"]["total"] == 15
        again = ops.admin.seed({"title": "Acme", "mainDomain": org, "product": "default"},
                               {"email": f"ada@{org}", "firstName": "Ada", "lastName": "Lovelace"})
        assert again["created"] is False
        other = f"seed-{uuid.uuid4().hex[:8]}.example.com"
        queued = ops.admin.start_seed({"title": "Globex", "mainDomain": other, "product": "default"},
                                      {"email": f"bob@{other}", "firstName": "Bob", "lastName": "B"})
        status = ops.admin.wait_seed(queued["orgId"], timeout=180, poll_interval=0.2)
        assert status["summary"] == {"total": 15, "existing": 15, "missing": 0}
        # (without a broker the seed runs inside the request and no request is kept: lastRequest null)
        assert (status["lastRequest"] or {"status": "done"})["status"] == "done"


# -- typed errors, token provider ------------------------------------------------------------------------------------

def test_a_token_of_another_secret_is_unauthorized(make_client, org_id):
    client = make_client(token(org=org_id, secret="another-secret-" + "q" * 40))
    with pytest.raises(UnauthorizedError) as exc:
        client.me()
    assert exc.value.status == 401 and exc.value.code == "UNAUTHORIZED" and exc.value.message


def test_token_provider_is_asked_per_request_and_refreshes_once_after_401(make_client, org_id, sent):
    tokens = [token(org=org_id, ttl=-120), token(org=org_id)]  # the first has expired
    calls: list[str] = []

    def provider() -> str:
        calls.append(tokens[0] if not calls else tokens[-1])
        return calls[-1]

    client = make_client(provider)
    assert client.me()["orgId"] == org_id
    assert len(calls) == 2 and len(sent.requests) == 2  # 401 with the expired token, then the fresh one
    assert [r.headers["Authorization"] for r in sent.requests] == [f"Bearer {t}" for t in tokens]
    client.me()
    assert len(calls) == 3  # asked again for the next request

    stale = token(org=org_id, ttl=-120)
    asked: list[int] = []
    same = make_client(lambda: asked.append(1) or stale)
    sent.requests.clear()
    with pytest.raises(UnauthorizedError):
        same.me()
    assert len(sent.requests) == 1 and len(asked) == 2  # asked again after the 401; same token: no repeat


# -- retries -----------------------------------------------------------------------------------------------------------

def test_429_is_retried_after_retry_after_and_the_call_succeeds(api, sent, sleeps):
    _deals(api, 1)
    for _ in range(3):  # the limit is 2 per 5 s (conftest): the third is refused once, then passes
        assert api.entities.records.aggregate("deals", [{"function": "count"}])["groups"][0]["count"] == 1
    refused = [r for r in sent.responses if r.status_code == 429]
    assert len(refused) == 1 and refused[0].json()["error"]["code"] == "RATE_LIMITED"
    retry_after = float(refused[0].headers["Retry-After"])
    assert len(sleeps) == 1 and retry_after <= sleeps[0] <= retry_after + 0.05  # honoured (+ jitter ≤ base)


def test_429_beyond_max_retry_after_or_without_retries_is_raised_typed(make_client, sleeps):
    api = make_client(retry=RetryPolicy(max_retry_after=0.5))
    _deals(api, 1)
    api.entities.records.aggregate("deals", [{"function": "count"}])
    api.entities.records.aggregate("deals", [{"function": "count"}])
    with pytest.raises(RateLimitedError) as limited:
        api.entities.records.aggregate("deals", [{"function": "count"}])
    assert limited.value.status == 429 and 0 < limited.value.retry_after <= 5 and sleeps == []
    no_retries = make_client(retry=RetryPolicy(max_retries=0))
    with pytest.raises(RateLimitedError):
        no_retries.entities.records.aggregate("deals", [{"function": "count"}])
    assert sleeps == []


def test_upstream_503_is_retried_with_the_same_idempotency_key(api, gateway, sent, sleeps):
    gateway.fake_a.reset()
    gateway.fake_a.reply(Reply(429, {"error": {"code": "429", "message": "slow down"}}, {"Retry-After": "1"}))
    image = api.images.generate(provider="provider-a", model="gpt-image-1", prompt="a red fox in snow")
    assert image["provider"] == "provider-a" and image["mimeType"].startswith("image/") and image["bytes"] > 0
    statuses = [r.status_code for r in sent.responses]
    assert statuses == [503, 200]  # the gateway's 503 (upstream 429) carried Retry-After: 1
    keys = [r.headers["Idempotency-Key"] for r in sent.requests]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) == 32  # one key per logical call
    assert len(sleeps) == 1 and sleeps[0] >= 1
    api.images.generate(provider="provider-a", model="gpt-image-1", prompt="again")
    assert sent.requests[-1].headers["Idempotency-Key"] != keys[0]  # a new logical call, a new key


def test_a_post_without_idempotency_key_is_not_retried_after_503(api, gateway, sent, sleeps):
    gateway.fake_a.reset()
    gateway.fake_a.reply(Reply(429, {"error": {"code": "429", "message": "slow down"}}, {"Retry-After": "1"}))
    with pytest.raises(ServiceUnavailableError) as unavailable:
        api.request(Call("POST", "/api/v1/agents/images", json={"provider": "provider-a", "model": "gpt-image-1",
                                                                 "prompt": "no key"}))
    assert unavailable.value.retry_after == 1 and unavailable.value.details["upstreamStatus"] == 429
    assert len(sent.requests) == 1 and "Idempotency-Key" not in sent.requests[0].headers and sleeps == []


def test_connection_errors_are_retried_with_backoff_then_raised(sleeps):
    with socket_closed() as url:
        client = Client(url, token="t", retry=RetryPolicy(max_retries=3, backoff_base=0.01), sleep=sleeps)
        with pytest.raises(TransportError) as lost:
            client.entities.records.create("deals", {"fields": {}})  # never connected: safe even for a POST
        client.close()
    assert isinstance(lost.value.__cause__, httpx.ConnectError)
    assert len(sleeps) == 3 and all(0 <= s <= 0.08 for s in sleeps)


class socket_closed:
    """A loopback URL where nothing listens (the port was bound, then released)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{s.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        return None


# -- the asynchronous client ---------------------------------------------------------------------------------------

def test_async_client_same_resources(gateway, org_id):
    sent, sleeps = Sent(), Sleeps()

    async def scenario() -> None:
        http = httpx.AsyncClient(base_url=gateway.url, event_hooks=sent.async_hooks(), timeout=30)

        async def provider() -> str:  # an async token provider
            return token(org=org_id)

        async with AsyncClient(token=provider, http=http, sleep=sleeps.async_sleep) as api:
            assert (await api.me())["orgId"] == org_id
            await api.entities.definitions.create({"name": "deals", "displayName": "Deals", "schema": SCHEMA})
            await asyncio.gather(*(api.entities.records.create("deals", {"fields": {"title": f"t{i}"}})
                                   for i in range(5)))
            titles = [r["fields"]["title"] async for r in api.entities.records.iter("deals", page_size=2,
                                                                                     sort_by="title")]
            assert titles == [f"t{i}" for i in range(5)]
            accepted = await api.entities.records.start_bulk_create("deals", [{"fields": {"title": "x"}}])
            assert (await api.jobs.wait(accepted["jobId"], timeout=120))["result"]["count"] == 1
            agent = await api.agents.create(AGENT)
            assert [a["id"] async for a in api.agents.iter()] == [agent["id"]]
            with pytest.raises(NotFoundError):
                await api.agents.get("missing")
        await http.aclose()

    asyncio.run(scenario())
    assert len([p for p in sent.paths() if p.endswith("/query")]) == 3


def test_a_key_still_in_use_is_waited_for_and_the_first_answer_replayed(api, make_client, gateway, sent, sleeps):
    gateway.fake_a.reset()
    answer = gateway.fake_a._next_reply  # the stand-in upstream answers the first image call after 3 s
    slowed = []

    def slow_first(request):
        reply = answer(request)
        if not slowed:
            slowed.append(request)
            return dataclasses.replace(reply, delay=3.0)
        return reply

    gateway.fake_a._next_reply = slow_first
    try:
        key = uuid.uuid4().hex
        first_client = make_client()
        results = {}
        first = threading.Thread(target=lambda: results.setdefault("first", first_client.images.generate(
            provider="provider-a", model="gpt-image-1", prompt="a slow fox", idempotency_key=key)))
        first.start()
        deadline = time.monotonic() + 30
        while not gateway.fake_a.received and time.monotonic() < deadline:  # the first call reached upstream
            time.sleep(0.05)
        before = len(sent.responses)
        again = api.images.generate(provider="provider-a", model="gpt-image-1", prompt="a slow fox",
                                    idempotency_key=key)
        first.join(30)
    finally:
        gateway.fake_a._next_reply = answer
    mine = sent.responses[before:]
    assert [r.status_code for r in mine][0] == 409 and mine[0].json()["error"]["code"] == "IDEMPOTENCY_KEY_IN_USE"
    assert mine[-1].status_code == 200 and mine[-1].headers["Idempotent-Replayed"] == "true"
    assert {r.headers["Idempotency-Key"] for r in sent.requests[before:]} == {key}
    assert sleeps and sleeps[0] >= 1  # waited as Retry-After said
    assert again == results["first"] and len(gateway.fake_a.received) == 1  # one upstream call in all
