"""The ingest fast lane against the marshmallow schema it short-cuts (property test).

The lane is derived from the schema (app.fields.FastLoad / FastLane), so this is a drift alarm, not a proof
by volume: for any body, the lane either declines (None: the schema runs and reports) or returns exactly
what the schema's own load returns; whenever the schema refuses a body, the lane must decline.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from app.analytics.schemas import AnalyticsEventSchema, EventBatchSchema
from app.fields import FastLane
from tests.support import marshmallow_load

SCHEMA = AnalyticsEventSchema()
LANE = FastLane(SCHEMA)


def schema_load(body):
    """The schema without any fast lane (marshmallow's own load)."""
    return marshmallow_load(SCHEMA, body)


def fast(body):
    return LANE.load(SCHEMA, body)


tricky_text = st.sampled_from(["", "a", "x" * 128, "x" * 129, "x" * 256, "x" * 257, "x" * 2049, "a b", "ab\n",
                               "ok\x00", "é", "\ud800", "2026-11-23T10:00:00Z", "2026-11-23", "nope", "chat",
                               "message", "csat", "chat_started", "inbound", "outbound"])
scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**13), st.floats(allow_nan=True),
                   tricky_text, st.text(max_size=20))
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                          max_leaves=8)
prop_keys = st.sampled_from(["chatId", "agentId", "agentName", "channel", "model", "service", "direction",
                             "inputTokens", "outputTokens", "cost", "score", "other", "a\x00"])
properties = st.one_of(st.none(), json_value, st.dictionaries(prop_keys, json_value, max_size=8),
                       st.just({"chatId": "c1", "direction": "inbound", "inputTokens": 3, "outputTokens": 2,
                                "cost": 0.5}),
                       st.just({"chatId": "c1", "score": 4}), st.just({"big": "x" * 33000}))
field = {
    "sessionId": st.one_of(tricky_text, scalar), "userId": st.one_of(tricky_text, scalar),
    "eventType": st.one_of(st.sampled_from(["chat_started", "message", "chat_ended", "csat", "page_view"]), scalar),
    "eventCategory": st.one_of(st.sampled_from(["chat", "navigation"]), scalar),
    "eventId": st.one_of(tricky_text, scalar, st.just("abc-123")), "orgId": scalar,
    "pagePath": st.one_of(tricky_text, scalar), "timestamp": st.one_of(tricky_text, scalar,
                                                                       st.just("2026-11-23T10:00:00+02:00")),
    "properties": properties, "extra": json_value,
}
valid = st.fixed_dictionaries(
    {"sessionId": st.just("s1"), "userId": st.just("u1"),
     "eventType": st.sampled_from(["chat_started", "message", "chat_ended", "csat", "page_view"]),
     "eventCategory": st.sampled_from(["chat", "navigation"])},
    optional={name: strategy for name, strategy in field.items()
              if name not in ("sessionId", "userId", "eventType", "eventCategory")})
mutated = st.fixed_dictionaries({}, optional=field)


@settings(max_examples=400, deadline=None)
@given(st.one_of(valid, mutated, json_value))
def test_fast_lane_accepts_only_what_the_schema_accepts_and_returns_the_same(body):
    expected = schema_load(body)
    got = fast(body)
    if got is not None:
        assert expected != "refused"
        assert got == expected
    if expected == "refused":
        assert got is None


def test_fast_lane_takes_ordinary_events():
    body = {"sessionId": "s", "userId": "u", "eventType": "message", "eventCategory": "chat", "eventId": "e1",
            "timestamp": "2026-11-23T10:00:00Z", "pagePath": None, "unknownField": 1,
            "properties": {"chatId": "c", "direction": "inbound", "inputTokens": 5, "cost": 0.25}}
    assert fast(body) == schema_load(body)
    assert "unknownField" not in fast(body)


def test_fast_lane_declines_what_the_schema_refuses_or_must_name():
    base = {"sessionId": "s", "userId": "u", "eventType": "page_view", "eventCategory": "navigation"}
    for bad in ({"properties": {"x": math.nan}}, {"properties": {"x": "\ud800"}}, {"extra": "a\udfff"},
                {"timestamp": "soon"}, {"eventId": "a b"}, {"properties": {"x": "y" * 33000}},
                {"eventCategory": "chat", "eventType": "csat", "properties": {"chatId": "c", "score": 9}}):
        assert fast({**base, **bad}) is None
        assert schema_load({**base, **bad}) == "refused"


def test_batch_schema_uses_the_fast_lane_only_for_a_clean_events_list():
    event = {"sessionId": "s", "userId": "u", "eventType": "t", "eventCategory": "c"}
    assert EventBatchSchema().load({"events": [event, event]}) == {"events": [event, event]}
    for body in ({"events": []}, {"events": [event], "more": 1}, {"events": [event, {**event, "userId": ""}]},
                 {"events": [event] * 501}):
        try:
            EventBatchSchema().load(body)
        except ValidationError:
            continue
        raise AssertionError(f"accepted {body!r:.80}")
