"""Entity store at scale: per-definition indexes (built by the index task) and `Prefer: count=…`."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.entities.fieldtypes import compile_definition_schema
from app.entities.indexes import PREFIX, definition_key, plan_indexes
from tests.functional.entities_support import (
    ALL_TYPES_SCHEMA,
    BASE,
    FIXED_RECORDS,
    create_definition,
    create_record,
    names,
    org_headers,
    query,
)
from tests.support import bearer, token


def definition_indexes(app, definition_id: str) -> dict[str, str]:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        rows = conn.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'product_default' "
                                 "AND indexname LIKE :p"), {"p": f"{PREFIX}{definition_key(definition_id)}%"})
        return dict(rows.all())


# --- index planning (pure) ----------------------------------------------------------------------

def test_plan_indexes_covers_scalar_fields_with_the_compilers_expressions():
    planned = plan_indexes("def-1", compile_definition_schema(ALL_TYPES_SCHEMA).catalog)
    by_field: dict[str, list] = {}
    for p in planned:
        by_field.setdefault(p.field, []).append(p)
    # numbers, dates, datetimes, short text: a b-tree; short text (not dropdowns) also a trigram GIN
    assert {p.method for p in by_field["title"]} == {"btree", "gin"}
    assert [p.method for p in by_field["status"]] == ["btree"]
    assert [p.method for p in by_field["qty"]] == ["btree"]
    assert "DESC NULLS LAST" in by_field["due"][0].definition
    assert "public.entity_iso_timestamptz" in by_field["at"][0].definition
    assert "gin_trgm_ops" in [p for p in by_field["title"] if p.method == "gin"][0].definition
    # the definition's own copies of the generic GINs; long text, booleans, lists and JSON use them
    assert sorted(p.definition for p in by_field[""]) == ["(fields jsonb_path_ops)", "(search_vector)"]
    for name in ("body", "notes", "active", "labels", "watchers", "meta", "attachment", "photo"):
        assert name not in by_field
    # stable, unique names of at most 63 characters, tied to the definition
    assert len({p.name for p in planned}) == len(planned)
    assert all(len(p.name) <= 63 and p.name.startswith(f"{PREFIX}{definition_key('def-1')}_") for p in planned)
    assert [p.name for p in planned] == [p.name for p in plan_indexes("def-1", compile_definition_schema(
        ALL_TYPES_SCHEMA).catalog)]
    ddl = planned[0].ddl('"product_x".entity_records', "def-'1", concurrently=True)
    assert ddl.startswith("CREATE INDEX CONCURRENTLY IF NOT EXISTS ") and ddl.endswith("WHERE entity_id = 'def-''1'")


# --- the index task -----------------------------------------------------------------------------

@pytest.fixture()
def indexing_app(make_app):
    """Tasks in-process (no Redis), so the index task has run when the request returns."""
    return make_app(ENTITY_INDEX_MIN_RECORDS=3, REDIS_URL="")


def bulk_create(client, headers, entity, records):
    resp = client.post(f"{BASE}/{entity}/records/bulk/create", json={"records": records}, headers=headers)
    assert resp.status_code == 200, resp.get_json()


def test_index_task_builds_after_growth_follows_the_schema_and_drops_on_delete(indexing_app):
    client = indexing_app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    bulk_create(client, headers, "items", FIXED_RECORDS[:2])
    assert definition_indexes(indexing_app, definition_id) == {}  # below the threshold: none

    bulk_create(client, headers, "items", FIXED_RECORDS[2:])
    built = definition_indexes(indexing_app, definition_id)
    # the definition got its typed projection too, which replaces its indexes on entity_records
    # (app.entities.projection): the task built them, then dropped them once the projection was ready
    assert plan_indexes(definition_id, compile_definition_schema(ALL_TYPES_SCHEMA).catalog, projected=True) == []
    assert built == {}
    from app.db import db
    from app.entities.projection import existing
    with indexing_app.app_context(), db.engine.connect() as conn:
        assert len(existing(conn, "product_default", definition_id)) == 1

    # results are those of the reference data set, with the indexes in place
    assert names(query(client, headers, "items", filters={"qty": {"$gte": 5}})) == {"Beta", "Gamma", "Epsilon"}
    assert names(query(client, headers, "items", filters={"title": {"$contains": "HELLO"}})) == {"Alpha", "Beta"}
    assert names(query(client, headers, "items", filters={"$not": {"qty": {"$gte": 5}}})) == {"Alpha", "Delta"}
    assert names(query(client, headers, "items", filters={"at": {"$gte": "2026-01-10T11:00:00Z"}})) == {"Epsilon"}

    # a field leaves the schema: the projection is rebuilt, the index set stays
    schema = {**ALL_TYPES_SCHEMA, "properties": {k: v for k, v in ALL_TYPES_SCHEMA["properties"].items()
                                                  if k != "title"}, "required": []}
    resp = client.put(f"{BASE}/definitions/items", json={"schema": schema}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    assert definition_indexes(indexing_app, definition_id) == built

    resp = client.delete(f"{BASE}/definitions/items", headers=headers)
    assert resp.status_code == 200, resp.get_json()
    assert definition_indexes(indexing_app, definition_id) == {}


def test_per_field_indexes_follow_the_schema_while_there_is_no_projection(indexing_app):
    """Without a ready projection (before it is built, or while a schema change rebuilds it) a big
    definition has one index per field; a field that leaves the schema loses its indexes."""
    from app.db import db
    from app.entities.indexes import sync_indexes

    client = indexing_app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    full = compile_definition_schema(ALL_TYPES_SCHEMA).catalog
    narrower = compile_definition_schema({**ALL_TYPES_SCHEMA, "properties": {
        k: v for k, v in ALL_TYPES_SCHEMA["properties"].items() if k != "title"}, "required": []}).catalog
    planned = plan_indexes(definition_id, full)
    with indexing_app.app_context(), db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        sync_indexes(conn, "product_default", definition_id, full, active_records=3, min_records=3,
                     concurrently=False)
        assert set(definition_indexes(indexing_app, definition_id)) == {p.name for p in planned}
        sync_indexes(conn, "product_default", definition_id, narrower, active_records=3, min_records=3,
                     concurrently=False)
        assert set(definition_indexes(indexing_app, definition_id)) == {p.name for p in planned
                                                                        if p.field != "title"}
        sync_indexes(conn, "product_default", definition_id, narrower, active_records=3, min_records=3,
                     concurrently=False, projected=True)
        assert set(definition_indexes(indexing_app, definition_id)) == {
            p.name for p in plan_indexes(definition_id, narrower, projected=True)}


def test_cli_syncs_definitions_that_grew_without_a_bulk_create(indexing_app):
    client = indexing_app.test_client()
    org, headers = org_headers()
    definition_id = create_definition(client, headers)
    for r in FIXED_RECORDS:  # single creates send no index task
        create_record(client, headers, "items", r)
    assert definition_indexes(indexing_app, definition_id) == {}
    result = indexing_app.test_cli_runner().invoke(args=["entities", "sync-indexes", "--org", org])
    assert result.exit_code == 0, result.output
    assert "1 definition(s) checked" in result.output and "created 0" not in result.output
    assert len(definition_indexes(indexing_app, definition_id)) == len(
        plan_indexes(definition_id, compile_definition_schema(ALL_TYPES_SCHEMA).catalog, projected=True))
    again = indexing_app.test_cli_runner().invoke(args=["entities", "sync-indexes", "--org", org])
    assert "created 0, dropped 0" in again.output  # idempotent


def test_index_task_replaces_an_invalid_index(indexing_app):
    from app.db import db
    from app.entities.indexes import sync_indexes

    client = indexing_app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    catalog = compile_definition_schema(ALL_TYPES_SCHEMA).catalog
    with indexing_app.app_context(), db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        sync_indexes(conn, "product_default", definition_id, catalog, active_records=3, min_records=3,
                     concurrently=False)  # a definition without its projection yet: per-field indexes
    name = sorted(definition_indexes(indexing_app, definition_id))[0]
    with indexing_app.app_context(), db.engine.connect() as conn:  # what an interrupted CONCURRENTLY leaves
        conn.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                          "('product_default.' || :n)::regclass"), {"n": name})
        conn.commit()
    with indexing_app.app_context(), db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        result = sync_indexes(conn, "product_default", definition_id, catalog, active_records=3, min_records=3,
                              concurrently=False)
    assert name in result["dropped"] and name in result["created"]
    with indexing_app.app_context(), db.engine.connect() as conn:
        assert conn.scalar(text("SELECT indisvalid FROM pg_index WHERE indexrelid = "
                                "('product_default.' || :n)::regclass"), {"n": name}) is True


# --- Prefer: count=… ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def counted(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    for r in FIXED_RECORDS:
        create_record(client, headers, "items", r)
    return client, headers


def post_query(client, headers, prefer=None, **params):
    extra = {"Prefer": prefer} if prefer else {}
    return client.post(f"{BASE}/items/records/query", json={"query": params}, headers={**headers, **extra})


def test_count_is_exact_without_a_preference(counted):
    client, headers = counted
    resp = post_query(client, headers, filters={"qty": {"$gte": 5}})
    assert resp.get_json()["totalCount"] == 3 and "Preference-Applied" not in resp.headers
    resp = post_query(client, headers, prefer="count=exact", filters={"qty": {"$gte": 5}})
    assert resp.get_json()["totalCount"] == 3 and resp.headers["Preference-Applied"] == "count=exact"


def test_count_planned_is_an_estimate_with_the_same_records(counted):
    client, headers = counted
    exact = post_query(client, headers, pageSize=2, filters={"status": "open"}).get_json()
    resp = post_query(client, headers, prefer="count=planned", pageSize=2, filters={"status": "open"})
    body = resp.get_json()
    assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=planned"
    assert body["records"] == exact["records"]
    assert isinstance(body["totalCount"], int) and body["totalCount"] >= len(body["records"])
    # a full page is never reported as the last one
    assert body["hasNextPage"] is True and body["totalPages"] >= 2


def test_count_estimated_is_exact_below_the_threshold_and_an_estimate_above(counted, make_app):
    client, headers = counted
    resp = post_query(client, headers, prefer="count=estimated", filters={"qty": {"$gte": 5}})
    assert resp.get_json()["totalCount"] == 3 and resp.headers["Preference-Applied"] == "count=exact"
    low = make_app(ENTITY_COUNT_ESTIMATE_ABOVE=0).test_client()
    resp = post_query(low, headers, prefer="respond-async, count=estimated", filters={})
    assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=estimated"
    assert resp.get_json()["totalCount"] >= len(resp.get_json()["records"])


def test_count_endpoint_honours_the_preference(counted):
    client, headers = counted
    url = f"{BASE}/items/records/count"
    resp = client.post(url, json={"filters": {"status": "open"}}, headers={**headers, "Prefer": "count=planned"})
    assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=planned"
    assert isinstance(resp.get_json(), int)
    resp = client.post(url, json={"filters": {"status": "open"}}, headers=headers)
    assert resp.get_json() == 2 and "Preference-Applied" not in resp.headers


@pytest.mark.parametrize("prefer", ["count=bogus", "count", "count=planned;x=1=2", "count=PLANNED ", "=,,;"])
def test_unknown_or_malformed_count_preferences_are_ignored(counted, prefer):
    client, headers = counted
    resp = post_query(client, headers, prefer=prefer, filters={"qty": {"$gte": 5}})
    assert resp.status_code == 200
    applied = resp.headers.get("Preference-Applied")
    if applied is None:
        assert resp.get_json()["totalCount"] == 3
    else:  # "count=planned;x=1=2" and "count=PLANNED " are count=planned (parameters dropped, case folded)
        assert applied == "count=planned"


# --- keyset cursor --------------------------------------------------------------------------------

@pytest.fixture()
def paged(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    for i in range(23):
        fields = {"title": f"t{i:02d}", "qty": i % 5} if i % 4 else {"title": f"t{i:02d}"}  # some qty missing
        create_record(client, headers, "items", {"name": f"r{i:02d}", "fields": fields})
    return client, headers


def walk(client, headers, **params) -> tuple[list[list[str]], list[dict]]:
    pages, bodies, cursor = [], [], None
    while True:
        body = post_query(client, headers, **params, **({"cursor": cursor} if cursor else {})).get_json()
        assert "records" in body, body
        bodies.append(body)
        pages.append([r["name"] for r in body["records"]])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages, bodies


@pytest.mark.parametrize("order", [{}, {"sortOrder": 1}, {"sortBy": "qty", "sortOrder": -1},
                                   {"sortBy": "qty", "sortOrder": 1}, {"sortBy": "title"},
                                   {"sortBy": "created_at", "sortOrder": -1}])
def test_cursor_pages_equal_numbered_pages(paged, order):
    client, headers = paged
    pages, bodies = walk(client, headers, pageSize=5, **order)
    numbered = [[r["name"] for r in post_query(client, headers, page=n, pageSize=5, **order).get_json()["records"]]
                for n in range(1, 6)]
    assert pages == numbered and sum(map(len, pages)) == 23
    assert [b["currentPage"] for b in bodies] == [1, 2, 3, 4, 5]
    assert bodies[-1]["hasNextPage"] is False and bodies[1]["hasPreviousPage"] is True


@pytest.mark.parametrize("sort_by", ["active", "meta", "labels"])
@pytest.mark.parametrize("sort_order", [1, -1])
def test_cursor_follows_sorts_on_json_valued_fields(app, sort_by, sort_order):
    """A bool, json or multiselect field sorts as JSONB: its cursor key (true, 2.5, "x", a list) is
    compared as JSONB on the next page (it was a 500: `key > False`, a Decimal in a JSONB bind)."""
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    metas = [True, False, 2.5, 3, "x", ["a"], {"k": 1}, None]
    for i in range(16):
        fields = {"title": f"t{i:02d}", "active": i % 3 == 0, "meta": metas[i % len(metas)],
                  "labels": [["red"], ["green", "blue"], []][i % 3]}
        create_record(client, headers, "items", {"name": f"r{i:02d}", "fields": fields})
    order = {"sortBy": sort_by, "sortOrder": sort_order}
    pages, _bodies = walk(client, headers, pageSize=3, **order)
    numbered = [[r["name"] for r in post_query(client, headers, page=n, pageSize=3, **order).get_json()["records"]]
                for n in range(1, 7)]
    assert pages == numbered and sum(map(len, pages)) == 16


def test_cursor_with_filters_and_stable_under_inserts(paged):
    client, headers = paged
    params = {"pageSize": 4, "filters": {"qty": {"$gte": 1}}}
    first = post_query(client, headers, **params).get_json()
    before = [r["name"] for r in post_query(client, headers, page=2, **params).get_json()["records"]]
    for i in range(3):  # newer records: page numbers shift, a cursor does not
        create_record(client, headers, "items", {"name": f"new{i}", "fields": {"title": "n", "qty": 3}})
    shifted = [r["name"] for r in post_query(client, headers, page=2, **params).get_json()["records"]]
    followed = post_query(client, headers, cursor=first["nextCursor"], **params).get_json()
    assert [r["name"] for r in followed["records"]] == before != shifted
    assert followed["totalCount"] == first["totalCount"] + 3


def test_cursor_is_signed_and_bound_to_its_query(paged):
    client, headers = paged
    cursor = post_query(client, headers, pageSize=5).get_json()["nextCursor"]
    body, mac = cursor.split(".")

    def rejected(resp, reason):
        assert resp.status_code == 400, resp.get_json()
        error = resp.get_json()["error"]
        assert error["code"] == "VALIDATION_ERROR" and reason in error["details"]["fields"]["query.cursor"][0]

    import base64
    import json
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**payload, "p": 9}).encode()).rstrip(b"=").decode()
    rejected(post_query(client, headers, pageSize=5, cursor=f"{forged}.{mac}"), "altered")
    rejected(post_query(client, headers, pageSize=5, cursor=cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")),
             "altered")
    for junk in ("", "x", "a.b.c", "!!!.???", "." * 10):
        rejected(post_query(client, headers, pageSize=5, cursor=junk), "")
    rejected(post_query(client, headers, pageSize=6, cursor=cursor), "different")
    rejected(post_query(client, headers, pageSize=5, filters={"qty": 1}, cursor=cursor), "different")
    rejected(post_query(client, headers, pageSize=5, page=2, cursor=cursor), "page")
    rejected(post_query(client, headers, pageSize=5, filters={"$search": "t01"}, cursor=cursor), "order")
    _other, other_headers = org_headers()
    create_definition(client, other_headers)
    rejected(post_query(client, other_headers, pageSize=5, cursor=cursor), "another entity")


# --- single-record GET in one statement ----------------------------------------------------------

def test_record_get_answers_and_names_what_is_missing(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    create_definition(client, headers, name="others")
    rec = create_record(client, headers, "items", FIXED_RECORDS[0])
    other = create_record(client, headers, "others", FIXED_RECORDS[1])
    got = client.get(f"{BASE}/items/records/{rec['id']}", headers=headers)
    assert got.status_code == 200 and got.get_json() == rec

    def missing(url, message):
        resp = client.get(url, headers=headers)
        assert resp.status_code == 404 and resp.get_json()["error"]["message"] == message, resp.get_json()

    missing(f"{BASE}/nope/records/{rec['id']}", "Entity 'nope' not found.")
    missing(f"{BASE}/items/records/{other['id']}", "Record not found.")  # a record of another entity
    missing(f"{BASE}/items/records/{'x' * 500}", "Record not found.")
    _org2, headers2 = org_headers()
    resp = client.get(f"{BASE}/items/records/{rec['id']}", headers=headers2)
    assert resp.status_code == 404 and resp.get_json()["error"]["message"] == "Entity 'items' not found."
    assert client.delete(f"{BASE}/items/records/{rec['id']}", headers=headers).status_code == 200
    missing(f"{BASE}/items/records/{rec['id']}", "Record not found.")  # soft-deleted
    assert client.delete(f"{BASE}/definitions/others", headers=headers).status_code == 200
    missing(f"{BASE}/others/records/{other['id']}", "Entity 'others' not found.")  # soft-deleted definition


def test_record_get_reads_the_tokens_product(app):
    """The record read's SQL is rendered once per product (db.read_first): the same org in two
    products sees each product's own record, never the other's."""
    client = app.test_client()
    org, default_headers = org_headers()
    other_headers = bearer(token(org=org, scopes=("read", "write"), product="other"))
    for headers in (default_headers, other_headers):
        create_definition(client, headers)
    in_default = create_record(client, default_headers, "items", FIXED_RECORDS[0])
    in_other = create_record(client, other_headers, "items", FIXED_RECORDS[1])
    for _ in range(2):  # rendered on first use per product, then reused
        assert client.get(f"{BASE}/items/records/{in_default['id']}", headers=default_headers).get_json() == in_default
        assert client.get(f"{BASE}/items/records/{in_other['id']}", headers=other_headers).get_json() == in_other
        assert client.get(f"{BASE}/items/records/{in_default['id']}", headers=other_headers).status_code == 404
        assert client.get(f"{BASE}/items/records/{in_other['id']}", headers=default_headers).status_code == 404


def test_a_preference_in_a_second_prefer_header_counts(counted):
    """Prefer may come as several headers (RFC 7240): the count preference in the second one applies."""
    client, headers = counted
    resp = client.post(f"{BASE}/items/records/query", json={"query": {"pageSize": 2, "filters": {"status": "open"}}},
                       headers=[*headers.items(), ("Prefer", "return=minimal"), ("Prefer", "count=planned")])
    assert resp.status_code == 200 and resp.headers["Preference-Applied"] == "count=planned"
