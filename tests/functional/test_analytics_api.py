"""Analytics through HTTP: ingest (inline and with a real worker), chat facts, every dashboard,
global and per-channel roll-ups, date windows, isolation by org and product."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from tests.conftest import wait_for
from tests.support import assert_error

API = "/api/v1/analytics"
DAY = "2026-03-10"
G = "2026-04-10"  # the global test's day


def chat_events(chat: str, *, user="u1", agent="agent-1", channel="web", day=DAY, hour=10, messages=2,
                csat=None, tokens=(10, 20), cost=0.01, name="Agent One"):
    """One chat as the chat service reports it: started, messages, ended, csat."""
    base = {"sessionId": f"s-{chat}", "userId": user, "eventCategory": "chat"}
    props = {"chatId": chat, "agentId": agent, "agentName": name, "channel": channel}
    out = [{**base, "eventId": f"{chat}-start", "eventType": "chat_started",
            "timestamp": f"{day}T{hour:02d}:00:00Z", "properties": props}]
    for i in range(messages):
        out.append({**base, "eventId": f"{chat}-m{i}", "eventType": "message",
                    "timestamp": f"{day}T{hour:02d}:0{i + 1}:00Z",
                    "properties": {**props, "direction": "inbound" if i % 2 == 0 else "outbound",
                                   "model": "gpt-x", "service": "chat", "inputTokens": tokens[0],
                                   "outputTokens": tokens[1], "cost": cost}})
    out.append({**base, "eventId": f"{chat}-end", "eventType": "chat_ended",
                "timestamp": f"{day}T{hour:02d}:10:00Z", "properties": props})
    if csat is not None:
        out.append({**base, "eventId": f"{chat}-csat", "eventType": "csat",
                    "timestamp": f"{day}T{hour:02d}:11:00Z", "properties": {**props, "score": csat}})
    return out


def post_all(client, headers, events):
    for event in events:
        r = client.post(f"{API}/events", json=event, headers=headers)
        assert r.status_code == 202, r.get_json()


def get(client, headers, path, **params):
    r = client.get(f"{API}/{path}", query_string=params, headers=headers)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["success"] is True
    return body["data"]


WINDOW = {"from": DAY, "to": DAY}


@pytest.fixture(scope="module")
def inline_app(app, database_url):
    """Without REDIS_URL the ingest writes inline: most tests read right after they post."""
    from app import create_app
    from app.extensions import celery_app
    from app.tasks import init_celery
    from tests.conftest import app_config

    inline = create_app(app_config(database_url, REDIS_URL=""))
    init_celery(celery_app, app)  # Celery configuration is process-global: keep the main test app's
    return inline                 # (the inline ingest path does not use Celery)


@pytest.fixture()
def client(inline_app):
    return inline_app.test_client()


def test_inline_ingest_feeds_every_dashboard(client, auth):
    h = auth("read", "write")
    post_all(client, h, chat_events("c1", csat=5) + chat_events("c2", user="u2", csat=3, hour=11)
             + chat_events("c3", user="u1", agent="agent-2", channel="whatsapp", messages=4, hour=12))
    post_all(client, h, [{"sessionId": "s", "userId": "u9", "eventType": "page_view",
                          "eventCategory": "navigation", "pagePath": "/x", "timestamp": f"{DAY}T09:00:00Z"}])
    s = get(client, h, "summary", **WINDOW)
    assert s == {"total_chats": 3, "total_messages": 8, "total_tokens": 240, "total_cost": 0.08,
                 "unique_users": 2, "avg_session_duration": 600.0}  # csat does not lengthen a chat
    chats = get(client, h, "chats", **WINDOW)
    assert [c["chat_id"] for c in chats] == ["c3", "c2", "c1"]
    assert chats[2] == {"chat_id": "c1", "agent_id": "agent-1", "user_id": "u1", "message_count": 2,
                        "total_tokens": 60, "duration_secs": 600.0, "csat_score": 5.0,
                        "created_at": f"{DAY}T10:00:00.000Z"}
    assert [c["chat_id"] for c in get(client, h, "chats", agent_id="agent-2", **WINDOW)] == ["c3"]
    agents = {a["agent_id"]: a for a in get(client, h, "agents", **WINDOW)}
    assert agents["agent-1"] == {"agent_id": "agent-1", "agent_name": "Agent One", "total_chats": 2,
                                 "total_messages": 4, "total_tokens": 120, "avg_duration_secs": 600.0,
                                 "unique_users": 2, "avg_csat": 4.0}
    assert agents["agent-2"]["avg_csat"] is None
    assert get(client, h, "usage", **WINDOW) == [
        {"service": "chat", "model": "gpt-x", "input_tokens": 80, "output_tokens": 160, "total_tokens": 240,
         "cost": 0.08, "request_count": 8}]
    assert get(client, h, "daily", **WINDOW) == [
        {"date": DAY, "total_chats": 3, "total_messages": 8, "total_tokens": 240, "unique_users": 2}]
    events = get(client, h, "events", **WINDOW)
    assert len(events) == 17 and events[-1]["eventType"] == "page_view"
    assert set(events[0]) == {"eventId", "orgId", "sessionId", "userId", "eventType", "eventCategory",
                              "pagePath", "timestamp", "properties"}


@pytest.fixture(scope="module")
def marketing(database_url):
    """A product of its own, emptied, so global totals are exactly this module's data."""
    from sqlalchemy import create_engine, text

    from migrations.runner import create_product

    engine = create_engine(database_url)
    create_product(engine, "marketing")
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE product_marketing.analytics_events, product_marketing.analytics_chats, "
                          "product_marketing.analytics_rollup, product_marketing.analytics_daily_users, "
                          "product_marketing.analytics_usage, product_marketing.analytics_agent_names, "
                          "product_marketing.image_usage"))
        conn.execute(text("DELETE FROM platform.organizations WHERE id = 'mkt-named'"))
        conn.execute(text("INSERT INTO platform.organizations (id, title, product, created_at) "
                          "VALUES ('mkt-named', 'Named Org', 'marketing', now())"))
    engine.dispose()
    return "marketing"


# --- validation ------------------------------------------------------------------------------------

GOOD = {"sessionId": "s1", "userId": "u1", "eventType": "page_view", "eventCategory": "navigation"}


@pytest.mark.parametrize("body, field", [
    ({k: v for k, v in GOOD.items() if k != "sessionId"}, "sessionId"),
    ({k: v for k, v in GOOD.items() if k != "eventType"}, "eventType"),
    ({**GOOD, "userId": 5}, "userId"),
    ({**GOOD, "eventCategory": ""}, "eventCategory"),
    ({**GOOD, "timestamp": "yesterday"}, "timestamp"),
    ({**GOOD, "timestamp": "2026-02-30T00:00:00Z"}, "timestamp"),
    ({**GOOD, "timestamp": 1700000000}, "timestamp"),
    ({**GOOD, "properties": [1, 2]}, "properties"),
    ({**GOOD, "properties": {"blob": "x" * (32 * 1024)}}, "properties"),
    ({**GOOD, "eventId": "has space"}, "eventId"),
    ({**GOOD, "eventId": "x" * 129}, "eventId"),
    ({**GOOD, "eventCategory": "chat", "eventType": "message", "properties": {}}, "properties.chatId"),
    ({**GOOD, "eventCategory": "chat", "eventType": "message",
      "properties": {"chatId": "c", "inputTokens": -1}}, "properties.inputTokens"),
    ({**GOOD, "eventCategory": "chat", "eventType": "message",
      "properties": {"chatId": "c", "cost": "0.1"}}, "properties.cost"),
    ({**GOOD, "eventCategory": "chat", "eventType": "message",
      "properties": {"chatId": "c", "direction": "sideways"}}, "properties.direction"),
    ({**GOOD, "eventCategory": "chat", "eventType": "csat", "properties": {"chatId": "c", "score": 6}},
     "properties.score"),
    ({**GOOD, "eventCategory": "chat", "eventType": "csat", "properties": {"chatId": "c", "score": True}},
     "properties.score"),
])
def test_bad_events_are_400_and_nothing_is_stored(client, auth, body, field):
    h = auth()
    r = assert_error(client.post(f"{API}/events", json=body, headers=h), 400, "VALIDATION_ERROR")
    assert field in str(r["error"]["details"])
    assert get(client, h, "events", **{"from": "2020-01-01", "to": "2029-12-31"}) == []


def test_hostile_bodies_are_400_never_500(client, auth):
    h = auth()
    for raw in (b"{", b"[]", b"null", b'"x"', b'{"sessionId": "\\u0000"}'):
        r = client.post(f"{API}/events", data=raw, headers={**h, "Content-Type": "application/json"})
        assert r.status_code in (400, 415), (raw, r.status_code)
    r = client.post(f"{API}/events", data=b'{"sessionId":"s","userId":"u","eventType":"t","eventCategory":"c",'
                    b'"properties":{"x":NaN}}', headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert client.post(f"{API}/events", data="x", headers={**h, "Content-Type": "text/plain"}).status_code in (400, 415)
    huge_int = (b'{"sessionId":"s","userId":"u","eventType":"t","eventCategory":"c","properties":{"n":1'
                + b"0" * 5000 + b"}}")
    assert_error(client.post(f"{API}/events", data=huge_int, headers={**h, "Content-Type": "application/json"}),
                 400, "INVALID_INPUT")
    surrogate = b'{"sessionId":"s","userId":"u","eventType":"t","eventCategory":"c","properties":{"a":"\\ud800"}}'
    assert_error(client.post(f"{API}/events", data=surrogate, headers={**h, "Content-Type": "application/json"}),
                 400, "VALIDATION_ERROR")
    assert_error(client.post(f"{API}/events", json={**GOOD, "timestamp": "0001-01-01T00:00:00+01:00"}, headers=h),
                 400, "VALIDATION_ERROR")
    exactly = {**GOOD, "properties": {"blob": "x" * (32 * 1024 - 11)}}  # {"blob":"…"} is exactly 32 KB
    assert client.post(f"{API}/events", json=exactly, headers=h).status_code == 202


NUL_MESSAGE = ["must not contain the NUL character (U+0000)"]


@pytest.mark.parametrize("path, where", [
    ("chats?agent_id=a%00b", "agent_id"), ("events?eventType=%00", "eventType"), ("events?userId=u%00", "userId"),
    ("summary?from=2026-01-01%00", "from"), ("usage?to=%00", "to"), ("agents?limit=1%00", "limit"),
    ("global/channels/web/orgs?from=%00", "from")])
def test_a_nul_in_a_query_parameter_is_the_one_nul_rule_never_a_database_error(client, auth, path, where):
    """A NUL in any analytics query parameter is the request-wide rule (app.jsonbody): 400 VALIDATION_ERROR
    naming the parameter, before any query reaches PostgreSQL (no blame on field types)."""
    body = assert_error(client.get(f"{API}/{path}", headers=auth("read", role="admin")), 400, "VALIDATION_ERROR")
    assert body["error"]["details"] == {"fields": {where: NUL_MESSAGE}, "location": "query"}
    named = assert_error(client.get(f"{API}/daily?x%00=1", headers=auth("read")), 400, "VALIDATION_ERROR")
    assert named["error"]["details"] == {
        "fields": {"x?": ["the parameter name contains the NUL character (U+0000)"]}, "location": "query"}


def test_a_nul_in_an_event_is_the_one_nul_rule_naming_each_place(client, auth):
    body = {**GOOD, "userId": "u\x00", "properties": {"k\x00": 1, "v": ["ok", "\x00"]}}
    got = assert_error(client.post(f"{API}/events", json=body, headers=auth()), 400, "VALIDATION_ERROR")
    assert got["error"]["details"] == {"fields": {"userId": NUL_MESSAGE, "properties.v[1]": NUL_MESSAGE,
                                                  "properties": ["a key contains the NUL character (U+0000)"]}}
    batch = assert_error(client.post(f"{API}/events/batch", json={"events": [GOOD, {**GOOD, "eventType": "\x00"}]},
                                     headers=auth()), 400, "VALIDATION_ERROR")
    assert batch["error"]["details"] == {"fields": {"events[1].eventType": NUL_MESSAGE}}
    assert_error(client.get(f"{API}/global/channels/a%00/daily", headers=auth("read", role="admin")), 400,
                 "VALIDATION_ERROR")
def test_ingest_needs_a_token_but_no_scope(client, auth):
    assert_error(client.post(f"{API}/events", json=GOOD), 401, "UNAUTHORIZED")
    r = client.post(f"{API}/events", json=GOOD, headers=auth("write:image-gen"))
    assert r.status_code == 202 and r.get_json()["success"] is True and r.get_json()["eventId"]


def test_reads_need_read_scope(client, auth):
    assert_error(client.get(f"{API}/summary"), 401, "UNAUTHORIZED")
    assert_error(client.get(f"{API}/summary", headers=auth("write")), 403, "FORBIDDEN")
    for scopes in (("read",), ("read:analytics",)):
        assert client.get(f"{API}/summary", headers=auth(*scopes)).status_code == 200


@pytest.mark.parametrize("path", ["global/summary", "global/orgs", "global/channels", "global/channels/web/daily",
                                  "global/channels/web/orgs"])
def test_global_routes_are_admin_only(client, auth, path):
    assert_error(client.get(f"{API}/{path}"), 401, "UNAUTHORIZED")
    assert_error(client.get(f"{API}/{path}", headers=auth("read", "write", "admin")), 403, "FORBIDDEN")
    for kwargs in ({"role": "admin"}, {"role": "super_admin"}):
        assert client.get(f"{API}/{path}", headers=auth("read", **kwargs)).status_code == 200
    assert client.get(f"{API}/{path}", headers=auth("*")).status_code == 200


# --- windows ---------------------------------------------------------------------------------------

def test_every_date_form(client, auth):
    h = auth()
    post_all(client, h, chat_events("late", hour=23) + chat_events("early", hour=0))
    total = lambda **w: get(client, h, "summary", **w)["total_chats"]  # noqa: E731
    assert total(**{"from": DAY, "to": DAY}) == 2                     # date-only `to` covers the day
    assert total(**{"from": f"{DAY}T00:00:00Z", "to": f"{DAY}T12:00:00Z"}) == 1
    assert total(**{"from": f"{DAY}T12:00:00+02:00", "to": "2026-03-11"}) == 1  # offsets
    assert total(**{"from": f"{DAY}T23:00:00.000Z", "to": f"{DAY}T23:00:00.000Z"}) == 1  # ms, inclusive `to`
    assert total(**{"from": f"{DAY}T23:00:00.001Z", "to": "2026-03-12"}) == 0
    assert total(**{"from": f"{DAY}T22:00:00-01:00"}) == 1  # only `from` (23:00Z, inclusive): up to today
    assert total(**{"from": f"{DAY}T22:00:01-01:00"}) == 0
    # the default window is the last 30 days: March 2026 data is outside it
    assert get(client, h, "summary")["total_chats"] == 0
    r = client.get(f"{API}/summary", query_string={"from": DAY, "to": DAY}, headers=h).get_json()
    assert r["metadata"] == {"from": f"{DAY}T00:00:00.000Z", "to": "2026-03-11T00:00:00.000Z"}


@pytest.mark.parametrize("params", [{"from": "nope"}, {"to": "2026-13-01"}, {"from": "2026-03-02", "to": "2026-03-01"},
                                    {"from": "2026-03-01T10:00:00Z", "to": "2026-03-01T09:59:59Z"},
                                    {"from": "0001-01-01", "to": "9999-12-31"}, {"to": "9999-12-31T23:59:59.999999Z"},
                                    {"from": "12:00"}])
def test_bad_windows_are_400(client, auth, params):
    for path in ("summary", "daily", "events", "chats"):
        assert_error(client.get(f"{API}/{path}", query_string=params, headers=auth()), 400, "INVALID_INPUT")


def test_empty_window_gives_zeros_and_null_averages(client, auth):
    h = auth()
    w = {"from": "2020-01-01", "to": "2020-01-03"}
    assert get(client, h, "summary", **w) == {"total_chats": 0, "total_messages": 0, "total_tokens": 0,
                                              "total_cost": 0.0, "unique_users": 0, "avg_session_duration": 0.0}
    assert get(client, h, "chats", **w) == [] and get(client, h, "agents", **w) == []
    assert get(client, h, "usage", **w) == [] and get(client, h, "events", **w) == []
    assert get(client, h, "daily", **w) == [
        {"date": d, "total_chats": 0, "total_messages": 0, "total_tokens": 0, "unique_users": 0}
        for d in ("2020-01-01", "2020-01-02", "2020-01-03")]


# --- identity and isolation ------------------------------------------------------------------------

def test_org_comes_from_the_token_and_orgs_are_isolated(client, auth, make_token, org_id):
    mine, theirs = auth(), {"Authorization": f"Bearer {make_token(org='org-' + uuid.uuid4().hex[:10])}"}
    post_all(client, mine, [{**e, "orgId": "org-victim"} for e in chat_events("c1")])
    assert get(client, mine, "summary", **WINDOW)["total_chats"] == 1
    assert get(client, theirs, "summary", **WINDOW)["total_chats"] == 0
    assert get(client, theirs, "events", **WINDOW) == []
    assert {e["orgId"] for e in get(client, mine, "events", **WINDOW)} == {org_id}
    post_all(client, theirs, chat_events("c1"))  # same eventIds in another org: stored there too
    assert get(client, theirs, "summary", **WINDOW)["total_chats"] == 1


def test_product_selects_the_store(client, auth, marketing):
    mkt, default = auth(product=marketing), auth()
    post_all(client, mkt, chat_events("p1"))
    assert get(client, mkt, "summary", **WINDOW)["total_messages"] == 2
    assert get(client, default, "summary", **WINDOW)["total_messages"] == 0


def test_duplicates_and_late_events_stay_exact(client, auth):
    h = auth()
    events = chat_events("c1", csat=2) + chat_events("c2", csat=4, hour=11)
    post_all(client, h, events[::-1])            # reverse order: chat_started arrives last
    post_all(client, h, events)                  # every event again (client retries)
    late = {"sessionId": "s", "userId": "u-early", "eventCategory": "chat", "eventType": "message",
            "eventId": "c1-late", "timestamp": "2026-03-09T23:59:00Z",
            "properties": {"chatId": "c1", "agentId": "agent-9", "channel": "sms", "inputTokens": 1}}
    post_all(client, h, [late, late])
    both = {"from": "2026-03-09", "to": DAY}
    s = get(client, h, "summary", **both)
    assert (s["total_chats"], s["total_messages"], s["total_tokens"]) == (2, 5, 121)
    chats = {c["chat_id"]: c for c in get(client, h, "chats", **both)}
    # c1 now starts with the late event: its start, user, agent and duration moved
    assert chats["c1"]["created_at"] == "2026-03-09T23:59:00.000Z" and chats["c1"]["agent_id"] == "agent-9"
    assert chats["c1"]["duration_secs"] == 10 * 3600 + 11 * 60 and chats["c1"]["csat_score"] == 2.0
    days = {d["date"]: d for d in get(client, h, "daily", **both)}
    assert days["2026-03-09"]["total_chats"] == 1 and days[DAY]["total_chats"] == 1
    assert get(client, h, "summary", **WINDOW)["total_chats"] == 1
    agents = {a["agent_id"]: a for a in get(client, h, "agents", **both)}
    assert agents["agent-9"]["total_chats"] == 1 and agents["agent-1"]["total_chats"] == 1
    assert agents["agent-1"]["avg_csat"] == 4.0 and agents["agent-9"]["avg_csat"] == 2.0


def test_image_usage_feeds_usage_as_image_gen(client, auth, org_id, app):
    from app.db import db
    from app.images.models import ImageUsage

    h = auth()
    with app.app_context(), db.product_session("default") as s:
        for cost in (0.04, 0.06):
            s.add(ImageUsage(org_id=org_id, service="image-generation", provider="provider-a", model="img-1",
                             mode="generate", outcome="success", http_status=200, input_tokens=5,
                             output_tokens=0, total_tokens=5, cost=cost, latency_ms=10,
                             created_at=datetime(2026, 3, 10, 8, tzinfo=UTC)))
    post_all(client, h, chat_events("c1"))
    usage = {u["service"]: u for u in get(client, h, "usage", **WINDOW)}
    assert usage["image-gen"] == {"service": "image-gen", "model": "img-1", "input_tokens": 10, "output_tokens": 0,
                                  "total_tokens": 10, "cost": 0.1, "request_count": 2}
    s = get(client, h, "summary", **WINDOW)
    assert s["total_tokens"] == 70 and s["total_cost"] == 0.12 and s["total_chats"] == 1


def test_page_views_never_count_as_chats(client, auth):
    h = auth()
    post_all(client, h, [{**GOOD, "timestamp": f"{DAY}T10:00:00Z", "properties": {"chatId": "c1"}},
                         {**GOOD, "eventCategory": "chat", "eventType": "typing", "timestamp": f"{DAY}T10:00:00Z",
                          "properties": {"chatId": "c1"}}])
    assert get(client, h, "summary", **WINDOW)["total_chats"] == 0
    assert len(get(client, h, "events", **WINDOW)) == 2


def test_events_paging_and_filters(client, auth):
    h = auth()
    post_all(client, h, [{**GOOD, "eventId": f"e{i}", "timestamp": f"{DAY}T10:00:0{i}Z",
                          "userId": f"u{i % 2}"} for i in range(5)])
    first = client.get(f"{API}/events", query_string={**WINDOW, "limit": 2}, headers=h).get_json()
    assert [e["eventId"] for e in first["data"]] == ["e4", "e3"] and first["metadata"]["hasMore"] is True
    rest = get(client, h, "events", **WINDOW, limit=10, offset=2)
    assert [e["eventId"] for e in rest] == ["e2", "e1", "e0"]
    assert [e["eventId"] for e in get(client, h, "events", **WINDOW, userId="u1")] == ["e3", "e1"]
    assert_error(client.get(f"{API}/events", query_string={"limit": 0}, headers=h), 400, "VALIDATION_ERROR")


# --- global and channels ---------------------------------------------------------------------------

def test_global_and_channel_rollups(client, make_token, marketing):
    def h(org, **kw):
        return {"Authorization": f"Bearer {make_token(org=org, product=marketing, **kw)}"}

    post_all(client, h("mkt-named"), chat_events("a1", channel="whatsapp", messages=4, day=G)
             + chat_events("a2", user="u2", channel="web", day=G))
    post_all(client, h("mkt-anon"), chat_events("b1", user="u1", channel="whatsapp", messages=2, cost=0.5, day=G))
    admin = h("mkt-admin", role="admin")  # the day G holds only this test's data
    w = {"from": G, "to": G}
    assert get(client, admin, "global/summary", **w) == {
        "total_orgs": 2, "total_chats": 3, "total_messages": 8, "total_tokens": 240, "total_cost": 1.06,
        "total_users": 3}
    orgs = get(client, admin, "global/orgs", **w)
    assert orgs == [
        {"org_id": "mkt-named", "org_name": "Named Org", "total_chats": 2, "total_messages": 6, "total_tokens": 180,
         "total_cost": 0.06, "unique_users": 2},
        {"org_id": "mkt-anon", "org_name": "mkt-anon", "total_chats": 1, "total_messages": 2, "total_tokens": 60,
         "total_cost": 1.0, "unique_users": 1}]
    channels = {c["channel"]: c for c in get(client, admin, "global/channels", **w)}
    assert channels["whatsapp"] == {"channel": "whatsapp", "total_orgs": 2, "total_chats": 2, "total_messages": 6,
                                    "inbound_messages": 3, "total_users": 2, "total_tokens": 180,
                                    "total_cost": 1.04, "avg_messages_per_chat": 3.0}
    assert channels["web"]["total_chats"] == 1
    assert get(client, admin, "global/channels/whatsapp/daily", **{"from": G, "to": "2026-04-11"}) == [
        {"date": G, "total_chats": 2, "total_messages": 6, "unique_users": 2},
        {"date": "2026-04-11", "total_chats": 0, "total_messages": 0, "unique_users": 0}]
    assert [o["org_id"] for o in get(client, admin, "global/channels/whatsapp/orgs", **w)] == ["mkt-named", "mkt-anon"]
    assert get(client, admin, "global/channels/telegram/orgs", **w) == []
    # the default product's admin sees none of it
    default_admin = {"Authorization": f"Bearer {make_token(org='x', role='admin')}"}
    assert "mkt-named" not in {o["org_id"] for o in get(client, default_admin, "global/orgs", **w)}
    # partial-day windows (raw edges) agree with whole-day rollups
    edge = {"from": f"{G}T00:00:00Z", "to": f"{G}T23:59:59.999Z"}
    assert get(client, admin, "global/channels", **edge) == get(client, admin, "global/channels", **w)
    assert get(client, admin, "global/orgs", **edge) == orgs


# --- with Redis and a real worker ------------------------------------------------------------------

@pytest.fixture()
def worker_client(app, celery_worker):
    return app.test_client()


def _stored(app, org: str) -> list:
    from sqlalchemy import text

    from app.db import db

    with app.app_context(), db.product_session("default") as s:
        return s.execute(text("SELECT event_id, received_at FROM product_default.analytics_events "
                              "WHERE org_id = :o"), {"o": org}).all()


def test_worker_stores_buffered_events_in_one_batch(worker_client, app, auth, org_id):
    from app.analytics import tasks

    h = auth()
    with app.app_context():
        client = tasks.redis_client()
        flag, buffer = tasks.key("flush-pending"), tasks.key("buffer")
    client.set(flag, "1", ex=60)  # a flush is "pending": events pile up in the buffer
    try:
        events = [e for i in range(30) for e in chat_events(f"c{i}", user=f"u{i % 7}", csat=1 + i % 5)]
        post_all(worker_client, h, events)
        assert _stored(app, org_id) == [] and client.llen(buffer) >= len(events)
    finally:
        client.delete(flag)
    post_all(worker_client, h, [GOOD])  # schedules the flush task, which drains everything
    rows = wait_for(lambda: (lambda r: r if len(r) == len(events) + 1 else None)(_stored(app, org_id)))
    assert len({received for _, received in rows}) == 1  # one transaction (now() is per transaction)
    s = get(worker_client, h, "summary", **WINDOW)
    assert (s["total_chats"], s["total_messages"], s["unique_users"]) == (30, 60, 7)


def test_a_backlog_is_drained_by_parallel_flushes_without_double_counting(make_app, auth, org_id, database_url,
                                                                          redis_url):
    """Batches of 7 events: the first take sees a backlog and starts a helper flush (slot 1), so two
    worker processes store batches concurrently; totals stay exact. A private key prefix keeps the
    session's worker (default batch size) away from these tasks."""
    from app.analytics import tasks
    from tests.conftest import start_worker, stop_worker

    prefix = f"test-flush-{uuid.uuid4().hex[:8]}:"
    app = make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix)
    proc = start_worker(database_url, redis_url, prefix=prefix, queues="analytics",
                        extra_env={"ANALYTICS_BATCH_SIZE": "7"}, log_name="worker-parallel.log")
    try:
        client_ = app.test_client()
        h = auth()
        with app.app_context():
            client = tasks.redis_client()
            flag, helper = tasks.key("flush-pending"), tasks.key("flush-pending:1")
        client.set(flag, "1", ex=60)
        try:
            events = [e for i in range(40) for e in chat_events(f"p{i}", user=f"u{i % 9}", agent=f"a{i % 3}",
                                                                 csat=1 + i % 5)]
            post_all(client_, h, events + events[:50])  # retries in the same backlog
        finally:
            client.delete(flag)
        post_all(client_, h, [GOOD])
        wait_for(lambda: len(_stored(app, org_id)) == len(events) + 1, timeout=60)
        wait_for(lambda: not client.exists(flag, helper))
        s = get(client_, h, "summary", **WINDOW)
        assert (s["total_chats"], s["total_messages"], s["unique_users"]) == (40, 80, 9)
        agents = {a["agent_id"]: a["total_chats"] for a in get(client_, h, "agents", **WINDOW)}
        assert agents == {"a0": 14, "a1": 13, "a2": 13}
    finally:
        stop_worker(proc)
    with open(proc.log_path) as fh:
        received = fh.read().count("Task analytics.flush[")
    assert received >= 2 * 2  # "received" and "succeeded" of slot 0 and of at least one helper


def test_redelivered_batches_and_retries_are_not_double_counted(worker_client, app, auth, org_id):
    import json
    import time

    from app.analytics import services, tasks
    from app.tenancy import Tenant

    h = auth()
    events = chat_events("r1", csat=4) + chat_events("r2", user="u2", hour=11)
    post_all(worker_client, h, events + events)  # a client retrying every event
    wait_for(lambda: len(_stored(app, org_id)) == len(events))
    expected = get(worker_client, h, "summary", **WINDOW)
    assert expected["total_chats"] == 2 and expected["total_messages"] == 4
    # a worker that died after its commit but before deleting its in-flight batch: the batch is
    # put back into the buffer and stored again by the next flush
    tenant = Tenant(org_id=org_id, user_id="u", email=None, role=None)
    with app.app_context():
        client = tasks.redis_client()
        batch = tasks.key("batch:test-" + uuid.uuid4().hex)
        rows = [json.dumps(services.normalise_event(e, tenant)) for e in events]
        client.rpush(batch, *rows)
        client.zadd(tasks.key("inflight"), {batch: time.time() - 3600})
    post_all(worker_client, h, [{**GOOD, "eventId": "trigger", "timestamp": f"{DAY}T12:00:00Z"}])
    wait_for(lambda: len(_stored(app, org_id)) == len(events) + 1)
    wait_for(lambda: not client.exists(batch))
    assert get(worker_client, h, "summary", **WINDOW) == expected
    assert len(get(worker_client, h, "events", **WINDOW)) == len(events) + 1


def test_demo_command_fills_the_dashboards(inline_app, client, auth, org_id):
    result = inline_app.test_cli_runner().invoke(args=["analytics", "demo", "--org", org_id, "--days", "7",
                                                       "--chats", "40", "--seed", "1"])
    assert result.exit_code == 0, result.output
    h = auth()
    s = get(client, h, "summary")
    assert s["total_chats"] == 40 and s["total_messages"] >= 80 and s["total_cost"] > 0
    assert s["unique_users"] > 1 and s["avg_session_duration"] > 0
    assert {a["agent_name"] for a in get(client, h, "agents")} <= {"Support Bot", "Sales Assistant", "Onboarding Guide"}
    assert sum(d["total_chats"] for d in get(client, h, "daily")) == 40
    assert any(e["eventType"] == "page_view" for e in get(client, h, "events", limit=1000))


def test_batch_ingest_is_all_or_nothing(client, auth):
    h = auth()
    events = chat_events("b1") + chat_events("b2", user="u2")
    r = client.post(f"{API}/events/batch", json={"events": events}, headers=h)
    assert r.status_code == 202 and r.get_json()["accepted"] == len(events)
    assert r.get_json()["eventIds"] == [e["eventId"] for e in events]
    assert get(client, h, "summary", **WINDOW)["total_chats"] == 2
    bad = [{**GOOD, "eventId": "ok-1"}, {**GOOD, "userId": None}]
    body = assert_error(client.post(f"{API}/events/batch", json={"events": bad}, headers=h), 400, "VALIDATION_ERROR")
    assert "1" in str(body["error"]["details"])
    assert [e for e in get(client, h, "events", **WINDOW) if e["eventId"] == "ok-1"] == []
    for payload in ({"events": []}, {"events": [GOOD] * 501}, {"events": GOOD}, [GOOD]):
        assert client.post(f"{API}/events/batch", json=payload, headers=h).status_code == 400
    assert_error(client.post(f"{API}/events/batch", json={"events": [GOOD]}), 401, "UNAUTHORIZED")


def test_empty_channel_service_and_model_mean_the_defaults_in_every_window(client, auth):
    """An empty `channel`, `service` or `model` counts under the default whether the window is whole
    days (rollups) or has part-day edges (raw events): totals never depend on the window's form."""
    h = auth()
    events = chat_events("blank", channel="")
    for e in events:
        if e["eventType"] == "message":
            e["properties"] = {**e["properties"], "service": "", "model": ""}
    post_all(client, h, events)
    whole = {"from": DAY, "to": DAY}
    edges = {"from": f"{DAY}T00:00:00.001Z", "to": f"{DAY}T23:59:59Z"}
    assert get(client, h, "usage", **whole) == get(client, h, "usage", **edges)
    assert get(client, h, "summary", **whole) == get(client, h, "summary", **edges)
    assert {u["service"] for u in get(client, h, "usage", **edges)} != {""}


def test_a_dead_flush_and_a_lost_flush_message_are_recovered_without_new_traffic(make_app, redis_url,
                                                                                  monkeypatch):
    """A batch left in flight by a dead flush, and events in the buffer whose flush message was lost:
    the workers' maintenance loop (lease reapers) puts the batch back and schedules a flush, with no
    further POST to trigger one."""
    import time

    from app.analytics import tasks

    prefix = f"test-reap-{uuid.uuid4().hex[:8]}:"
    app = make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix, ANALYTICS_INFLIGHT_STALE_SECONDS=60)
    scheduled = []
    monkeypatch.setattr(tasks, "_schedule_flush", lambda client: scheduled.append(1))
    with app.app_context():
        client = tasks.redis_client()
        try:
            batch = tasks.key("batch:dead")
            client.rpush(batch, b"e1", b"e2")
            client.zadd(tasks.key("inflight"), {batch: time.time() - 120})  # its flush died 2 minutes ago
            fresh = tasks.key("batch:fresh")
            client.rpush(fresh, b"e3")
            client.zadd(tasks.key("inflight"), {fresh: time.time()})  # a flush still working on it
            assert tasks.reap_stalled_buffer in app.extensions["lease_reapers"]
            assert tasks.reap_stalled_buffer() == 2
            assert sorted(client.lrange(tasks.key("buffer"), 0, -1)) == [b"e1", b"e2"]
            assert client.zrange(tasks.key("inflight"), 0, -1) == [fresh.encode()]
            assert scheduled == [1] and client.exists(tasks.key("flush-pending"))
            assert tasks.reap_stalled_buffer() == 0  # a flush is due now: not scheduled twice
            assert scheduled == [1]
        finally:
            client.delete(*client.keys(f"{prefix}*"))


def test_the_age_of_the_oldest_waiting_event_stays_bounded_under_steady_ingest(make_app, redis_url, monkeypatch):
    """Events arrive every second and a flush every 5 s takes a batch of 5, so the buffer never empties
    (2 events stay behind each take) but nothing waits long: the age reported for /metrics and the lag
    alert is the real wait of the oldest event still buffered, at most a flush period and a batch's
    spread, however long the traffic lasts (a wait counted from the first push into an empty buffer grew
    without end)."""
    import types

    from app.analytics import tasks

    clock = [1_000_000.0]
    monkeypatch.setattr(tasks, "time", types.SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0]))
    stored: list[bytes] = []
    monkeypatch.setattr(tasks, "write_lines_by_product", lambda lines: (stored.extend(lines), (len(lines), []))[1])
    prefix = f"test-age-{uuid.uuid4().hex[:8]}:"
    app = make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix)
    with app.app_context():
        client = tasks.redis_client()
        client.set(tasks.key("flush-pending"), "1", ex=600)  # no flush task sent: this test flushes
        try:
            sent = [{"product": "default", "eventId": f"e{i}"} for i in range(200)]
            tasks.submit_many(sent[:2])
            ages = []
            for second in range(2, 200):
                clock[0] += 1
                tasks.submit_many([sent[second]])
                if second % 5 == 0:
                    assert tasks.flush_once(client, 5) == 5
                    assert client.llen(tasks.key("buffer")) > 0  # never emptied
                ages.append(tasks.buffer_backlog()[1])
            assert max(ages) <= 5 + 2 + 1, ages[-10:]
            assert ages[-1] >= 1  # still waiting events: a real age, not 0
            assert [json.loads(line) for line in stored] == sent[:len(stored)]  # the events, in order
        finally:
            client.delete(*client.keys(f"{prefix}*"))
