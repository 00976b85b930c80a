"""The record query/count bodies' fast lane against the marshmallow schemas it short-cuts (property test,
the method of tests/unit/analytics/test_fast_validation.py: the lane is derived from the schema, so this
is a drift alarm with a few hundred examples, not a proof by volume).

For any body, the fast lane either declines (None: the schema runs and reports) or returns exactly what
the schema's own load returns; whenever the schema refuses a body, the fast lane must decline.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.entities.schemas import CountRequestSchema, QueryRequestSchema
from app.fields import FastLane
from tests.support import marshmallow_load

QUERY, COUNT = QueryRequestSchema(), CountRequestSchema()
QUERY_LANE, COUNT_LANE = FastLane(QUERY), FastLane(COUNT)


def fast_query_request(body):
    return QUERY_LANE.load(QUERY, body)


def fast_count_request(body):
    return COUNT_LANE.load(COUNT, body)


def schema_load(schema, body):
    """The schema without any fast lane, its nested schemas' included (marshmallow's own load)."""
    return marshmallow_load(schema, body)


scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 2_000_000), st.just(10**20), st.floats(allow_nan=True),
                   st.sampled_from(["", "1", "-1", "asc", "desc", "ASC", "5", "x" * 4000, "x" * 4001, "title",
                                    "2.0", "0"]), st.text(max_size=8))
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                          max_leaves=8)
filters = st.one_of(st.none(), json_value, st.just({}), st.just({"status": "open", "qty": {"$gt": 1}}))
names = st.one_of(st.none(), st.lists(st.one_of(st.text(max_size=5), scalar), max_size=3), scalar)
param = {
    "page": st.one_of(scalar, st.sampled_from([1, 2, 1_000_000, 1_000_001, 0, 2.0, "3"])),
    "cursor": st.one_of(scalar, st.just("abc")), "pageSize": st.one_of(scalar, st.sampled_from([1, 20, 500, 501])),
    "filters": filters, "sortBy": st.one_of(scalar, st.just("qty")),
    "sortOrder": st.one_of(scalar, st.sampled_from([1, -1, 0, 2, True, "asc", "desc", "1", "-1", 1.0])),
    "include": names, "exclude": names,
    "includeLookups": st.one_of(st.none(), st.just([]), st.just([{"field": "owner"}]),
                                st.just([{"field": "owner", "fields": ["a"]}]), st.just([{"other": 1}]), scalar),
    "other": scalar,
}
good = {  # values the schema takes, and the edges of what it takes
    "page": st.sampled_from([None, 0, 1, 2, 1_000_000, 1_000_001]),
    "cursor": st.sampled_from([None, "abc", "x" * 4000, "x" * 4001]),
    "pageSize": st.sampled_from([None, 0, 1, 20, 500, 501]), "filters": filters,
    "sortBy": st.sampled_from([None, "qty", ""]),
    "sortOrder": st.sampled_from([None, 1, -1, "asc", "desc", "1", "-1", 0, 2]),
    "include": st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=3)),
    "exclude": st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=3)), "includeLookups": st.none(),
}


@st.composite
def near_valid(draw):
    """Valid parameters, then (mostly) one of them replaced by anything."""
    body = draw(st.fixed_dictionaries({}, optional=good))
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(param)))
        body[key] = draw(param[key])
    return body


params = st.one_of(near_valid(), st.fixed_dictionaries({}, optional=param), json_value)
query_body = st.one_of(st.fixed_dictionaries({"query": near_valid()}),
                       st.fixed_dictionaries({}, optional={"query": params, "other": scalar}), json_value)
count_body = st.one_of(st.fixed_dictionaries({}, optional={"filters": filters, "other": scalar}), json_value)


def check(fast, schema, body):
    expected = schema_load(schema, body)
    got = fast(body)
    if got is not None:
        assert expected != "refused", body
        assert got == expected, body
    if expected == "refused":
        assert got is None, body


@settings(max_examples=400, deadline=None)
@given(query_body)
def test_query_fast_lane_accepts_only_what_the_schema_accepts_and_returns_the_same(body):
    check(fast_query_request, QUERY, body)


@settings(max_examples=150, deadline=None)
@given(count_body)
def test_count_fast_lane_accepts_only_what_the_schema_accepts_and_returns_the_same(body):
    check(fast_count_request, COUNT, body)


def test_fast_lane_takes_the_ordinary_bodies():
    ordinary = [{"query": {"filters": {"status": "open"}, "sortBy": "close_date", "sortOrder": -1, "pageSize": 20}},
                {"query": {"filters": {"$search": "x"}, "page": 2, "include": ["a"], "exclude": []}},
                {"query": {"cursor": "abc", "sortOrder": "desc", "filters": None}}, {}]
    for body in ordinary:
        assert fast_query_request(body) is not None and fast_query_request(body) == schema_load(QUERY, body)
    for body in ({"filters": {"a": 1}}, {}, {"filters": None}):
        assert fast_count_request(body) is not None and fast_count_request(body) == schema_load(COUNT, body)
    # the schemas' load goes through it
    assert QUERY.load({"query": {"pageSize": 5}}) == {"query": {"pageSize": 5, "filters": {}}}
    assert COUNT.load({}) == {"filters": {}}
