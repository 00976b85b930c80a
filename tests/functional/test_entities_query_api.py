"""Record query through HTTP: every operator on a fixed data set, sorting, paging, projection, lookups."""

from __future__ import annotations

import pytest

from tests.functional.entities_support import (
    BASE,
    FIXED_RECORDS,
    create_definition,
    create_record,
    names,
    org_headers,
    query,
)

ALL = {"Alpha", "Beta", "Gamma", "Delta", "Epsilon"}


@pytest.fixture(scope="module")
def dataset(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    ids = {r["name"]: create_record(client, headers, "items", r)["id"] for r in FIXED_RECORDS}
    return client, headers, ids


OPERATOR_CASES = [
    ({"status": "open"}, {"Alpha", "Delta"}),
    ({"status": {"$eq": "open"}}, {"Alpha", "Delta"}),
    ({"status": {"$ne": "open"}}, {"Beta", "Gamma", "Epsilon"}),
    ({"status": "OPEN"}, set()),
    ({"qty": {"$gt": 1}}, {"Beta", "Gamma", "Epsilon"}),
    ({"qty": {"$gte": 5}}, {"Beta", "Gamma", "Epsilon"}),
    ({"qty": {"$lt": 1}}, {"Delta"}),
    ({"qty": {"$lte": 1}}, {"Alpha", "Delta"}),
    ({"qty": {"$between": [1, 5]}}, {"Alpha", "Beta", "Epsilon"}),
    ({"qty": {"$between": [5, 1]}}, set()),
    ({"qty": {"$in": [1, 10]}}, {"Alpha", "Gamma"}),
    ({"qty": {"$nin": [1, 10]}}, {"Beta", "Delta", "Epsilon"}),
    ({"qty": {"$in": []}}, set()),
    ({"qty": "5"}, {"Beta", "Epsilon"}),
    ({"qty": 5.0}, {"Beta", "Epsilon"}),
    ({"qty": {"$gt": "4.5"}}, {"Beta", "Gamma", "Epsilon"}),
    ({"price": {"$gt": 2}}, {"Beta", "Epsilon"}),
    ({"price": {"$exists": True}}, {"Alpha", "Beta", "Epsilon"}),
    ({"price": {"$exists": False}}, {"Gamma", "Delta"}),
    ({"price": None}, {"Gamma", "Delta"}),
    ({"price": {"$ne": None}}, {"Alpha", "Beta", "Epsilon"}),
    ({"title": {"$contains": "HELLO"}}, {"Alpha", "Beta"}),
    ({"title": {"$contains": "%"}}, {"Beta"}),
    ({"title": {"$contains": "_"}}, {"Gamma"}),
    ({"title": {"$contains": "0%"}}, {"Beta"}),
    ({"title": {"$startsWith": "hello"}}, {"Alpha", "Beta"}),
    ({"title": {"$startsWith": "ÜNÏ"}}, {"Epsilon"}),
    ({"title": {"$endsWith": "STRAßE"}}, {"Epsilon"}),
    ({"title": {"$endsWith": "%"}}, {"Beta"}),
    ({"title": {"$gt": "hello"}}, {"Beta", "Gamma", "Epsilon"}),
    ({"title": {"$empty": True}}, {"Delta"}),
    ({"title": {"$empty": False}}, {"Alpha", "Beta", "Gamma", "Epsilon"}),
    ({"labels": {"$empty": True}}, {"Gamma", "Epsilon"}),
    ({"labels": {"$contains": "red"}}, {"Alpha", "Beta"}),
    ({"labels": "green"}, {"Beta"}),
    ({"labels": ["red", "green"]}, {"Beta"}),
    ({"labels": {"$in": ["green", "blue"]}}, {"Beta", "Delta"}),
    ({"labels": {"$nin": ["red"]}}, {"Gamma", "Delta", "Epsilon"}),
    ({"active": True}, {"Alpha", "Gamma"}),
    ({"active": {"$ne": True}}, {"Beta", "Delta", "Epsilon"}),
    ({"active": {"$in": [False]}}, {"Beta"}),
    ({"due": {"$gte": "2026-01-10"}}, {"Alpha", "Beta"}),
    ({"due": {"$lt": "2026-01-01"}}, {"Gamma"}),
    ({"due": "2026-02-01"}, {"Beta"}),
    ({"at": "2026-01-10T10:00:00Z"}, {"Alpha", "Beta"}),
    ({"at": {"$gt": "2026-01-10"}}, {"Alpha", "Beta", "Epsilon"}),
    ({"at": {"$between": ["2026-02-01T00:00:00Z", "2026-12-31T00:00:00+01:00"]}}, {"Epsilon"}),
    ({"at": {"$lt": "2026-01-10T10:00:00.000001Z"}}, {"Alpha", "Beta"}),
    ({"amount": {"$gte": 10}}, {"Alpha", "Beta"}),
    ({"amount": 20}, {"Beta"}),
    ({"meta": {"a": 1}}, {"Delta"}),
    ({"meta": {"$exists": True}}, {"Delta"}),
    ({"email": {"$endsWith": "@X.IO"}}, {"Alpha"}),
    ({"$or": [{"qty": 1}, {"status": "pending"}]}, {"Alpha", "Gamma"}),
    ({"$and": [{"qty": {"$gte": 5}}, {"$not": {"status": "closed"}}]}, {"Gamma", "Epsilon"}),
    ({"$not": {"labels": {"$contains": "red"}}}, {"Gamma", "Delta", "Epsilon"}),
    ({"$not": {"$or": [{"qty": 5}, {"qty": {"$lt": 0}}]}}, {"Alpha", "Gamma"}),
    ({"qty": {"$gt": 0, "$lt": 10}}, {"Alpha", "Beta", "Epsilon"}),
    ({"qty": 5, "status": "closed"}, {"Beta"}),
    ({"$search": "hello"}, {"Alpha", "Beta"}),
    ({"$search": "alpha or gamma"}, {"Alpha", "Gamma"}),
    ({"$search": '"hello world"'}, {"Alpha"}),
    ({"$search": '"world hello"'}, set()),
    ({"$search": "hello -world"}, {"Beta"}),
    ({"$search": "worlds"}, {"Alpha"}),  # stemmed
    ({"title": {"$search": "world"}}, {"Alpha"}),
    ({"name": {"$search": "world"}}, set()),
    ({"status": "open", "qty": {"$gt": 0}, "$search": "alpha"}, {"Alpha"}),
    ({"name": {"$startsWith": "al"}}, {"Alpha"}),
    ({"name": {"$in": ["Beta", "Zeta"]}}, {"Beta"}),
    ({"tags": "vip"}, {"Alpha", "Beta"}),
    ({"tags": {"$in": ["new", "x"]}}, {"Beta"}),
    ({"tags": {"$empty": True}}, {"Gamma", "Delta", "Epsilon"}),
    ({"version": 1}, ALL),
    ({"is_active": True}, ALL),
    ({"created_at": {"$lte": "2999-01-01"}}, ALL),
    ({"created_at": {"$gt": "2999-01-01T00:00:00Z"}}, set()),
    ({"$similar": "anything like alpha"}, set()),
    ({"title": {"$similar": {"query": "hello", "maxDistance": 0.5}}}, set()),
    ({}, ALL),
]


@pytest.mark.parametrize(("filters", "expected"), OPERATOR_CASES, ids=[str(c[0]) for c in OPERATOR_CASES])
def test_operator(dataset, filters, expected):
    client, headers, _ = dataset
    assert names(query(client, headers, "items", filters=filters, pageSize=100)) == expected
    count = client.post(f"{BASE}/items/records/count", json={"filters": filters}, headers=headers)
    assert count.status_code == 200 and count.get_json() == len(expected)


def test_id_filter(dataset):
    client, headers, ids = dataset
    assert names(query(client, headers, "items", filters={"id": ids["Gamma"]})) == {"Gamma"}
    assert names(query(client, headers, "items", filters={"id": {"$nin": [ids["Gamma"]]}})) == ALL - {"Gamma"}


BAD_FILTERS = [
    ({"nope": 1}, "unknown field"),
    ({"qty": {"$regex": "x"}}, "unknown operator"),
    ({"$where": "1=1"}, "unknown operator"),
    ({"active": {"$gt": True}}, "$gt"),
    ({"qty": {"$contains": 1}}, "$contains"),
    ({"qty": {"$in": 5}}, "$in takes a list"),
    ({"qty": {"$between": [1]}}, "$between"),
    ({"qty": "abc"}, "number"),
    ({"qty": True}, "number"),
    ({"qty": "NaN"}, "finite"),
    ({"title": {"$contains": 5}}, "string"),
    ({"due": "10/01/2026"}, "YYYY-MM-DD"),
    ({"at": "yesterday"}, "datetime"),
    ({"price": {"$exists": "yes"}}, "true or false"),
    ({"$and": []}, "non-empty list"),
    ({"$or": {"qty": 1}}, "non-empty list"),
    ({"$not": [1]}, "must be an object"),
    ({"$search": "  "}, "non-empty"),
    ({"$search": 5}, "string"),
    ({"$or": [{"$similar": "x"}]}, "top level"),
    ({"labels": {"$startsWith": "r"}}, "text field"),
    ({"qty": {"$search": "x"}}, "$search needs a text field"),
    ({"qty": {"$gt": 1, "plain": 2}}, "do not mix"),
    ({"meta": {"$gt": 1}}, "$gt"),
    ({"version": 1.5}, "integer"),
]


@pytest.mark.parametrize(("filters", "fragment"), BAD_FILTERS, ids=[str(c[0]) for c in BAD_FILTERS])
def test_bad_filters_are_400(dataset, filters, fragment):
    client, headers, _ = dataset
    for resp in (query(client, headers, "items", filters=filters),
                 client.post(f"{BASE}/items/records/count", json={"filters": filters}, headers=headers)):
        assert resp.status_code == 400, resp.get_json()
        body = resp.get_json()
        assert body["error"]["code"] == "VALIDATION_ERROR"
        assert fragment in body["error"]["message"]
        assert body["error"]["details"]["path"].startswith("filters")


def test_a_nul_in_a_filter_is_the_one_nul_rule(dataset):
    """A NUL anywhere in a body is the parser's rule (app.jsonbody): 400 VALIDATION_ERROR naming the path."""
    client, headers, _ = dataset
    for resp, where in ((query(client, headers, "items", filters={"title": "a\x00b"}), "query.filters.title"),
                        (client.post(f"{BASE}/items/records/count", json={"filters": {"title": "a\x00b"}},
                                     headers=headers), "filters.title")):
        assert resp.status_code == 400, resp.get_json()
        assert resp.get_json()["error"]["code"] == "VALIDATION_ERROR"
        assert resp.get_json()["error"]["details"] == {
            "fields": {where: ["must not contain the NUL character (U+0000)"]}}


def test_filter_limits(dataset):
    client, headers, _ = dataset
    deep: dict = {"qty": 1}
    for _ in range(10):
        deep = {"$not": deep}
    resp = query(client, headers, "items", filters=deep)
    assert resp.status_code == 400 and "levels deep" in resp.get_json()["error"]["message"]
    wide = {"$or": [{"qty": i} for i in range(101)]}
    resp = query(client, headers, "items", filters=wide)
    assert resp.status_code == 400 and "conditions" in resp.get_json()["error"]["message"]
    many = {"qty": {"$in": list(range(1001))}}
    resp = query(client, headers, "items", filters=many)
    assert resp.status_code == 400 and "1000" in resp.get_json()["error"]["message"]
    assert query(client, headers, "items", filters="qty=1").status_code == 400


def test_pagination_edges(dataset):
    client, headers, _ = dataset
    first = query(client, headers, "items", page=1, pageSize=2, sortBy="name", sortOrder=1).get_json()
    assert [r["name"] for r in first["records"]] == ["Alpha", "Beta"]
    assert {k: first[k] for k in ("totalCount", "currentPage", "pageSize", "totalPages", "hasNextPage",
                                  "hasPreviousPage")} == {
        "totalCount": 5, "currentPage": 1, "pageSize": 2, "totalPages": 3, "hasNextPage": True,
        "hasPreviousPage": False}
    last = query(client, headers, "items", page=3, pageSize=2, sortBy="name", sortOrder=1).get_json()
    assert [r["name"] for r in last["records"]] == ["Gamma"]
    assert last["hasNextPage"] is False and last["hasPreviousPage"] is True
    past = query(client, headers, "items", page=9, pageSize=2).get_json()
    assert past["records"] == [] and past["totalCount"] == 5 and past["currentPage"] == 9
    assert past["hasNextPage"] is False and past["hasPreviousPage"] is True
    empty = query(client, headers, "items", filters={"qty": 12345}).get_json()
    assert empty == {"records": [], "totalCount": 0, "currentPage": 1, "pageSize": 20, "totalPages": 0,
                     "hasNextPage": False, "hasPreviousPage": False, "nextCursor": None}
    default = client.post(f"{BASE}/items/records/query", json={}, headers=headers).get_json()
    assert default["currentPage"] == 1 and default["pageSize"] == 20 and len(default["records"]) == 5
    for bad in ({"pageSize": 501}, {"pageSize": 0}, {"page": 0}, {"page": "x"}, {"sortOrder": 2},
                {"unknownKey": 1}):
        resp = query(client, headers, "items", **bad)
        assert resp.status_code == 400, (bad, resp.get_json())
        assert resp.get_json()["error"]["code"] == "VALIDATION_ERROR"
    assert query(client, headers, "items", pageSize=500).status_code == 200


def test_sorting_is_typed_with_nulls_last_and_id_tiebreak(dataset):
    client, headers, ids = dataset
    asc = query(client, headers, "items", sortBy="qty", sortOrder=1).get_json()["records"]
    fives = sorted([ids["Beta"], ids["Epsilon"]])
    assert [r["name"] for r in asc][:2] == ["Delta", "Alpha"] and [r["id"] for r in asc][2:4] == fives
    assert asc[-1]["name"] == "Gamma"  # 10 after 5 (numeric, not text order)
    desc = query(client, headers, "items", sortBy="price", sortOrder=-1).get_json()["records"]
    assert [r["name"] for r in desc][:3] == ["Epsilon", "Beta", "Alpha"]
    assert {r["name"] for r in desc[3:]} == {"Gamma", "Delta"}
    by_at = query(client, headers, "items", sortBy="at", sortOrder="desc").get_json()["records"]
    assert by_at[0]["name"] == "Epsilon"
    by_due = query(client, headers, "items", sortBy="due", sortOrder=1).get_json()["records"]
    assert [r["name"] for r in by_due][:3] == ["Gamma", "Alpha", "Beta"]
    by_created = query(client, headers, "items", sortBy="created_at", sortOrder=1).get_json()["records"]
    assert [r["name"] for r in by_created] == ["Alpha", "Beta", "Gamma", "Delta", "Epsilon"]
    newest_first = query(client, headers, "items").get_json()["records"]
    assert [r["name"] for r in newest_first] == ["Epsilon", "Delta", "Gamma", "Beta", "Alpha"]
    resp = query(client, headers, "items", sortBy="nope")
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "VALIDATION_ERROR"


def test_search_without_sort_is_ranked(dataset):
    client, headers, _ = dataset
    create_definition(client, headers, name="notes", schema={"type": "object", "properties": {
        "body": {"type": "text"}}})
    for name, body in [("one", "cats"), ("two", "cats cats cats and more cats"), ("three", "dogs")]:
        create_record(client, headers, "notes", {"name": name, "fields": {"body": body}})
    ranked = query(client, headers, "notes", filters={"$search": "cat"}).get_json()["records"]
    assert [r["name"] for r in ranked] == ["two", "one"]
    by_name = query(client, headers, "notes", filters={"$search": "cat"}, sortBy="name").get_json()["records"]
    assert [r["name"] for r in by_name] == ["one", "two"]


def test_include_exclude(dataset):
    client, headers, _ = dataset
    only = query(client, headers, "items", filters={"qty": 1}, include=["qty", "status"]).get_json()
    assert only["records"][0]["fields"] == {"qty": 1, "status": "open"}
    without = query(client, headers, "items", filters={"qty": 1}, exclude=["title", "email"]).get_json()
    assert "title" not in without["records"][0]["fields"] and without["records"][0]["fields"]["qty"] == 1
    resp = query(client, headers, "items", include=["nope"])
    assert resp.status_code == 400 and "nope" in str(resp.get_json()["error"]["details"])


def test_include_lookups(client, auth):
    headers = auth()
    create_definition(client, headers, name="people", schema={"type": "object", "properties": {
        "email": {"type": "email"}, "city": {"type": "string"}}})
    create_definition(client, headers, name="deals", schema={"type": "object", "properties": {
        "owner": {"type": "lookup", "entity": "people"}, "team": {"type": "multilookup"},
        "size": {"type": "int"}}})
    ann = create_record(client, headers, "people", {"name": "Ann", "fields": {"email": "ann@x.io", "city": "Oslo"}})
    bob = create_record(client, headers, "people", {"name": "Bob", "fields": {"city": "Rome"}})
    create_record(client, headers, "deals", {"name": "Big", "fields": {
        "owner": ann["id"], "team": [ann["id"], bob["id"], "missing-id"], "size": 3}})
    create_record(client, headers, "deals", {"name": "Orphan", "fields": {"owner": "missing-id"}})
    resp = query(client, headers, "deals", sortBy="name",
                 includeLookups=[{"field": "owner", "fields": ["city"]}, {"field": "team"}])
    records = resp.get_json()["records"]
    big, orphan = records
    assert big["fields"]["owner"] == ann["id"]  # ids stay in fields
    assert big["lookups"]["owner"] == {**big["lookups"]["owner"], "id": ann["id"], "name": "Ann",
                                       "entityName": "people", "fields": {"city": "Oslo"}}
    assert [t["name"] for t in big["lookups"]["team"]] == ["Ann", "Bob"]
    assert big["lookups"]["team"][0]["fields"] == {"email": "ann@x.io", "city": "Oslo"}
    assert orphan["lookups"] == {"owner": None, "team": []}
    resp = query(client, headers, "deals", includeLookups=[{"field": "size"}])
    assert resp.status_code == 400
    resp = query(client, headers, "deals", includeLookups=[{"name": "owner"}])
    assert resp.status_code == 400


def _record_statements(app, fn) -> list[bool]:
    """Whether each statement on entity_records ran in autocommit (no BEGIN/ROLLBACK around it)."""
    from sqlalchemy import event

    from app.db import db

    with app.app_context():
        engine = db.engine
    seen: list[bool] = []

    def before(conn, _cursor, statement, *_args):
        if "entity_records" in statement:
            seen.append(conn.connection.dbapi_connection.autocommit)

    event.listen(engine, "before_cursor_execute", before)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", before)
    return seen


def test_query_and_count_without_similar_run_in_autocommit_with_the_same_answers(app, dataset):
    client, headers, _ids = dataset
    filters = {"$or": [{"status": "open"}, {"qty": {"$gt": 5}}]}

    def both():
        page = query(client, headers, "items", filters=filters, sortBy="qty")
        assert page.status_code == 200 and names(page) == {"Alpha", "Delta", "Gamma"}
        count = client.post(f"{BASE}/items/records/count", json={"filters": filters}, headers=headers)
        assert count.status_code == 200 and count.get_json() == 3

    seen = _record_statements(app, both)
    assert len(seen) == 2 and all(seen)  # count and page in one statement, then the count route's count


def test_similar_in_the_filters_runs_in_autocommit_too(app, dataset):
    """(Its index walk's settings are then session-level: test_semantic_search_api checks they hold.)"""
    client, headers, _ids = dataset
    filters = {"status": "open", "$similar": {"query": "x"}}  # no embeddings here: matches nothing

    def similar():
        resp = client.post(f"{BASE}/items/records/count", json={"filters": filters}, headers=headers)
        assert resp.status_code == 200 and resp.get_json() == 0, resp.get_json()

    seen = _record_statements(app, similar)
    assert seen and all(seen)


@pytest.mark.parametrize("params", [
    {"filters": {"qty": {"$gte": 1}}, "pageSize": 2}, {"filters": {"qty": {"$gte": 1}}, "pageSize": 2, "page": 99},
    {"filters": {"qty": {"$gte": 10_000}}}, {"sortBy": "due", "sortOrder": -1, "pageSize": 2},
    {"filters": {"$search": "alpha"}, "pageSize": 3}, {"sortBy": "meta", "pageSize": 3},
    {"filters": {"status": "open"}, "sortBy": "title", "sortOrder": 1, "include": ["title"]},
])
def test_a_page_and_its_exact_count_are_one_statement(app, dataset, params, monkeypatch):
    """Without a projection too: the exact count and the page in one statement, a cursor page as well,
    each answering exactly as the count and the page in two statements."""
    from app.entities import query as engine

    client, headers, _ids = dataset
    query(client, headers, "items")  # the definition cached
    got: list = []
    seen = _record_statements(app, lambda: got.append(query(client, headers, "items", **params)))
    assert len(seen) == 1, seen
    assert got[0].status_code == 200, got[0].get_json()
    body = got[0].get_json()
    monkeypatch.setattr(engine, "COUNT_WITH_PAGE", False)
    assert body == query(client, headers, "items", **params).get_json()
    monkeypatch.undo()
    if body["nextCursor"]:
        following = []
        seen = _record_statements(app, lambda: following.append(
            query(client, headers, "items", **{**params, "cursor": body["nextCursor"]})))
        assert len(seen) == 1 and following[0].status_code == 200, following[0].get_json()
        monkeypatch.setattr(engine, "COUNT_WITH_PAGE", False)
        assert following[0].get_json() == query(client, headers, "items",
                                                **{**params, "cursor": body["nextCursor"]}).get_json()
