"""The analytics time series (`/analytics/series`, `/analytics/global/series`) and the org's channels
(`/analytics/channels`) through HTTP: buckets of a day, week and month, time zones, filters by agent,
channel and model, and agreement with the spec'd dashboards (summary, daily, channel daily)."""

from __future__ import annotations

import uuid

import pytest

from tests.functional.test_analytics_api import chat_events, get, post_all
from tests.support import assert_error

API = "/api/v1/analytics"
# Chats of one org around a month and week boundary (2026-05-31 is a Sunday; 2026-06-01 a Monday).
# The one at 02:00 UTC on 06-01 is still 05-31 in New York (UTC-4).
D1, D2, D3 = "2026-05-29", "2026-05-31", "2026-06-01"


@pytest.fixture(scope="module")
def inline_client(app, database_url):
    from app import create_app
    from app.extensions import celery_app
    from app.tasks import init_celery
    from tests.conftest import app_config

    inline = create_app(app_config(database_url, REDIS_URL=""))
    init_celery(celery_app, app)
    return inline.test_client()


@pytest.fixture(scope="module")
def product(database_url):
    from sqlalchemy import create_engine, text

    from migrations.runner import create_product

    engine = create_engine(database_url)
    slug = create_product(engine, f"series_{uuid.uuid4().hex[:8]}")
    yield slug
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "product_{slug}" CASCADE'))
        conn.execute(text("DELETE FROM platform.products WHERE slug = :s"), {"s": slug})
    engine.dispose()


@pytest.fixture(scope="module")
def data(inline_client, product):
    from tests.support import token

    org, other = f"org-{uuid.uuid4().hex[:8]}", f"org-{uuid.uuid4().hex[:8]}"
    w = {"Authorization": f"Bearer {token(org=org, scopes=('write',), product=product)}"}
    post_all(inline_client, w, chat_events("c1", day=D1, csat=5, tokens=(10, 20), cost=0.5)
             + chat_events("c2", day=D2, user="u2", agent="agent-2", channel="whatsapp", csat=2, messages=4)
             + chat_events("c3", day=D3, hour=2, user="u1", tokens=(100, 0), cost=1.0)
             + chat_events("c4", day=D3, hour=15, user="u3", agent="agent-2"))
    ow = {"Authorization": f"Bearer {token(org=other, scopes=('write',), product=product)}"}
    post_all(inline_client, ow, chat_events("o1", day=D3, user="z1", channel="whatsapp"))

    def reader(who=org, **kw):
        return {"Authorization": f"Bearer {token(org=who, scopes=('read',), product=product, **kw)}"}

    return org, other, reader


def series(client, headers, path="series", **params):
    return get(client, headers, path, **{"from": D1, "to": D3, **params})


def test_daily_buckets_match_the_spec_dashboards(inline_client, data):
    org, _, reader = data
    got = series(inline_client, reader())
    assert got["interval"] == "day" and got["timezone"] == "UTC"
    assert [p["period"] for p in got["points"]] == [D1, "2026-05-30", D2, D3]
    daily = get(inline_client, reader(), "daily", **{"from": D1, "to": D3})
    for point, row in zip(got["points"], daily, strict=True):
        assert point["period"] == row["date"]
        for key in ("total_chats", "total_messages", "total_tokens", "unique_users"):
            assert point[key] == row[key]
        assert point["complete"] is True
    summary = get(inline_client, reader(), "summary", **{"from": D1, "to": D3})
    assert {k: got["totals"][k] for k in summary} == summary
    assert got["totals"]["avg_csat"] == 3.5 and got["totals"]["csat_responses"] == 2
    assert got["points"][1] == {"period": "2026-05-30", "complete": True, "total_chats": 0, "total_messages": 0,
                                "total_tokens": 0, "total_cost": 0.0, "unique_users": 0,
                                "avg_session_duration": 0.0, "avg_csat": None, "csat_responses": 0}


def test_weeks_and_months_start_on_monday_and_the_first(inline_client, data):
    _, _, reader = data
    weeks = series(inline_client, reader(), interval="week")
    assert [(p["period"], p["total_chats"], p["complete"]) for p in weeks["points"]] == [
        ("2026-05-25", 2, False), ("2026-06-01", 2, False)]  # both weeks are cut by the window
    months = series(inline_client, reader(), interval="month", **{"from": "2026-05-01", "to": "2026-06-30"})
    assert [(p["period"], p["total_chats"], p["complete"]) for p in months["points"]] == [
        ("2026-05-01", 2, True), ("2026-06-01", 2, True)]
    assert months["points"][0]["unique_users"] == 2 and months["totals"]["unique_users"] == 3


def test_a_time_zone_moves_chats_to_its_own_days(inline_client, data):
    _, _, reader = data
    ny = series(inline_client, reader(), tz="America/New_York",
                **{"from": "2026-05-29T04:00:00Z", "to": "2026-06-02T03:59:59.999999Z"})
    assert ny["timezone"] == "America/New_York"
    assert {p["period"]: p["total_chats"] for p in ny["points"]} == {
        D1: 1, "2026-05-30": 0, D2: 2, D3: 1}  # c3 (02:00 UTC on 06-01) is New York's 05-31
    # a zone always at UTC+0 reads raw facts, the UTC series reads rollups: same numbers
    raw = series(inline_client, reader(), tz="Africa/Abidjan")
    rolled = series(inline_client, reader())
    assert raw["timezone"] == "Africa/Abidjan"
    assert raw["points"] == rolled["points"] and raw["totals"] == rolled["totals"]


def test_filters_by_agent_channel_and_model(inline_client, data):
    _, _, reader = data
    agent2 = series(inline_client, reader(), agent_id="agent-2")
    assert agent2["totals"]["total_chats"] == 2 and agent2["totals"]["unique_users"] == 2
    assert {p["period"]: p["total_chats"] for p in agent2["points"] if p["total_chats"]} == {D2: 1, D3: 1}
    whatsapp = series(inline_client, reader(), channel="whatsapp")
    assert (whatsapp["totals"]["total_chats"], whatsapp["totals"]["total_messages"]) == (1, 4)
    assert whatsapp["totals"]["avg_csat"] == 2.0
    model = series(inline_client, reader(), model="gpt-x")
    assert model["totals"]["total_chats"] is None and model["totals"]["avg_csat"] is None
    assert model["totals"]["total_messages"] == 10 and model["totals"]["unique_users"] == 3
    assert series(inline_client, reader(), model="gpt-x", agent_id="agent-2")["totals"]["total_messages"] == 6
    assert series(inline_client, reader(), model="none-such")["totals"]["total_tokens"] == 0
    # the raw and the rollup reads agree under a filter too
    assert series(inline_client, reader(), agent_id="agent-2", tz="Africa/Abidjan")["points"] == agent2["points"]


def test_org_channels(inline_client, data):
    _, _, reader = data
    rows = get(inline_client, reader(), "channels", **{"from": D1, "to": D3})
    assert [r["channel"] for r in rows] == ["web", "whatsapp"]
    assert rows[1] == {"channel": "whatsapp", "total_chats": 1, "total_messages": 4, "inbound_messages": 2,
                       "unique_users": 1, "total_tokens": 120, "total_cost": 0.04, "avg_messages_per_chat": 4.0}


def test_global_series_is_admin_only_and_counts_every_org(inline_client, data):
    org, other, reader = data
    assert_error(inline_client.get(f"{API}/global/series", headers=reader()), 403, "FORBIDDEN")
    admin = reader(role="admin")
    everything = series(inline_client, admin, "global/series")
    assert everything["totals"]["total_chats"] == 5 and everything["totals"]["unique_users"] == 4
    one = series(inline_client, admin, "global/series", org_id=other)
    assert one["totals"]["total_chats"] == 1
    channel = series(inline_client, admin, "global/series", channel="whatsapp")
    daily = get(inline_client, admin, "global/channels/whatsapp/daily", **{"from": D1, "to": D3})
    assert [(p["total_chats"], p["total_messages"], p["unique_users"]) for p in channel["points"]] == [
        (r["total_chats"], r["total_messages"], r["unique_users"]) for r in daily]


@pytest.mark.parametrize("params, field", [
    ({"interval": "hour"}, "interval"), ({"tz": "Mars/Olympus"}, "tz"), ({"tz": "x" * 65}, "tz"),
    ({"agent_id": ""}, "agent_id"), ({"from": "2026-06-02", "to": "2026-06-01"}, "from"),
])
def test_bad_series_parameters_are_400(inline_client, data, params, field):
    _, _, reader = data
    resp = inline_client.get(f"{API}/series", query_string=params, headers=reader())
    body = assert_error(resp, 400, "INVALID_INPUT" if field == "from" else "VALIDATION_ERROR")
    assert field in str(body["error"])


def test_series_and_channels_need_a_read_scope(inline_client, data):
    from tests.support import token

    headers = {"Authorization": f"Bearer {token(org=data[0], scopes=('write',))}"}
    for path in ("series", "channels"):
        assert_error(inline_client.get(f"{API}/{path}", headers=headers), 403, "FORBIDDEN")
