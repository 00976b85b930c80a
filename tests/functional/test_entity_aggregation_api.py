"""Record aggregation through HTTP against PostgreSQL: every function on a fixed data set with blanks and
nulls, every bucket across a year boundary and a DST change, having/sortBy/limit, totals, tenant
isolation, bad requests, and a property test against a plain-Python reference implementation."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.functional.entities_support import BASE, create_definition, create_record, org_headers

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "owner": {"type": "string"},
        "qty": {"type": "int"},
        "price": {"type": "float"},
        "amount": {"type": "currency"},
        "status": {"type": "dropdown", "options": ["open", "closed", "pending"]},
        "labels": {"type": "multiselect", "options": ["red", "green", "blue"]},
        "active": {"type": "bool"},
        "due": {"type": "date"},
        "at": {"type": "datetime"},
        "meta": {"type": "json"},
    },
}

# Blanks on purpose: Gamma's price is null, Delta has no price and an empty owner, Epsilon has almost nothing.
FIXED = [
    {"name": "Alpha", "fields": {"title": "a", "owner": "ann", "qty": 1, "price": 1.5, "amount": 10,
                                 "status": "open", "labels": ["red"], "active": True, "due": "2026-01-10",
                                 "at": "2025-12-31T23:30:00Z"}},
    {"name": "Beta", "fields": {"title": "b", "owner": "bob", "qty": 5, "price": 2.5,
                                "amount": {"amount": 20, "currency": "EUR"}, "status": "closed",
                                "labels": ["red", "green"], "active": False, "due": "2026-02-01",
                                "at": "2026-01-01T02:30:00+02:00"}},
    {"name": "Gamma", "fields": {"title": "c", "owner": "ann", "qty": 10, "price": None, "amount": 5,
                                 "status": "open", "labels": [], "active": True, "due": "2025-12-31",
                                 "at": "2026-03-08T06:30:00Z"}},
    {"name": "Delta", "fields": {"title": "", "owner": "", "qty": -3, "status": "pending", "labels": ["blue"],
                                 "at": "2026-03-08T07:30:00Z", "meta": {"x": 1}}},
    {"name": "Epsilon", "fields": {"qty": 5, "price": 9.75}},
]
GONE = {"name": "Deleted", "fields": {"qty": 1000, "price": 1000.0, "status": "open", "owner": "zed"}}


def aggregate(client, headers, body, entity="items"):
    return client.post(f"{BASE}/{entity}/records/aggregate", json=body, headers=headers)


def ok(resp) -> dict:
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


@pytest.fixture(scope="module")
def fixed(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "items", SCHEMA)
    for body in FIXED:
        create_record(client, headers, "items", body)
    gone = create_record(client, headers, "items", GONE)
    assert client.delete(f"{BASE}/items/records/{gone['id']}", headers=headers).status_code == 200
    return client, headers


# --- functions ------------------------------------------------------------------------------------

FUNCTION_CASES = [
    ({"function": "count"}, "count", 5),
    ({"function": "count", "field": "price"}, "count_price", 3),
    ({"function": "count", "field": "owner"}, "count_owner", 3),          # "" is blank
    ({"function": "count", "field": "labels"}, "count_labels", 3),        # [] is blank
    ({"function": "sum", "field": "qty"}, "sum_qty", 18),
    ({"function": "sum", "field": "price"}, "sum_price", 13.75),
    ({"function": "sum", "field": "amount"}, "sum_amount", 35),            # currency: number or {amount}
    ({"function": "avg", "field": "qty"}, "avg_qty", 3.6),
    ({"function": "avg", "field": "price"}, "avg_price", 13.75 / 3),
    ({"function": "min", "field": "qty"}, "min_qty", -3),
    ({"function": "max", "field": "price"}, "max_price", 9.75),
    ({"function": "min", "field": "owner"}, "min_owner", "ann"),
    ({"function": "max", "field": "owner"}, "max_owner", "bob"),
    ({"function": "min", "field": "due"}, "min_due", "2025-12-31"),
    ({"function": "max", "field": "at"}, "max_at", "2026-03-08T07:30:00Z"),
    ({"function": "min", "field": "at"}, "min_at", "2025-12-31T23:30:00Z"),
    ({"function": "min", "field": "created_at"}, "min_created_at", None),  # checked separately below
    ({"function": "distinct_count", "field": "qty"}, "distinct_count_qty", 4),
    ({"function": "distinct_count", "field": "owner"}, "distinct_count_owner", 2),
    ({"function": "distinct_count", "field": "status"}, "distinct_count_status", 3),
    ({"function": "distinct_count", "field": "at"}, "distinct_count_at", 4),  # same instant, other offset
    ({"function": "distinct_count", "field": "active"}, "distinct_count_active", 2),
    ({"function": "percentile", "field": "qty", "percentile": 0.5}, "percentile_qty", 5),
    ({"function": "percentile", "field": "qty", "percentile": 90}, "percentile_qty", 8),   # -3 1 5 5 10
    ({"function": "percentile", "field": "qty", "percentile": 0.9}, "percentile_qty", 8),
    ({"function": "percentile", "field": "qty", "percentile": 0}, "percentile_qty", -3),
    ({"function": "percentile", "field": "qty", "percentile": 100}, "percentile_qty", 10),
    ({"function": "percentile", "field": "price", "percentile": 50}, "percentile_price", 2.5),
    ({"function": "percentile", "field": "price", "percentile": 25}, "percentile_price", 2.0),
]


@pytest.mark.parametrize(("spec", "alias", "expected"), FUNCTION_CASES)
def test_each_function_over_all_records(fixed, spec, alias, expected):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"aggregates": [spec]}))
    assert body["totals"].keys() == {alias}
    assert body["groups"] == [{"key": {}, "values": body["totals"], "count": 5}]
    value = body["totals"][alias]
    if alias == "min_created_at":
        assert datetime.fromisoformat(value.replace("Z", "+00:00")) <= datetime.now(UTC)
        assert value.endswith("Z")
    elif isinstance(expected, float):
        assert value == pytest.approx(expected)
    else:
        assert value == expected
    assert body["metadata"] == {"truncated": False, "limit": 1000, "totalCount": 5}


def test_numeric_aggregates_of_nothing_are_null_not_zero(fixed):
    client, headers = fixed
    specs = [{"function": f, "field": "price"} for f in ("sum", "avg", "min", "max", "distinct_count")]
    specs += [{"function": "percentile", "field": "price", "percentile": 0.9}, {"function": "count", "field": "price"}]
    body = ok(aggregate(client, headers, {"filters": {"status": "pending"}, "aggregates": specs}))
    assert body["totals"] == {"sum_price": None, "avg_price": None, "min_price": None, "max_price": None,
                              "distinct_count_price": 0, "percentile_price": None, "count_price": 0}
    empty = ok(aggregate(client, headers, {"filters": {"qty": {"$gt": 999}}, "groupBy": ["status"],
                                           "aggregates": [{"function": "sum", "field": "qty"}]}))
    assert empty == {"groups": [], "totals": {"sum_qty": None},
                     "metadata": {"truncated": False, "limit": 1000, "totalCount": 0}}


def test_alias_and_filters(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"filters": {"qty": {"$gte": 5}}, "aggregates": [
        {"function": "avg", "field": "qty", "alias": "meanQty"}, {"function": "count", "alias": "n"}]}))
    assert body["totals"] == {"meanQty": pytest.approx(20 / 3), "n": 3}


# --- grouping -------------------------------------------------------------------------------------

def test_group_by_dropdown_with_totals(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["status"], "aggregates": [
        {"function": "count"}, {"function": "sum", "field": "qty"}, {"function": "avg", "field": "price"},
        {"function": "percentile", "field": "qty", "percentile": 50}]}))
    assert body["groups"] == [  # keys ascending, the missing-value group last
        {"key": {"status": "closed"}, "count": 1,
         "values": {"count": 1, "sum_qty": 5, "avg_price": 2.5, "percentile_qty": 5}},
        {"key": {"status": "open"}, "count": 2,
         "values": {"count": 2, "sum_qty": 11, "avg_price": 1.5, "percentile_qty": 5.5}},
        {"key": {"status": "pending"}, "count": 1,
         "values": {"count": 1, "sum_qty": -3, "avg_price": None, "percentile_qty": -3}},
        {"key": {"status": None}, "count": 1,
         "values": {"count": 1, "sum_qty": 5, "avg_price": 9.75, "percentile_qty": 5}},
    ]
    assert body["totals"] == {"count": 5, "sum_qty": 18, "avg_price": pytest.approx(13.75 / 3),
                              "percentile_qty": 5}


def test_group_by_multiselect_counts_a_record_in_each_value(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["labels"], "aggregates": [
        {"function": "count"}, {"function": "sum", "field": "qty"}]}))
    assert [(g["key"]["labels"], g["count"], g["values"]["sum_qty"]) for g in body["groups"]] == [
        ("blue", 1, -3), ("green", 1, 5), ("red", 2, 6), (None, 2, 15)]
    assert body["totals"] == {"count": 5, "sum_qty": 18}  # every record once in the totals
    assert body["metadata"]["totalCount"] == 5


def test_group_by_several_keys_and_system_columns(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["status", "active"], "aggregates": [{"function": "count"}]}))
    assert [(g["key"], g["count"]) for g in body["groups"]] == [
        ({"status": "closed", "active": False}, 1), ({"status": "open", "active": True}, 2),
        ({"status": "pending", "active": None}, 1), ({"status": None, "active": None}, 1)]
    by_name = ok(aggregate(client, headers, {"groupBy": ["name"], "aggregates": [{"function": "count"}],
                                            "sortBy": "name", "sortOrder": -1}))
    assert [g["key"]["name"] for g in by_name["groups"]] == ["Gamma", "Epsilon", "Delta", "Beta", "Alpha"]
    by_version = ok(aggregate(client, headers, {"groupBy": ["version", "is_active"],
                                               "aggregates": [{"function": "count"}]}))
    assert by_version["groups"] == [{"key": {"version": 1, "is_active": True}, "values": {"count": 5}, "count": 5}]


def test_group_by_timestamp_without_bucket_is_one_group_per_value(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["at"], "aggregates": [{"function": "count"}]}))
    assert [(g["key"]["at"], g["count"]) for g in body["groups"]] == [
        ("2025-12-31T23:30:00Z", 1), ("2026-01-01T00:30:00Z", 1), ("2026-03-08T06:30:00Z", 1),
        ("2026-03-08T07:30:00Z", 1), (None, 1)]
    per_row = ok(aggregate(client, headers, {"groupBy": ["created_at"], "aggregates": [{"function": "count"}]}))
    assert sum(g["count"] for g in per_row["groups"]) == 5 and len(per_row["groups"]) == 5


def test_created_at_day_bucket(fixed):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["created_at:day"], "aggregates": [{"function": "count"}],
                                         "sortBy": "created_at_day"}))
    today = datetime.now(UTC).strftime("%Y-%m-%dT00:00:00Z")
    assert [g["key"] for g in body["groups"]][-1] == {"created_at_day": today}
    assert sum(g["count"] for g in body["groups"]) == 5


# --- buckets across a year boundary and a DST change ----------------------------------------------

EVENTS = [  # America/New_York: DST starts 2026-03-08 at 02:00 local (07:00Z)
    {"at": "2025-12-31T23:30:00Z", "due": "2025-12-31", "n": 1},   # NY 2025-12-31 18:30 EST
    {"at": "2026-01-01T00:30:00Z", "due": "2026-01-01", "n": 2},   # NY 2025-12-31 19:30 EST
    {"at": "2026-03-08T06:30:00Z", "due": "2026-03-08", "n": 3},   # NY 2026-03-08 01:30 EST
    {"at": "2026-03-08T07:30:00Z", "due": "2026-03-09", "n": 4},   # NY 2026-03-08 03:30 EDT
    {"at": "2026-03-09T04:30:00Z", "due": "2026-03-31", "n": 5},   # NY 2026-03-09 00:30 EDT
]

BUCKET_CASES = [
    ("at:hour", None, [("2025-12-31T23:00:00Z", 1), ("2026-01-01T00:00:00Z", 1), ("2026-03-08T06:00:00Z", 1),
                       ("2026-03-08T07:00:00Z", 1), ("2026-03-09T04:00:00Z", 1)]),
    ("at:day", None, [("2025-12-31T00:00:00Z", 1), ("2026-01-01T00:00:00Z", 1), ("2026-03-08T00:00:00Z", 2),
                      ("2026-03-09T00:00:00Z", 1)]),
    ("at:week", None, [("2025-12-29T00:00:00Z", 2), ("2026-03-02T00:00:00Z", 2), ("2026-03-09T00:00:00Z", 1)]),
    ("at:month", None, [("2025-12-01T00:00:00Z", 1), ("2026-01-01T00:00:00Z", 1), ("2026-03-01T00:00:00Z", 3)]),
    ("at:quarter", None, [("2025-10-01T00:00:00Z", 1), ("2026-01-01T00:00:00Z", 4)]),
    ("at:year", None, [("2025-01-01T00:00:00Z", 1), ("2026-01-01T00:00:00Z", 4)]),
    ("at:hour", "America/New_York", [("2025-12-31T23:00:00Z", 1), ("2026-01-01T00:00:00Z", 1),
                                     ("2026-03-08T06:00:00Z", 1), ("2026-03-08T07:00:00Z", 1),
                                     ("2026-03-09T04:00:00Z", 1)]),
    # the local day of 2026-03-08 starts at 05:00Z (EST), the next one at 04:00Z (EDT)
    ("at:day", "America/New_York", [("2025-12-31T05:00:00Z", 2), ("2026-03-08T05:00:00Z", 2),
                                    ("2026-03-09T04:00:00Z", 1)]),
    ("at:week", "America/New_York", [("2025-12-29T05:00:00Z", 2), ("2026-03-02T05:00:00Z", 2),
                                     ("2026-03-09T04:00:00Z", 1)]),
    ("at:month", "America/New_York", [("2025-12-01T05:00:00Z", 2), ("2026-03-01T05:00:00Z", 3)]),
    ("at:quarter", "America/New_York", [("2025-10-01T04:00:00Z", 2), ("2026-01-01T05:00:00Z", 3)]),
    ("at:year", "America/New_York", [("2025-01-01T05:00:00Z", 2), ("2026-01-01T05:00:00Z", 3)]),
    ("at:year", "Asia/Tokyo", [("2025-12-31T15:00:00Z", 5)]),
    ("at:day", "Asia/Kolkata", [("2025-12-31T18:30:00Z", 2), ("2026-03-07T18:30:00Z", 2),
                                ("2026-03-08T18:30:00Z", 1)]),
    # a date has no time zone: the same buckets whatever `timezone` says
    ("due:day", "America/New_York", [("2025-12-31", 1), ("2026-01-01", 1), ("2026-03-08", 1), ("2026-03-09", 1),
                                     ("2026-03-31", 1)]),
    ("due:week", None, [("2025-12-29", 2), ("2026-03-02", 1), ("2026-03-09", 1), ("2026-03-30", 1)]),
    ("due:month", "Asia/Tokyo", [("2025-12-01", 1), ("2026-01-01", 1), ("2026-03-01", 3)]),
    ("due:quarter", None, [("2025-10-01", 1), ("2026-01-01", 4)]),
    ("due:year", None, [("2025-01-01", 1), ("2026-01-01", 4)]),
]


@pytest.fixture(scope="module")
def events(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "events", {"type": "object", "properties": {
        "at": {"type": "datetime"}, "due": {"type": "date"}, "n": {"type": "int"}}})
    resp = client.post(f"{BASE}/events/records/bulk/create", headers=headers,
                       json={"records": [{"name": f"e{f['n']}", "fields": f} for f in EVENTS]})
    assert resp.status_code == 200, resp.get_json()
    return client, headers


@pytest.mark.parametrize(("group_by", "timezone", "expected"), BUCKET_CASES)
def test_bucket(events, group_by, timezone, expected):
    client, headers = events
    body = {"groupBy": [group_by], "aggregates": [{"function": "sum", "field": "n"}]}
    if timezone:
        body["timezone"] = timezone
    result = ok(aggregate(client, headers, body, "events"))
    alias = group_by.replace(":", "_")
    assert [(g["key"][alias], g["count"]) for g in result["groups"]] == expected
    assert sum(g["values"]["sum_n"] for g in result["groups"]) == 15 == result["totals"]["sum_n"]


def test_having_on_a_bucket_alias(events):
    client, headers = events
    body = {"groupBy": ["at:day", "due:month"], "aggregates": [{"function": "count"}], "timezone": "America/New_York",
            "having": {"at_day": {"$gte": "2026-03-08T05:00:00Z"}, "due_month": {"$gte": "2026-03-01"}}}
    result = ok(aggregate(client, headers, body, "events"))
    assert [(g["key"], g["count"]) for g in result["groups"]] == [
        ({"at_day": "2026-03-08T05:00:00Z", "due_month": "2026-03-01"}, 2),
        ({"at_day": "2026-03-09T04:00:00Z", "due_month": "2026-03-01"}, 1)]


# --- having, sortBy, limit ------------------------------------------------------------------------

def group_keys(body, alias="status"):
    return [g["key"][alias] for g in body["groups"]]


def test_having_sort_and_limit(fixed):
    client, headers = fixed
    base = {"groupBy": ["status"], "aggregates": [{"function": "sum", "field": "qty"}]}
    body = ok(aggregate(client, headers, {**base, "having": {"sum_qty": {"$gte": 5}}}))
    assert group_keys(body) == ["closed", "open", None]
    body = ok(aggregate(client, headers, {**base, "having": {"sum_qty": {"$gte": 5}}, "sortBy": "sum_qty",
                                         "sortOrder": -1}))
    assert group_keys(body) == ["open", "closed", None]  # 11, then 5 and 5 broken by key
    assert body["metadata"]["truncated"] is False
    body = ok(aggregate(client, headers, {**base, "having": {"sum_qty": {"$gte": 5}}, "sortBy": "sum_qty",
                                         "sortOrder": -1, "limit": 2}))
    assert group_keys(body) == ["open", "closed"]
    assert body["metadata"] == {"truncated": True, "limit": 2, "totalCount": 5}
    assert body["totals"] == {"sum_qty": 18}  # totals ignore having and limit
    body = ok(aggregate(client, headers, {**base, "sortBy": "sum_qty", "sortOrder": 1, "limit": 4}))
    assert group_keys(body) == ["pending", "closed", None, "open"]
    assert body["metadata"]["truncated"] is False


HAVING_CASES = [
    ({"count": {"$gt": 1}}, ["open"]),
    ({"count": 1}, ["closed", "pending", None]),
    ({"status": {"$in": ["open", "pending"]}}, ["open", "pending"]),
    ({"status": {"$nin": ["open"]}}, ["closed", "pending", None]),
    ({"status": None}, [None]),
    ({"status": {"$ne": "open"}}, ["closed", "pending", None]),
    ({"avg_price": None}, ["pending"]),
    ({"avg_price": {"$exists": True}}, ["closed", "open", None]),
    ({"avg_price": {"$between": [1.5, 2.5]}}, ["closed", "open"]),
    ({"avg_price": {"$lt": 2}}, ["open"]),
    ({"$or": [{"count": 2}, {"avg_price": {"$gt": 9}}]}, ["open", None]),
    ({"$not": {"count": 1}}, ["open"]),
    ({"max_at": {"$gte": "2026-03-01"}}, ["open", "pending"]),
]


@pytest.mark.parametrize(("having", "expected"), HAVING_CASES)
def test_having_operators(fixed, having, expected):
    client, headers = fixed
    body = ok(aggregate(client, headers, {"groupBy": ["status"], "having": having, "aggregates": [
        {"function": "avg", "field": "price"}, {"function": "max", "field": "at"}]}))
    assert group_keys(body) == expected


def test_having_without_group_by_filters_the_single_group(fixed):
    client, headers = fixed
    spec = {"aggregates": [{"function": "sum", "field": "qty"}]}
    assert ok(aggregate(client, headers, {**spec, "having": {"sum_qty": {"$gt": 100}}}))["groups"] == []
    kept = ok(aggregate(client, headers, {**spec, "having": {"sum_qty": 18}}))
    assert kept["groups"] == [{"key": {}, "values": {"sum_qty": 18}, "count": 5}]


def test_more_groups_than_the_maximum_are_truncated(app, make_app):
    small = make_app(ENTITY_AGGREGATE_MAX_GROUPS=3)
    client = small.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "items", SCHEMA)
    for qty in range(5):
        create_record(client, headers, "items", {"name": f"r{qty}", "fields": {"qty": qty}})
    body = ok(aggregate(client, headers, {"groupBy": ["qty"], "aggregates": [{"function": "count"}],
                                         "sortOrder": -1, "sortBy": "qty"}))
    assert group_keys(body, "qty") == [4, 3, 2]
    assert body["metadata"] == {"truncated": True, "limit": 3, "totalCount": 5}
    resp = aggregate(client, headers, {"groupBy": ["qty"], "aggregates": [{"function": "count"}], "limit": 4})
    assert resp.status_code == 400 and "limit" in resp.get_json()["error"]["details"]["fields"]


# --- tenancy and scopes ---------------------------------------------------------------------------

def test_tenant_isolation(fixed, client):
    _, headers = fixed
    _org, other = org_headers()
    spec = {"groupBy": ["status"], "aggregates": [{"function": "count"}, {"function": "sum", "field": "qty"}]}
    assert aggregate(client, other, spec).status_code == 404  # no such entity in the other org
    create_definition(client, other, "items", SCHEMA)
    create_record(client, other, "items", {"name": "theirs", "fields": {"qty": 7, "status": "open"}})
    theirs = ok(aggregate(client, other, spec))
    assert theirs["groups"] == [{"key": {"status": "open"}, "values": {"count": 1, "sum_qty": 7}, "count": 1}]
    assert ok(aggregate(client, headers, spec))["totals"] == {"count": 5, "sum_qty": 18}


def test_product_isolation(fixed, client):
    _, headers = fixed
    org = str(uuid.uuid4())
    from tests.support import bearer, token

    default = bearer(token(org=org))
    other = bearer(token(org=org, product="other"))
    create_definition(client, default, "items", SCHEMA)
    create_record(client, default, "items", {"name": "x", "fields": {"qty": 1}})
    assert aggregate(client, other, {"aggregates": [{"function": "count"}]}).status_code == 404


def test_requires_read_entities_scope(fixed, auth, client):
    resp = aggregate(client, auth("read:agents"), {"aggregates": [{"function": "count"}]})
    assert resp.status_code == 403
    assert aggregate(client, {}, {"aggregates": [{"function": "count"}]}).status_code == 401


# --- bad requests ---------------------------------------------------------------------------------

COUNT = {"function": "count"}
BAD_REQUESTS = [
    ({}, "aggregates", "required"),
    ({"aggregates": []}, "aggregates", ""),
    ({"aggregates": [COUNT], "extra": 1}, "extra", "Unknown"),
    ({"aggregates": [{"function": "median", "field": "qty"}]}, "aggregates", "one of"),
    ({"aggregates": [{"function": "sum"}]}, "aggregates[0].field", "needs a field"),
    ({"aggregates": [{"function": "sum", "field": "nope"}]}, "aggregates[0].field", "unknown field 'nope'"),
    ({"aggregates": [{"function": "sum", "field": "owner"}]}, "aggregates[0].field", "numeric"),
    ({"aggregates": [{"function": "avg", "field": "due"}]}, "aggregates[0].field", "numeric"),
    ({"aggregates": [{"function": "percentile", "field": "labels", "percentile": 50}]}, "aggregates[0].field",
     "numeric"),
    ({"aggregates": [{"function": "min", "field": "labels"}]}, "aggregates[0].field", "array"),
    ({"aggregates": [{"function": "max", "field": "meta"}]}, "aggregates[0].field", "json"),
    ({"aggregates": [{"function": "distinct_count", "field": "labels"}]}, "aggregates[0].field", "single-valued"),
    ({"aggregates": [{"function": "percentile", "field": "qty"}]}, "aggregates[0].percentile", "required"),
    ({"aggregates": [{"function": "percentile", "field": "qty", "percentile": 150}]}, "aggregates[0].percentile",
     "between 0 and 100"),
    ({"aggregates": [{"function": "percentile", "field": "qty", "percentile": -0.1}]}, "aggregates[0].percentile",
     "between 0 and 100"),
    ({"aggregates": [{"function": "sum", "field": "qty", "percentile": 50}]}, "aggregates[0].percentile",
     "only the percentile function"),
    ({"aggregates": [{"function": "count", "alias": "bad alias"}]}, "aggregates[0].alias", "letters"),
    ({"aggregates": [COUNT, {"function": "count", "alias": "count"}]}, "aggregates[1].alias", "used twice"),
    ({"groupBy": ["status"], "aggregates": [{"function": "count", "alias": "status"}]}, "aggregates[0].alias",
     "used twice"),
    ({"groupBy": ["nope"], "aggregates": [COUNT]}, "groupBy[0]", "unknown field 'nope'"),
    ({"groupBy": ["at:minute"], "aggregates": [COUNT]}, "groupBy[0]", "unknown bucket ':minute'"),
    ({"groupBy": ["qty:day"], "aggregates": [COUNT]}, "groupBy[0]", "date or datetime"),
    ({"groupBy": ["due:hour"], "aggregates": [COUNT]}, "groupBy[0]", "needs a datetime"),
    ({"groupBy": ["meta"], "aggregates": [COUNT]}, "groupBy[0]", "json"),
    ({"groupBy": [""], "aggregates": [COUNT]}, "groupBy[0]", "field name"),
    ({"groupBy": ["status", "status"], "aggregates": [COUNT]}, "groupBy[1]", "used twice"),
    ({"groupBy": ["status"] * 9, "aggregates": [COUNT]}, "groupBy", "at most 8"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "having": {"nope": 1}}, "having.nope", "unknown alias 'nope'"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "having": {"$or": [{"nope": 1}]}}, "having.$or[0].nope",
     "unknown alias 'nope'"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "having": {"count": {"$gt": "many"}}}, "having.count.$gt",
     "expected a number"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "having": {"status": {"$contains": "o"}}}, "having.status",
     "not available in having"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "having": {"$search": "x"}}, "having", "$search"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "sortBy": "qty"}, "sortBy", "unknown alias 'qty'"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "sortOrder": 2}, "sortOrder", "1"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "limit": 0}, "limit", "between 1 and 1000"),
    ({"groupBy": ["status"], "aggregates": [COUNT], "limit": 1001}, "limit", "between 1 and 1000"),
    ({"groupBy": ["at:day"], "aggregates": [COUNT], "timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
    ({"aggregates": [COUNT], "filters": {"qty": {"$gt": "x"}}}, None, "filters.qty.$gt"),
    ({"aggregates": [COUNT], "filters": {"nope": 1}}, None, "unknown field 'nope'"),
]


@pytest.mark.parametrize(("body", "path", "text"), BAD_REQUESTS)
def test_bad_request(fixed, body, path, text):
    client, headers = fixed
    resp = aggregate(client, headers, body)
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    if path is None:
        assert text in error["message"]
        return
    fields = error["details"]["fields"]
    flat = {k: " ".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in _flatten(fields).items()}
    under = [v for k, v in flat.items() if k == path or k.startswith((path + ".", path + "["))]
    assert under, fields
    assert any(text in v for v in under), fields


def _flatten(value, prefix=""):
    """marshmallow nests errors by index ({aggregates: {0: {...}}}); ours are dotted paths already."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = f"{prefix}[{k}]" if isinstance(k, int) or str(k).isdigit() else (f"{prefix}.{k}" if prefix else k)
            out.update(_flatten(v, key))
        return out
    return {prefix: value}


def test_unknown_entity_is_404(fixed):
    client, headers = fixed
    assert aggregate(client, headers, {"aggregates": [COUNT]}, "nothing").status_code == 404


# --- property test: the SQL matches a plain-Python reference --------------------------------------

STATUSES = ["open", "closed", "pending"]
LABELS = ["red", "green", "blue"]
MISSING = object()
record_fields = st.fixed_dictionaries({}, optional={
    "qty": st.one_of(st.none(), st.integers(-50, 50)),
    "price": st.one_of(st.none(), st.integers(-400, 400).map(lambda n: n / 4)),
    "status": st.one_of(st.none(), st.sampled_from(STATUSES)),
    "labels": st.lists(st.sampled_from(LABELS), unique=True, max_size=3),
    "owner": st.sampled_from(["", "ann", "bob", "cy"]),
})
GROUPINGS = [[], ["status"], ["labels"], ["status", "labels"], ["owner"], ["qty"]]


def _blank(value):
    return value is MISSING or value is None or value == "" or value == []


def _percentile(values, fraction):
    ordered = sorted(values)
    k = (len(ordered) - 1) * fraction
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def reference_values(records, field, fraction):
    present = [r.get(field, MISSING) for r in records]
    nums = [v for v in present if not _blank(v)]
    return {
        "count": len(records), f"count_{field}": len(nums), f"sum_{field}": sum(nums) if nums else None,
        f"avg_{field}": sum(nums) / len(nums) if nums else None, f"min_{field}": min(nums, default=None),
        f"max_{field}": max(nums, default=None), f"distinct_count_{field}": len(set(nums)),
        f"percentile_{field}": _percentile(nums, fraction) if nums else None,
    }


def reference_groups(records, group_by):
    groups: dict[tuple, list] = {}
    for record in records:
        options = []
        for name in group_by:
            value = record.get(name)
            if name == "labels":
                options.append(list(value) if value else [None])
            else:
                options.append([None if value is MISSING else value])
        keys = [()]
        for values in options:
            keys = [(*k, v) for k in keys for v in values]
        for key in keys:
            groups.setdefault(key, []).append(record)
    return groups


def _close(a, b):
    if a is None or b is None:
        return a is b
    return a == pytest.approx(b, rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(records=st.lists(record_fields, min_size=0, max_size=25), grouping=st.sampled_from(GROUPINGS),
       field=st.sampled_from(["qty", "price"]), fraction=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
def test_matches_python_reference(app, records, grouping, field, fraction):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "items", SCHEMA)
    if records:
        resp = client.post(f"{BASE}/items/records/bulk/create", headers=headers,
                           json={"records": [{"name": f"r{i}", "fields": f} for i, f in enumerate(records)]})
        assert resp.status_code == 200, resp.get_json()
    aggregates = [{"function": "count"}] + [{"function": fn, "field": field}
                                           for fn in ("count", "sum", "avg", "min", "max", "distinct_count")]
    aggregates.append({"function": "percentile", "field": field, "percentile": fraction * 100})
    body = ok(aggregate(client, headers, {"groupBy": grouping, "aggregates": aggregates}))

    def check(values, expected):
        assert values.keys() == expected.keys()
        for alias, value in values.items():
            assert _close(value, expected[alias]), (alias, value, expected[alias])

    check(body["totals"], reference_values(records, field, fraction))
    if not grouping:
        assert len(body["groups"]) == 1 and body["groups"][0]["count"] == len(records)
        return
    expected = reference_groups(records, grouping)
    got = {tuple(g["key"][name] for name in grouping): g for g in body["groups"]}
    assert got.keys() == expected.keys()
    for key, members in expected.items():
        assert got[key]["count"] == len(members)
        check(got[key]["values"], reference_values(members, field, fraction))
    # default order: keys ascending, missing values last
    order = [tuple(g["key"][name] for name in grouping) for g in body["groups"]]
    assert order == sorted(order, key=lambda k: tuple((v is None, v if v is not None else 0) for v in k))


# --- robustness: random (mostly wrong) requests are answered 200 or 400, never 500 ------------------

FIELD_NAMES = [*SCHEMA["properties"], "created_at", "updated_at", "id", "name", "tags", "version", "is_active",
               "nope", "", "a:b:c"]
SUFFIXES = ["", ":day", ":hour", ":week", ":month", ":quarter", ":year", ":minute", ":"]
# finite floats only: JSON has no Infinity (the test client would send the literal, which every route
# refuses as malformed JSON: 400 INVALID_INPUT, tested in test_robustness), and this test is about valid JSON
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=12), st.sampled_from(["2026-01-01", "2026-01-01T00:00:00Z", "open"]))
having_values = st.one_of(json_scalars, st.dictionaries(
    st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$between", "$exists", "$contains",
                     "$search", "$foo"]),
    st.one_of(json_scalars, st.lists(json_scalars, max_size=3)), max_size=2))
aggregate_fields = st.fixed_dictionaries(
    {"function": st.sampled_from([*("count", "sum", "avg", "min", "max", "distinct_count", "percentile"), "x"])},
    optional={"field": st.sampled_from(FIELD_NAMES), "alias": st.sampled_from(["a", "b", "count", "bad-alias"]),
              "percentile": st.one_of(st.none(), st.floats(-10, 200, allow_nan=False))})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group_by=st.lists(st.tuples(st.sampled_from(FIELD_NAMES), st.sampled_from(SUFFIXES)).map("".join),
                         max_size=3),
       aggregates=st.lists(aggregate_fields, min_size=1, max_size=3),
       having=st.one_of(st.none(), st.dictionaries(
           st.sampled_from(["count", "a", "b", "status", "qty", "created_at_day", "$or", "$not"]), having_values,
           max_size=2)),
       extra=st.fixed_dictionaries({}, optional={
           "sortBy": st.sampled_from(["count", "a", "status", "nope"]), "sortOrder": st.sampled_from([1, -1, 0]),
           "limit": st.integers(-1, 1200), "timezone": st.sampled_from(["UTC", "Europe/Berlin", "Nope/Zone", ""])}))
def test_random_requests_never_fail_with_500(fixed, group_by, aggregates, having, extra):
    client, headers = fixed
    body = {"groupBy": group_by, "aggregates": aggregates, **extra}
    if having is not None:
        body["having"] = having
    resp = aggregate(client, headers, body)
    assert resp.status_code in (200, 400), (body, resp.get_json())
    if resp.status_code == 400:
        assert resp.get_json()["error"]["code"] == "VALIDATION_ERROR"
    else:
        assert resp.get_json()["totals"].keys() == {a.get("alias") or a["function"] if "field" not in a
                                                   else a.get("alias") or f"{a['function']}_{a['field']}"
                                                   for a in aggregates}
