"""A property the definition's schema declares wins over the system column of the same name, through
HTTP: filters (also nested), field-level $search, sort, include/exclude, count, groupBy, having and
aggregates all address the record's own `is_active`, `name`, `version`, `tags`, `id`, `created_at`."""

from __future__ import annotations

import pytest

from tests.functional.entities_support import BASE, create_definition, create_record, names, org_headers, query

SHADOW_SCHEMA = {"type": "object", "properties": {
    "is_active": {"type": "bool"}, "name": {"type": "string"}, "version": {"type": "string"},
    "tags": {"type": "multiselect", "options": ["x", "y"]}, "id": {"type": "string"},
    "created_at": {"type": "date"}, "qty": {"type": "int"},
}}
RECORDS = [
    {"name": "Alpha", "tags": ["sys"], "fields": {"is_active": False, "name": "red apple", "version": "v2",
                                                  "tags": ["x"], "id": "ext-1", "created_at": "2020-01-01", "qty": 1}},
    {"name": "Beta", "tags": ["sys"], "fields": {"is_active": True, "name": "green pear", "version": "v10",
                                                 "tags": ["y"], "id": "ext-2", "created_at": "2021-06-01", "qty": 5}},
    {"name": "Gamma", "tags": ["sys"], "fields": {"qty": 7}},
]


@pytest.fixture(scope="module")
def shadow(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, name="shadow", schema=SHADOW_SCHEMA)
    ids = {r["name"]: create_record(client, headers, "shadow", r)["id"] for r in RECORDS}
    return client, headers, ids


@pytest.mark.parametrize("filters, expected", [
    ({"is_active": False}, {"Alpha"}),
    ({"is_active": True}, {"Beta"}),
    ({"is_active": {"$exists": False}}, {"Gamma"}),
    ({"name": "red apple"}, {"Alpha"}),
    ({"name": {"$contains": "PEAR"}}, {"Beta"}),
    ({"name": {"$search": "apple"}}, {"Alpha"}),
    ({"version": "v2"}, {"Alpha"}),
    ({"version": {"$in": ["v10", "v3"]}}, {"Beta"}),
    ({"tags": {"$contains": "x"}}, {"Alpha"}),
    ({"tags": "sys"}, set()),
    ({"id": "ext-2"}, {"Beta"}),
    ({"created_at": {"$lt": "2021-01-01"}}, {"Alpha"}),
    ({"$or": [{"is_active": False}, {"$not": {"name": {"$exists": True}}}]}, {"Alpha", "Gamma"}),
    ({"$and": [{"$not": {"is_active": True}}, {"qty": {"$gte": 1}}]}, {"Alpha", "Gamma"}),
    ({"updated_at": {"$exists": True}}, {"Alpha", "Beta", "Gamma"}),  # not declared: the system column
])
def test_filters_address_the_declared_property(shadow, filters, expected):
    client, headers, _ = shadow
    assert names(query(client, headers, "shadow", filters=filters)) == expected
    count = client.post(f"{BASE}/shadow/records/count", json={"filters": filters}, headers=headers)
    assert count.get_json() == len(expected)


def test_values_are_typed_by_the_declared_property(shadow):
    client, headers, _ = shadow
    # the system `version` is an integer; the declared one is a string, so "v2" is fine and 2 is not
    resp = query(client, headers, "shadow", filters={"version": 2})
    assert resp.status_code == 400 and resp.get_json()["error"]["details"]["path"] == "filters.version"


def test_sort_and_projection_use_the_declared_property(shadow):
    client, headers, _ = shadow
    resp = query(client, headers, "shadow", sortBy="name", sortOrder=1, include=["name", "is_active"])
    records = resp.get_json()["records"]
    assert [r["name"] for r in records] == ["Beta", "Alpha", "Gamma"]  # green pear, red apple, missing last
    assert records[0]["fields"] == {"name": "green pear", "is_active": True}
    excluded = query(client, headers, "shadow", sortBy="created_at", sortOrder=-1, exclude=["id", "tags"])
    records = excluded.get_json()["records"]
    assert [r["name"] for r in records] == ["Beta", "Alpha", "Gamma"]
    assert "id" not in records[0]["fields"] and records[0]["id"] != "ext-2"


def _aggregate(client, headers, body):
    resp = client.post(f"{BASE}/shadow/records/aggregate", json=body, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_group_by_having_and_aggregates_use_the_declared_property(shadow):
    client, headers, _ = shadow
    body = _aggregate(client, headers, {"groupBy": ["is_active"], "aggregates": [{"function": "sum", "field": "qty"}],
                                        "sortBy": "sum_qty"})
    assert [(g["key"]["is_active"], g["values"]["sum_qty"]) for g in body["groups"]] == [(False, 1), (True, 5),
                                                                                         (None, 7)]
    having = _aggregate(client, headers, {"groupBy": ["name"], "aggregates": [{"function": "count"}],
                                          "having": {"name": "red apple"}})
    assert [g["key"] for g in having["groups"]] == [{"name": "red apple"}]
    # an alias may now be a system column's name
    aliased = _aggregate(client, headers, {"aggregates": [{"function": "max", "field": "version", "alias": "version"},
                                                          {"function": "min", "field": "created_at"}],
                                           "having": {"version": {"$eq": "v2"}}})
    assert aliased["groups"][0]["values"] == {"version": "v2", "min_created_at": "2020-01-01"}
    buckets = _aggregate(client, headers, {"groupBy": ["created_at:year"], "aggregates": [{"function": "count"}]})
    assert {g["key"]["created_at_year"] for g in buckets["groups"]} == {"2020-01-01", "2021-01-01", None}


def test_views_accept_the_declared_property(shadow):
    client, headers, _ = shadow
    resp = client.post(f"{BASE}/definitions/shadow/views", json={
        "name": "inactive", "columns": ["name", "is_active", "version"], "sortBy": "version",
        "filters": {"is_active": False}}, headers=headers)
    assert resp.status_code == 201, resp.get_json()
