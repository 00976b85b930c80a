"""The per-process definition cache of record queries and counts (services.definitions.DefinitionCache):
used when warm, and never stale for a request: a definition changed by another app instance, or by
any writer of the row at all, is seen by the very next request; entries are per product and org; the
cache is bounded."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.entities.services import definitions
from tests.functional.entities_support import BASE, create_definition, create_record, org_headers, query
from tests.support import bearer, token

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "qty": {"type": "int"}}}


def count(client, headers, entity, filters=None):
    return client.post(f"{BASE}/{entity}/records/count", json={"filters": filters or {}}, headers=headers)


@pytest.fixture()
def two(app, make_app):
    """Two app instances on the same database: `a` answers queries (and caches), `b` changes things."""
    org, headers = org_headers()
    a, b = app.test_client(), make_app().test_client()
    create_definition(b, headers, "items", SCHEMA)
    for i in range(3):
        create_record(b, headers, "items", {"name": f"r{i}", "fields": {"title": f"t{i}", "qty": i}})
    assert count(a, headers, "items").get_json() == 3  # cached in `a` from here on
    return app, a, b, headers


def reads(monkeypatch) -> list[str]:
    seen: list[str] = []
    original = definitions._read_row

    def counting(name):
        seen.append(name)
        return original(name)

    monkeypatch.setattr(definitions, "_read_row", counting)
    return seen


def test_a_warm_cache_saves_the_definition_read(two, monkeypatch):
    app, a, b, headers = two
    seen = reads(monkeypatch)
    assert count(a, headers, "items", {"qty": {"$gte": 1}}).get_json() == 2
    assert query(a, headers, "items", filters={"qty": 2}).get_json()["totalCount"] == 1
    assert seen == []  # both answered with the cached definition, proven current by their count


def test_a_field_added_by_another_instance_is_seen_at_once(two, monkeypatch):
    app, a, b, headers = two
    assert query(a, headers, "items", filters={"rank": 1}).status_code == 400  # unknown field (cached)
    wider = {**SCHEMA, "properties": {**SCHEMA["properties"], "rank": {"type": "int"}}}
    assert b.put(f"{BASE}/definitions/items", json={"schema": wider}, headers=headers).status_code == 200
    create_record(b, headers, "items", {"name": "ranked", "fields": {"title": "x", "rank": 1}})
    seen = reads(monkeypatch)
    got = query(a, headers, "items", filters={"rank": 1})
    assert got.status_code == 200, got.get_json()
    assert [r["name"] for r in got.get_json()["records"]] == ["ranked"]
    assert count(a, headers, "items", {"rank": 1}).get_json() == 1
    assert seen == ["items"]  # read once: the 400 was checked against the row, the count found it cached


def test_a_field_removed_by_another_instance_is_seen_at_once(two):
    app, a, b, headers = two
    assert count(a, headers, "items", {"qty": 1}).get_json() == 1
    narrower = {"type": "object", "properties": {"title": {"type": "string"}}}
    assert b.put(f"{BASE}/definitions/items", json={"schema": narrower}, headers=headers).status_code == 200
    assert count(a, headers, "items", {"qty": 1}).status_code == 400
    assert query(a, headers, "items", filters={"qty": 1}).status_code == 400


def test_rename_deactivate_and_hard_delete_are_seen_at_once(two):
    app, a, b, headers = two
    assert b.put(f"{BASE}/definitions/items", json={"name": "things"}, headers=headers).status_code == 200
    assert count(a, headers, "items").status_code == 404
    assert query(a, headers, "things").get_json()["totalCount"] == 3
    create_definition(b, headers, "items", SCHEMA)  # another definition under the old name: empty
    assert count(a, headers, "items").get_json() == 0
    assert query(a, headers, "items").get_json()["totalCount"] == 0
    assert b.delete(f"{BASE}/definitions/things", headers=headers).status_code == 200  # soft delete
    assert query(a, headers, "things").status_code == 404
    assert count(a, headers, "things").status_code == 404
    assert b.delete(f"{BASE}/definitions/items?hardDelete=true", headers=headers).status_code == 200
    assert count(a, headers, "items").status_code == 404
    create_definition(b, headers, "items", SCHEMA)
    create_record(b, headers, "items", {"name": "new", "fields": {"title": "n"}})
    assert [r["name"] for r in query(a, headers, "items").get_json()["records"]] == ["new"]


def test_any_write_of_the_row_is_seen_even_without_a_version_bump(two):
    """The token is the row version's xmin: a writer that changes the schema by hand (no `version`
    bump, no `updatedAt`) is seen by the next request all the same."""
    app, a, b, headers = two
    from app.db import db

    assert count(a, headers, "items", {"qty": 1}).get_json() == 1
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text("UPDATE product_default.entity_definitions SET schema = "
                          "jsonb_set(schema, '{properties,qty}', '{\"type\": \"string\"}') "
                          "WHERE org_id = :org AND name = 'items'"),
                     {"org": a.get("/api/v1/me", headers=headers).get_json()["orgId"]})
        conn.commit()
    # qty is now a string field: 1 is compared as a string (no record holds "1")
    assert count(a, headers, "items", {"qty": "1"}).get_json() == 0


def test_entries_are_per_org_and_product(app):
    client = app.test_client()
    org, headers = org_headers()
    other_org_headers = org_headers()[1]
    other_product_headers = bearer(token(org=org, scopes=("read", "write"), product="other"))
    create_definition(client, headers, "items", SCHEMA)
    create_definition(client, other_org_headers, "items", {"type": "object", "properties": {"rank": {"type": "int"}}})
    create_definition(client, other_product_headers, "items",
                      {"type": "object", "properties": {"size": {"type": "int"}}})
    for _ in range(2):  # cold, then warm
        assert count(client, headers, "items", {"qty": 1}).status_code == 200
        assert count(client, headers, "items", {"rank": 1}).status_code == 400
        assert count(client, other_org_headers, "items", {"rank": 1}).status_code == 200
        assert count(client, other_org_headers, "items", {"qty": 1}).status_code == 400
        assert count(client, other_product_headers, "items", {"size": 1}).status_code == 200
        assert count(client, other_product_headers, "items", {"qty": 1}).status_code == 400


def test_the_cache_is_bounded(app, monkeypatch):
    monkeypatch.setattr(definitions, "DEFINITION_CACHE_MAX", 3)
    client = app.test_client()
    org, headers = org_headers()
    names = [f"bounded{i}" for i in range(5)]
    for name in names:
        create_definition(client, headers, name, SCHEMA)
        create_record(client, headers, name, {"name": name, "fields": {"title": name}})
    for _ in range(2):
        for name in names:
            assert [r["name"] for r in query(client, headers, name).get_json()["records"]] == [name]
    cache = app.extensions["entity_definition_cache"]
    assert len(cache.entries) == 3
    assert [key[2] for key in cache.entries] == names[-3:]  # the most recently used


def test_the_cache_is_bounded_in_size_not_only_in_entries(app, monkeypatch):
    """A definition row may be large (a schema of 500 described properties, `metadata` up to the body
    limit): the cache keeps at most DEFINITION_CACHE_MAX_CHARS of them, dropping the least recently
    used first; a row larger than that alone is never kept (and evicts nothing)."""
    monkeypatch.setattr(definitions, "DEFINITION_CACHE_MAX_CHARS", 50_000, raising=False)
    client = app.test_client()
    org, headers = org_headers()
    for i in range(3):
        create_definition(client, headers, f"big{i}", SCHEMA, metadata={"notes": "x" * 20_000})
    create_definition(client, headers, "huge", SCHEMA, metadata={"notes": "x" * 60_000})
    create_definition(client, headers, "small", SCHEMA)
    cache = app.extensions.setdefault("entity_definition_cache", definitions.DefinitionCache())
    for name in ["small", "big0", "big1", "big2", "huge"]:
        for _ in range(2):
            assert query(client, headers, name).status_code == 200
    mine = [key[2] for key in cache.entries if key[1] == org]
    assert "huge" not in mine
    assert mine[-2:] == ["big1", "big2"] and "big0" not in mine  # two big rows fit, the oldest went
    assert sum(entry.size for entry in cache.entries.values()) <= 50_000


@pytest.mark.parametrize("prefer", ["count=planned", "count=estimated"])
def test_a_schema_change_is_seen_by_planned_and_estimated_counts(two, prefer):
    """The paths that cannot select the token beside an exact count (an estimate) ask for it in a
    round trip of their own: a field another instance added is known, a removed one is a 400."""
    app, a, b, headers = two
    extra = {**headers, "Prefer": prefer}
    assert a.post(f"{BASE}/items/records/query", json={"query": {"filters": {"qty": 1}}},
                  headers=extra).status_code == 200  # cached
    wider = {"type": "object", "properties": {"title": {"type": "string"}, "rank": {"type": "int"}}}
    assert b.put(f"{BASE}/definitions/items", json={"schema": wider}, headers=headers).status_code == 200
    create_record(b, headers, "items", {"name": "ranked", "fields": {"title": "x", "rank": 1}})
    got = a.post(f"{BASE}/items/records/query", json={"query": {"filters": {"rank": 1}}}, headers=extra)
    assert got.status_code == 200, got.get_json()
    assert [r["name"] for r in got.get_json()["records"]] == ["ranked"]
    assert a.post(f"{BASE}/items/records/count", json={"filters": {"rank": 1}}, headers=extra).status_code == 200
    assert a.post(f"{BASE}/items/records/query", json={"query": {"filters": {"qty": 1}}},
                  headers=extra).status_code == 400
    assert a.post(f"{BASE}/items/records/count", json={"filters": {"qty": 1}}, headers=extra).status_code == 400


def test_a_cursor_page_and_lookups_follow_a_recreated_definition(two):
    """A cursor issued for the definition now under the name (after the cached one was renamed away)
    is that definition's, and its lookups resolve by the new definition's schema."""
    app, a, b, headers = two
    first = query(a, headers, "items", pageSize=2).get_json()
    assert first["nextCursor"]  # cached, with a cursor of the old definition
    assert b.put(f"{BASE}/definitions/items", json={"name": "old_items"}, headers=headers).status_code == 200
    create_definition(b, headers, "people", {"type": "object", "properties": {"city": {"type": "string"}}})
    person = create_record(b, headers, "people", {"name": "Ann", "fields": {"city": "Oslo"}})
    create_definition(b, headers, "items", {"type": "object", "properties": {
        "owner": {"type": "lookup", "entity": "people"}}})
    for i in range(3):
        create_record(b, headers, "items", {"name": f"owned{i}", "fields": {"owner": person["id"]}})
    assert query(a, headers, "items", cursor=first["nextCursor"], pageSize=2).status_code == 400  # not its cursor
    page = query(a, headers, "items", pageSize=2, includeLookups=[{"field": "owner"}]).get_json()
    assert [r["lookups"]["owner"]["name"] for r in page["records"]] == ["Ann", "Ann"]
    following = query(a, headers, "items", pageSize=2, cursor=page["nextCursor"], includeLookups=[{"field": "owner"}])
    assert following.status_code == 200, following.get_json()
    assert [r["name"] for r in following.get_json()["records"]] == ["owned0"]
