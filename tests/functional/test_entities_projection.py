"""Typed projection of a big definition (app.entities.projection): exact after every kind of write,
used by queries that it covers, rebuilt after a schema change, dropped with the definition, and
backfilled without losing concurrent writes."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
from sqlalchemy import event, text

from app.entities import projection
from app.entities.fieldtypes import compile_definition_schema
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

SCHEMA = "product_default"


@pytest.fixture()
def indexing_app(make_app):
    """Tasks in-process (no Redis): the index task (and so the projection build) has run when the
    request that sent it returns."""
    return make_app(ENTITY_INDEX_MIN_RECORDS=3, REDIS_URL="")


def bulk(client, headers, entity, operation, items, key="records"):
    resp = client.post(f"{BASE}/{entity}/records/bulk/{operation}", json={key: items}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def pointed(app, definition_id) -> str | None:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        return conn.scalar(text(f"SELECT projection FROM {SCHEMA}.entity_definitions WHERE id = :d"),
                           {"d": definition_id})


def tables(app, definition_id) -> set[str]:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        return set(projection.existing(conn, SCHEMA, definition_id))


def triggers(app, definition_id) -> set[str]:
    """The projections of the definition the schema's dispatcher maintains (and triggers of its own:
    none since the dispatcher)."""
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        own = set(conn.scalars(text("SELECT tgname FROM pg_trigger WHERE tgname LIKE :p"),
                               {"p": f"{projection.PREFIX}{projection.definition_key(definition_id)}%"}))
        return own | {f"registered {name}" for name in projection.triggered(conn, SCHEMA, definition_id)}


def dispatcher(app) -> set[str]:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        return set(conn.scalars(text("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'erp\\_dispatch%'")))


def plan_of(definition_id, schema=ALL_TYPES_SCHEMA) -> projection.Plan:
    return projection.plan_projection(definition_id, compile_definition_schema(schema).catalog)


def differences(app, plan: projection.Plan) -> int:
    """Rows in which the projection and the definition's active records (through the compiler's
    expressions) differ, in either direction: 0 when the projection is exact."""
    from app.db import db

    names_ = ", ".join(c for c, _, _ in plan.columns)
    exprs = ", ".join(e for _, _, e in plan.columns)
    source = (f"SELECT {exprs} FROM {SCHEMA}.entity_records WHERE entity_id = '{plan.definition_id}' "
              "AND is_active IS TRUE")
    mine = f"SELECT {names_} FROM {SCHEMA}.{plan.name}"
    with app.app_context(), db.engine.connect() as conn:
        differ = conn.scalar(text(f"SELECT count(*) FROM (({mine} EXCEPT ALL {source}) UNION ALL "
                                  f"({source} EXCEPT ALL {mine})) d"))
        for side in plan.sides:  # each substring table: the projection's ids and folded values, exactly
            theirs = f"SELECT id, {side.folded} FROM {SCHEMA}.{plan.name}"
            ours = f"SELECT id, {side.folded} FROM {SCHEMA}.{side.name}"
            differ += conn.scalar(text(f"SELECT count(*) FROM (({ours} EXCEPT ALL {theirs}) UNION ALL "
                                       f"({theirs} EXCEPT ALL {ours})) d"))
        return differ


def rows(app, plan) -> int:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        return conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.{plan.name}"))


@contextmanager
def statements(app):
    """The SQL the app sends meanwhile."""
    from app.db import db

    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(statement)

    with app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def used(seen: list[str], plan) -> bool:
    return any(plan.name in s for s in seen)


@pytest.fixture()
def projected(indexing_app):
    client = indexing_app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    bulk(client, headers, "items", "create", FIXED_RECORDS)
    plan = plan_of(definition_id)
    assert pointed(indexing_app, definition_id) == plan.name and tables(indexing_app, definition_id) == {plan.name}
    assert differences(indexing_app, plan) == 0 and rows(indexing_app, plan) == len(FIXED_RECORDS)
    return indexing_app, client, headers, definition_id, plan


def test_plan_projects_scalar_fields_with_the_compilers_expressions():
    plan = plan_of("def-1")
    projected_fields = {f.field for f in plan.fields}
    assert projected_fields == {"title", "qty", "price", "active", "due", "at", "email", "phone", "site",
                                "status", "owner", "amount", "score", "labels", "watchers"}  # not: long text,
    types = {c: t for c, t, _ in plan.columns}                                               # JSON, files
    labels = plan.field("labels")
    assert types[labels.column] == types["tags"] == "text[]" and labels.other is None
    assert f"USING gin ({labels.column})" in [body for _, body in plan.indexes]
    title, amount, at = plan.field("title"), plan.field("amount"), plan.field("at")
    assert types[title.column] == types[title.other] == 'text COLLATE "C"'
    assert types[amount.column] == "numeric" and types[at.column] == "timestamptz"
    exprs = {c: e for c, _, e in plan.columns}
    assert "public.entity_iso_timestamptz" in exprs[at.column] and "'amount'" in exprs[amount.column]
    # booleans and dropdowns share one b-tree, fewest values first; the other fields one each
    bodies = [body for _, body in plan.indexes]
    active, status = plan.field("active"), plan.field("status")
    # (ending with the vector stamp, which the per-field b-trees INCLUDE: `$similar` + filter counts)
    current = projection.CURRENT_VECTOR
    assert f"USING btree ({active.column}, {status.column}, {current})" in bodies
    assert f"USING btree ({status.column}) INCLUDE ({current})" not in bodies
    # a dropdown not first in the shared b-tree also has a plain one: its equality alone is one range
    assert f"USING btree ({status.column})" in bodies and f"USING btree ({active.column})" not in bodies
    # ... and the list columns, which the range b-trees INCLUDE too: a range + a membership counts index-only
    lists = ", ".join(plan.field(name).column for name in ("labels", "watchers"))  # in field name order
    assert f"USING btree ({plan.field('qty').column}) INCLUDE ({current}, {lists})" in bodies
    assert f"USING btree ({plan.field('due').column} DESC NULLS LAST) INCLUDE ({current}, {lists})" in bodies
    assert f"USING btree ({plan.field('title').column}) INCLUDE ({current})" in bodies
    assert exprs[current] == "CASE WHEN embedded_version = version THEN embedded_hash END"
    assert plan.name == plan_of("def-1").name and plan.name != plan_of("def-2").name and len(plan.name) <= 63
    narrower = {**ALL_TYPES_SCHEMA, "properties": {k: v for k, v in ALL_TYPES_SCHEMA["properties"].items()
                                                    if k != "qty"}}
    assert plan_of("def-1", narrower).name != plan.name  # another column set: another table


def test_projection_follows_every_write(projected):
    app, client, headers, definition_id, plan = projected
    created = create_record(client, headers, "items", {"name": "Zeta", "fields": {"title": "z", "qty": 9}})
    assert differences(app, plan) == 0 and rows(app, plan) == len(FIXED_RECORDS) + 1
    resp = client.put(f"{BASE}/items/records/{created['id']}", json={"fields": {"title": "zz", "qty": 3,
                                                                                  "status": "closed"}},
                      headers=headers)
    assert resp.status_code == 200, resp.get_json()
    assert differences(app, plan) == 0
    out = bulk(client, headers, "items", "create", [{"name": f"B{i}", "fields": {"title": "b", "qty": i}}
                                                      for i in range(4)])
    assert out["count"] == 4 and differences(app, plan) == 0
    listed = query(client, headers, "items", pageSize=100).get_json()["records"]
    by_name = {r["name"]: r["id"] for r in listed}
    bulk(client, headers, "items", "update", [{"id": by_name["B0"], "fields": {"qty": 100}},
                                             {"id": by_name["B1"], "fields": {"price": 2.5}}])
    assert differences(app, plan) == 0
    bulk(client, headers, "items", "delete", [by_name["B2"]], key="recordIds")  # soft: deactivated
    assert client.delete(f"{BASE}/items/records/{by_name['B3']}", headers=headers).status_code in (200, 204)
    resp = client.delete(f"{BASE}/items/records/{by_name['Zeta']}?hardDelete=true", headers=headers)
    assert resp.status_code in (200, 204), resp.get_json()
    assert differences(app, plan) == 0 and rows(app, plan) == len(FIXED_RECORDS) + 2
    with statements(app) as seen:
        assert names(query(client, headers, "items", filters={"qty": {"$gte": 5}})) == {"Beta", "Gamma", "Epsilon",
                                                                                        "B0"}
    assert used(seen, plan)


@pytest.mark.parametrize("flt, covered", [
    ({"status": "open"}, True),
    ({"qty": {"$gte": 2, "$lt": 100}, "active": True}, True),
    ({"title": {"$contains": "WORLD"}}, True),
    ({"$or": [{"due": {"$lte": "2026-01-10"}}, {"$not": {"price": {"$in": [1.5, 2]}}}]}, True),
    ({"at": {"$gte": "2026-01-10T11:00:00Z"}, "name": {"$startsWith": "E"}}, True),
    ({"$search": "hello"}, True),
    ({"qty": {"$exists": True}}, False),
    ({"labels": "red"}, True),
    ({"labels": {"$in": ["green", "blue"]}, "$not": {"watchers": {"$contains": "u1"}}}, True),
    ({"labels": {"$nin": ["red"]}, "tags": {"$ne": "vip"}}, True),
    ({"tags": ["vip", "new"]}, True),
    ({"tags": {"$empty": True}}, True),
    ({"labels": ["red", "green"]}, False),  # a whole list (order, duplicates, other types) is JSON
    ({"labels": {"$empty": True}}, False),
    ({"body": {"$contains": "x"}}, False),
    ({"qty": None}, False),
    # not covered as a whole: the terms the projection answers narrow entity_records through it
    ({"qty": {"$gte": 2}, "labels": "red", "meta": {"k": 1}}, True),
    ({"status": "open", "$or": [{"qty": {"$exists": False}}, {"tags": "vip"}]}, True),
])
def test_queries_use_the_projection_only_when_it_covers_them(projected, flt, covered):
    """`covered`: the projection answers the whole filter, or at least one of its top-level AND terms."""
    app, client, headers, definition_id, plan = projected
    with statements(app) as seen:
        got = query(client, headers, "items", filters=flt, pageSize=100).get_json()
        count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers).get_json()
    assert used(seen, plan) is covered
    # the same answer as entity_records alone: the same records in a definition without a projection
    other_client = app.test_client()
    _org, other = org_headers()
    create_definition(other_client, other)
    for r in FIXED_RECORDS:
        create_record(other_client, other, "items", r)
    expected = query(other_client, other, "items", filters=flt, pageSize=100).get_json()
    # (a bulk create stamps one created_at: the default order's ties are broken by id, which differ)
    assert sorted(r["name"] for r in got["records"]) == sorted(r["name"] for r in expected["records"])
    assert got["totalCount"] == expected["totalCount"] == count


def test_sort_and_cursor_on_the_projection(projected):
    app, client, headers, definition_id, plan = projected
    with statements(app) as seen:
        first = query(client, headers, "items", sortBy="due", sortOrder=-1, pageSize=2).get_json()
        second = query(client, headers, "items", sortBy="due", sortOrder=-1, pageSize=2,
                       cursor=first["nextCursor"]).get_json()
    assert used(seen, plan)
    everything = query(client, headers, "items", sortBy="due", sortOrder=-1, pageSize=10).get_json()["records"]
    assert [r["name"] for r in first["records"] + second["records"]] == [r["name"] for r in everything[:4]]


def test_a_projected_page_and_its_count_are_one_statement(projected, monkeypatch):
    """On the projection, the exact count and the page come from one statement (one round trip, one
    snapshot), the definition's row token beside them: page 1, a cursor page, a page past the end and
    an empty result alike, each with the answer entity_records gives."""
    app, client, headers, definition_id, plan = projected
    cases = [dict(filters={"qty": {"$gte": 1}}, pageSize=2), dict(filters={"qty": {"$gte": 1}}, pageSize=2, page=99),
             dict(filters={"qty": {"$gte": 10_000}}), dict(sortBy="due", sortOrder=-1, pageSize=2),
             dict(filters={"$search": "alpha"}, pageSize=3)]
    query(client, headers, "items")  # the definition cached: its token rides on the statement
    for params in cases:
        with statements(app) as seen:
            got = query(client, headers, "items", **params)
        assert got.status_code == 200, got.get_json()
        assert len(seen) == 1 and used(seen, plan) and "count(*)" in seen[0] and "xmin" in seen[0], seen
        with monkeypatch.context() as m:  # entity_records alone
            m.setattr(projection, "resolver_for", lambda *a, **k: None)
            assert got.get_json() == query(client, headers, "items", **params).get_json()
    first = query(client, headers, "items", sortBy="due", sortOrder=-1, pageSize=2).get_json()
    with statements(app) as seen:
        second = query(client, headers, "items", sortBy="due", sortOrder=-1, pageSize=2, cursor=first["nextCursor"])
    assert second.status_code == 200 and len(seen) == 1 and used(seen, plan)
    assert second.get_json()["totalCount"] == first["totalCount"] and second.get_json()["currentPage"] == 2


def test_an_index_added_to_the_plan_is_built_on_the_existing_table(projected, monkeypatch):
    """A dropdown's own b-tree (added after projections were built) is not part of the table's name:
    a table built without it keeps its name and stays in use, and the next sync creates the index on it
    (also after an interrupted concurrent build left it invalid)."""
    from app.db import db
    from app.entities.indexes import sync_definition

    app, client, headers, definition_id, plan = projected
    status = plan.field("status").column
    name = next(n for n, body in plan.indexes if body == f"USING btree ({status})")
    monkeypatch.setattr(projection, "_wanted_indexes", lambda *a: (_real_wanted(*a)[0], []))
    assert plan_of(definition_id).name == plan.name  # the same table without it
    monkeypatch.undo()

    def index_state():
        with app.app_context(), db.engine.connect() as conn:
            return conn.scalar(text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)"),
                               {"n": f"{SCHEMA}.{name}"})

    for left in ("none", "invalid"):
        with app.app_context(), db.engine.connect() as conn:
            conn.execute(text(f"DROP INDEX {SCHEMA}.{name}"))
            if left == "invalid":  # what an interrupted CREATE INDEX CONCURRENTLY leaves
                conn.execute(text(f"CREATE INDEX {name} ON {SCHEMA}.{plan.name} USING btree ({status})"))
                conn.execute(text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(:n)"),
                             {"n": f"{SCHEMA}.{name}"})
            conn.commit()
        assert index_state() is (None if left == "none" else False)
        with app.app_context():
            result = sync_definition("default", definition_id)
        assert not result.get("created") and not result.get("dropped"), result
        assert index_state() is True and pointed(app, definition_id) == plan.name
        with statements(app) as seen:
            got = query(client, headers, "items", filters={"status": "open"})
        assert got.status_code == 200 and used(seen, plan)


_real_wanted = projection._wanted_indexes


def test_projection_tables_are_vacuumed_after_two_percent_of_changes(projected):
    """A projection table is created with autovacuum after 2 % of its rows inserted or changed (its
    index-only counts read the heap of every page a write left not all-visible); a table without the
    setting (built before it) gets it from the next sync."""
    from app.db import db
    from app.entities.indexes import sync_definition

    app, client, headers, definition_id, plan = projected

    def options():
        with app.app_context(), db.engine.connect() as conn:
            return set(conn.scalar(text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
                                   {"t": f"{SCHEMA}.{plan.name}"}) or [])

    wanted = {"autovacuum_vacuum_insert_scale_factor=0.02", "autovacuum_vacuum_scale_factor=0.02"}
    assert options() >= wanted
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text(f"ALTER TABLE {SCHEMA}.{plan.name} RESET (autovacuum_vacuum_insert_scale_factor, "
                          "autovacuum_vacuum_scale_factor)"))
        conn.commit()
    assert not options() & wanted
    with app.app_context():
        result = sync_definition("default", definition_id)
    assert not result.get("created") and not result.get("dropped"), result
    assert options() >= wanted and pointed(app, definition_id) == plan.name


def test_schema_change_stops_using_the_projection_at_once_then_rebuilds(projected, monkeypatch):
    from app.entities import indexes

    app, client, headers, definition_id, plan = projected
    before = names(query(client, headers, "items", filters={"qty": {"$gte": 2}}))
    wider = {**ALL_TYPES_SCHEMA, "properties": {**ALL_TYPES_SCHEMA["properties"], "rank": {"type": "int"}}}
    monkeypatch.setattr(indexes, "schedule_sync", lambda *a, **k: None)  # the task has not run yet
    resp = client.put(f"{BASE}/definitions/items", json={"schema": wider}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    assert pointed(app, definition_id) is None  # stale: no longer used
    with statements(app) as seen:
        assert names(query(client, headers, "items", filters={"qty": {"$gte": 2}})) == before
    # the first query cached the definition: its count (on the old projection) proves it stale, and
    # the answer comes from the definition read again, without the projection
    assert used(seen[:1], plan) and not used(seen[1:], plan)
    create_record(client, headers, "items", {"name": "Eta", "fields": {"title": "e", "qty": 7, "rank": 1}})
    monkeypatch.undo()
    with app.app_context():
        result = indexes.sync_definition("default", definition_id)
    new = plan_of(definition_id, wider)
    assert new.name in result["created"] and plan.name in result["dropped"]
    assert pointed(app, definition_id) == new.name and tables(app, definition_id) == {new.name}
    assert differences(app, new) == 0
    with statements(app) as seen:
        assert names(query(client, headers, "items", filters={"rank": 1})) == {"Eta"}
    assert used(seen, new)
    # a change that plans the same table (only a description) keeps it
    resp = client.put(f"{BASE}/definitions/items", json={"schema": {**wider, "description": "x"}}, headers=headers)
    assert resp.status_code == 200 and pointed(app, definition_id) == new.name


def test_deleting_the_definition_drops_table_function_and_triggers(projected):
    app, client, headers, definition_id, plan = projected
    assert triggers(app, definition_id) == {f"registered {plan.name}"}
    assert dispatcher(app) == {f"{projection.DISPATCH}_{s}" for s in "iud"}  # one set for the schema
    resp = client.delete(f"{BASE}/definitions/items?deleteRecords=true&hardDelete=true", headers=headers)
    assert resp.status_code in (200, 204), resp.get_json()
    assert tables(app, definition_id) == set() and triggers(app, definition_id) == set()


def test_backfill_keeps_writes_made_after_the_triggers_and_during_the_copy(indexing_app):
    """Build by hand, step by step, with writes between the steps and one concurrent with the copy."""
    from app.db import db

    app = indexing_app
    client = app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    for r in FIXED_RECORDS:  # single creates send no index task: no projection yet
        create_record(client, headers, "items", r)
    assert tables(app, definition_id) == set()
    by_name = {r["name"]: r["id"] for r in query(client, headers, "items", pageSize=100).get_json()["records"]}
    plan = plan_of(definition_id)
    with app.app_context():
        engine = db.engine
        with engine.begin() as conn:
            projection.install(conn, SCHEMA, plan)
    # after the triggers, before the copy: an insert, an update, a deactivation
    create_record(client, headers, "items", {"name": "New", "fields": {"title": "n", "qty": 4}})
    client.put(f"{BASE}/items/records/{by_name['Alpha']}", json={"fields": {"title": "A2", "qty": 50}},
               headers=headers)
    client.delete(f"{BASE}/items/records/{by_name['Beta']}", headers=headers)
    # during the copy: a transaction deactivates Gamma (its trigger finds nothing to delete yet) and
    # commits only while the copy waits for it
    with app.app_context():
        engine = db.engine
        writer = engine.connect()
        tx = writer.begin()
        writer.execute(text(f"UPDATE {SCHEMA}.entity_records SET is_active = false WHERE id = :i"),
                       {"i": by_name["Gamma"]})
        done = threading.Event()

        def copy():
            with app.app_context():
                projection.backfill(engine, SCHEMA, plan, batch=2)
            done.set()

        worker = threading.Thread(target=copy)
        worker.start()
        time.sleep(0.5)
        assert not done.is_set()  # waiting for the writer's row
        tx.commit()
        writer.close()
        worker.join(30)
    assert done.is_set()
    assert differences(app, plan) == 0
    assert rows(app, plan) == len(FIXED_RECORDS) + 1 - 2  # + New, - Beta, - Gamma


def test_a_projection_table_dropped_by_hand_is_rebuilt_with_its_triggers(projected):
    from app.db import db
    from app.entities.indexes import sync_definition

    app, client, headers, definition_id, plan = projected
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text(f"UPDATE {SCHEMA}.entity_definitions SET projection = NULL WHERE id = :d"),
                     {"d": definition_id})
        conn.execute(text(f"DROP TABLE {SCHEMA}.{plan.name}"))  # its triggers and function stay behind
        conn.commit()
    with app.app_context():
        sync_definition("default", definition_id)
    assert pointed(app, definition_id) == plan.name and triggers(app, definition_id) == {f"registered {plan.name}"}
    create_record(client, headers, "items", {"name": "After", "fields": {"title": "a", "qty": 1}})
    assert differences(app, plan) == 0 and rows(app, plan) == len(FIXED_RECORDS) + 1


def test_a_projection_dropped_after_the_request_read_its_definition_is_not_an_error(projected, monkeypatch):
    """A rebuild may finish between the request's definition read and its query: the request then
    answers from entity_records alone (same records, same totals), never with a 500."""
    from app.db import db
    from app.entities.services import definitions

    app, client, headers, definition_id, plan = projected
    flt = {"qty": {"$gte": 2}}
    expected = query(client, headers, "items", filters=flt, pageSize=100).get_json()
    expected_count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers).get_json()
    load = definitions.load_definition

    def dropped():  # what a finished rebuild does to the old table
        with db.engine.connect() as conn:
            conn.execute(text(f"UPDATE {SCHEMA}.entity_definitions SET projection = NULL WHERE id = :d"),
                         {"d": definition_id})
            projection.drop(conn, SCHEMA, plan.name)
            conn.commit()

    def read_then_rebuilt(name):
        entry = load(name)
        assert entry.context.definition.projection == plan.name  # the request goes on with this (stale) pointer
        dropped()
        return entry

    app.extensions.pop("entity_definition_cache", None)  # not cached: the request reads the definition
    monkeypatch.setattr(definitions, "load_definition", read_then_rebuilt)
    with statements(app) as seen:
        got = query(client, headers, "items", filters=flt, pageSize=100)
    assert got.status_code == 200, got.get_json()
    assert used(seen, plan)  # it did try the projection first
    assert [r["id"] for r in got.get_json()["records"]] == [r["id"] for r in expected["records"]]
    assert got.get_json()["totalCount"] == expected["totalCount"]
    monkeypatch.undo()
    from app.entities.indexes import sync_definition

    with app.app_context():
        sync_definition("default", definition_id)  # rebuilt; the count request drops it again meanwhile
    assert pointed(app, definition_id) == plan.name
    count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers)
    assert count.status_code == 200 and count.get_json() == expected_count
    # the definition is cached with its projection; another process drops the table between requests
    assert query(client, headers, "items", filters=flt, pageSize=100).get_json()["totalCount"] == expected["totalCount"]
    with app.app_context():
        dropped()
    with statements(app) as seen:
        got = query(client, headers, "items", filters=flt, pageSize=100)
        count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers)
    assert got.status_code == 200, got.get_json()
    assert [r["id"] for r in got.get_json()["records"]] == [r["id"] for r in expected["records"]]
    assert count.status_code == 200 and count.get_json() == expected_count
    assert used(seen[:1], plan) and not used(seen[1:], plan)  # tried the cached pointer once, then read anew


ODD_LISTS = {  # what `l` holds in records written while the schema declared it plain JSON
    "dups": ["a", "A", "a"], "num": [1, "1"], "onlynum": [1], "nul": ["b", None], "nested": [["a"]],
    "object": {"a": ["a"]}, "scalar": "a", "null": None, "missing": "MISSING", "empty": [], "bool": [True],
    "booltext": ["true"], "mixed": [{"a": "a"}, 2.5, "ü"],
}


@pytest.mark.parametrize("flt, expected", [
    ({"l": "a"}, {"dups"}),
    ({"l": {"$contains": "A"}}, {"dups"}),
    ({"l": "1"}, {"num"}),
    ({"l": "true"}, {"booltext"}),
    ({"l": {"$in": ["1", "ü", "zz"]}}, {"num", "mixed"}),
    ({"l": {"$nin": ["a", "1"]}}, set(ODD_LISTS) - {"dups", "num"}),
    ({"$not": {"l": {"$contains": "b"}}}, set(ODD_LISTS) - {"nul"}),
    ({"l": {"$ne": "a"}, "tags": "vip"}, {"num", "nested"}),
    ({"tags": {"$in": ["new"]}}, {"nested"}),
    ({"tags": ["vip", "new"]}, {"nested"}),
])
def test_list_fields_on_the_projection_hold_what_the_compiler_matches(indexing_app, flt, expected):
    """A list field's column holds the string elements of a JSON array (`{}` for anything else), so
    list conditions on the projection match what `fields @> {l: [v]}` matches, whatever the stored
    value (written before a schema change made `l` a list of strings): numbers, booleans, nulls,
    nested arrays and objects are no strings; duplicates and case are kept."""
    app, client = indexing_app, indexing_app.test_client()
    _org, headers = org_headers()
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "l": {"type": "json"}}}
    definition_id = create_definition(client, headers, name="odd", schema=schema)
    bulk(client, headers, "odd", "create", [
        {"name": name, "tags": {"num": ["vip"], "nested": ["vip", "new"]}.get(name, []),
         "fields": {"s": name, **({} if value == "MISSING" else {"l": value})}} for name, value in ODD_LISTS.items()])
    listed = {**schema, "properties": {**schema["properties"], "l": {"type": "array", "items": {"type": "string"}}}}
    resp = client.put(f"{BASE}/definitions/odd", json={"schema": listed}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    plan = plan_of(definition_id, listed)
    assert pointed(app, definition_id) == plan.name and differences(app, plan) == 0  # rebuilt by the task
    with statements(app) as seen:
        got = query(client, headers, "odd", filters=flt, pageSize=100)
        count = client.post(f"{BASE}/odd/records/count", json={"filters": flt}, headers=headers).get_json()
    assert names(got) == expected and count == len(expected)
    assert used(seen, plan)
    # the count reads the projection alone (no fallback to entity_records' JSONB)
    assert any("count(" in s and plan.name in s and "entity_records" not in s for s in seen)


def test_one_dispatcher_keeps_several_projections_exact(projected):
    """Two projected definitions, one plain: statements touching several definitions at once (and a
    record moved between definitions) leave each projection equal to its definition's records."""
    from app.db import db

    app, client, headers, definition_id, plan = projected
    _org, other_headers = org_headers()
    other_id = create_definition(client, other_headers)
    bulk(client, other_headers, "items", "create", FIXED_RECORDS)
    other = plan_of(other_id)
    assert pointed(app, other_id) == other.name
    plain_id = create_definition(client, headers, name="plain")
    create_record(client, headers, "plain", {"name": "P", "fields": {"title": "p", "qty": 1}})
    with app.app_context(), db.engine.begin() as conn:
        ids = (definition_id, other_id, plain_id)
        conn.execute(text(f"UPDATE {SCHEMA}.entity_records SET fields = fields || '{{\"qty\": 42}}' "
                          "WHERE entity_id = ANY(:ids)"), {"ids": list(ids)})
        moved = conn.scalar(text(f"SELECT id FROM {SCHEMA}.entity_records WHERE entity_id = :d AND name = 'Alpha'"),
                            {"d": definition_id})
        conn.execute(text(f"UPDATE {SCHEMA}.entity_records SET entity_id = :p WHERE id = :i"),
                     {"p": plain_id, "i": moved})
    assert differences(app, plan) == 0 and differences(app, other) == 0
    assert rows(app, plan) == len(FIXED_RECORDS) - 1 and rows(app, other) == len(FIXED_RECORDS)
    with app.app_context(), db.engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {SCHEMA}.entity_records WHERE entity_id = ANY(:ids) AND name <> 'Beta'"),
                     {"ids": [definition_id, other_id]})
    assert differences(app, plan) == 0 and differences(app, other) == 0 and rows(app, other) == 1


def test_registering_a_projection_waits_for_writers_in_flight(indexing_app):
    """A record inserted by a transaction still open when the projection is registered: registration
    waits for it (else that insert, made before the dispatcher knew the projection and committed after
    the backfill read, would be missing)."""
    from app.db import db

    app = indexing_app
    client = app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    for r in FIXED_RECORDS[:3]:
        create_record(client, headers, "items", r)
    plan = plan_of(definition_id)
    with app.app_context():
        engine = db.engine
        writer = engine.connect()
        tx = writer.begin()
        writer.execute(text(
            f"INSERT INTO {SCHEMA}.entity_records SELECT (jsonb_populate_record(r, jsonb_build_object("
            f"'id', gen_random_uuid()::text, 'name', 'Late'))).* FROM {SCHEMA}.entity_records r "
            "WHERE r.entity_id = :d LIMIT 1"), {"d": definition_id})
        done = threading.Event()

        def register():
            with app.app_context(), engine.begin() as conn:
                projection.install(conn, SCHEMA, plan)
            done.set()

        worker = threading.Thread(target=register)
        worker.start()
        time.sleep(0.5)
        assert not done.is_set()  # waiting for the writer
        tx.commit()
        writer.close()
        worker.join(30)
        assert done.is_set()
        projection.backfill(engine, SCHEMA, plan)
    assert differences(app, plan) == 0 and rows(app, plan) == 4


CASE_RECORDS = [
    {"name": "Istanbul", "fields": {"title": "İSTANBUL ÉCOLE", "status": "open", "email": "X@Y.IO"}},
    {"name": "Sigma", "fields": {"title": "ΣΊΣΥΦΟΣ straße", "status": "open"}},
    {"name": "Percent", "fields": {"title": "50% OFF_now", "status": "closed"}},
]


@pytest.mark.parametrize("flt", [
    {"title": {"$contains": "WORLD"}}, {"title": {"$contains": "école"}}, {"title": {"$contains": "istanbul"}},
    {"title": {"$contains": "σίσυφος"}}, {"title": {"$contains": "STRASSE"}}, {"title": {"$contains": "STRAßE"}},
    {"title": {"$contains": "% off_"}}, {"title": {"$contains": "_"}}, {"title": {"$startsWith": "hello"}},
    {"title": {"$endsWith": "ÉCOLE"}}, {"$not": {"title": {"$contains": "o"}}}, {"email": {"$endsWith": "y.io"}},
    {"status": {"$contains": "OPE"}},  # a dropdown: no folded column, ILIKE as before
])
def test_substring_matches_read_the_folded_column_with_ilikes_answers(projected, flt):
    """On the projection a substring match of a short text field (not a dropdown) compares its stored
    lower(text) with LIKE against lower(pattern), through that column's trigram GIN: exactly ILIKE's
    matches (PostgreSQL's ILIKE lowers both sides), case folding of non-ASCII text and escaped
    `%`/`_` included; the same answers as entity_records alone."""
    app, client, headers, definition_id, plan = projected
    bulk(client, headers, "items", "create", CASE_RECORDS)
    with statements(app) as seen:
        got = query(client, headers, "items", filters=flt, pageSize=100).get_json()
    folded = [c for c, _, e in plan.columns if c.startswith("l_")]
    assert folded and all(f"gin ({c} public.gin_trgm_ops)" in " ".join(b for _, b in plan.indexes) for c in folded)
    sql = " ".join(seen)
    assert used(seen, plan), seen
    assert ("ILIKE" in sql) is ("status" in flt), seen  # only the dropdown's match is an ILIKE
    other_client = app.test_client()
    _org, other = org_headers()
    create_definition(other_client, other)
    for r in FIXED_RECORDS + CASE_RECORDS:
        create_record(other_client, other, "items", r)
    expected = query(other_client, other, "items", filters=flt, pageSize=100).get_json()
    assert sorted(r["name"] for r in got["records"]) == sorted(r["name"] for r in expected["records"])
    assert got["totalCount"] == expected["totalCount"]


def test_folded_columns_get_the_raised_statistics_target(projected):
    """The folded text columns are analyzed with a larger histogram (FOLDED_STATISTICS), so that a
    substring match's estimate does not drop to the 0.01 % floor whenever the sample's histogram
    happens to hold no entry with the term; the other columns keep the server's default."""
    from app.db import db

    app, _client, _headers, _definition_id, plan = projected
    with app.app_context(), db.engine.connect() as conn:
        targets = dict(conn.execute(text(
            "SELECT attname, attstattarget FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0"),
            {"t": f"{SCHEMA}.{plan.name}"}).all())
    folded = {f.folded for f in plan.fields if f.folded is not None}
    assert folded and all(targets[c] == projection.FOLDED_STATISTICS for c in folded), targets
    assert all(t is None or t < 0 for c, t in targets.items() if c not in folded), targets


@pytest.mark.parametrize("params, once", [
    (dict(filters={"$search": "hello"}, pageSize=1), True),
    (dict(filters={"$search": "hello"}, pageSize=1, page=2), True),
    (dict(filters={"$search": "nothing-matches"}), True),
    (dict(filters={"$search": "hello"}, sortBy="qty", pageSize=1), False),
    (dict(filters={"title": {"$contains": "hello"}}, pageSize=1), False),
])
def test_a_relevance_page_and_its_count_read_the_matches_once(projected, monkeypatch, params, once):
    """`$search` without sortBy (relevance order) on the projection: one statement whose matches are
    a MATERIALIZED CTE that the count and the ranked page both read; orders an index walks keep their
    own page scan. Answers as entity_records alone gives them."""
    app, client, headers, definition_id, plan = projected
    with statements(app) as seen:
        got = query(client, headers, "items", **params)
    assert got.status_code == 200 and len(seen) == 1 and used(seen, plan), seen
    assert ("WITH matched AS MATERIALIZED" in seen[0]) is once, seen[0]
    with monkeypatch.context() as m:
        m.setattr(projection, "resolver_for", lambda *a, **k: None)
        assert got.get_json() == query(client, headers, "items", **params).get_json()


def side_tables(app, plan) -> set[str]:
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        return projection.side_tables(conn, SCHEMA, plan.name)


@pytest.mark.parametrize("flt, side", [
    ({"title": {"$contains": "WORLD"}}, "title"),
    ({"title": {"$startsWith": "hello"}}, "title"),
    ({"$not": {"title": {"$contains": "o"}}}, "title"),
    ({"$or": [{"title": {"$contains": "école"}}, {"title": {"$endsWith": "d"}}]}, "title"),
    ({"email": {"$endsWith": "y.io"}}, "email"),
    ({"title": {"$contains": "o"}, "qty": {"$gte": 2}}, None),  # another column: the projection counts
    ({"$or": [{"title": {"$contains": "o"}}, {"email": {"$contains": "x"}}]}, None),  # two folded columns
    ({"title": "Hello"}, None),  # an equality reads the typed column, not the folded one
    ({"status": {"$contains": "OPE"}}, None),  # a dropdown has no folded column
])
def test_a_substring_count_reads_the_fields_substring_table(projected, monkeypatch, flt, side):
    """An exact count whose filter reads one folded column alone (substring matches on one short text
    field, in any AND/OR/NOT) is counted on that field's substring table (`id` + the folded column,
    kept exact by the same triggers); the page still comes from the projection, in the same
    statement. Counts, pages and the count endpoint answer as entity_records alone does."""
    app, client, headers, definition_id, plan = projected
    bulk(client, headers, "items", "create", CASE_RECORDS)
    assert differences(app, plan) == 0
    sides = {f.field: s for f in plan.fields for s in plan.sides if s.folded == f.folded}
    assert {"title", "email"} <= set(sides) and side_tables(app, plan) == {s.name for s in plan.sides}
    query(client, headers, "items")  # the definition cached
    with statements(app) as seen:
        got = query(client, headers, "items", filters=flt, pageSize=3)
        count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers)
    assert got.status_code == 200 and count.status_code == 200, (got.get_json(), count.get_json())
    assert len(seen) == 2 and used(seen[:1], plan) and used(seen[1:], plan) is (side is None), seen
    for s in sides.values():
        assert all((s.name in sql) is (side is not None and s is sides[side]) for sql in seen), (s.name, seen)
    with monkeypatch.context() as m:  # entity_records alone
        m.setattr(projection, "resolver_for", lambda *a, **k: None)
        assert got.get_json() == query(client, headers, "items", filters=flt, pageSize=3).get_json()
        assert count.get_json() == client.post(f"{BASE}/items/records/count", json={"filters": flt},
                                               headers=headers).get_json()
    assert got.get_json()["totalCount"] == count.get_json()


def test_substring_tables_follow_writes_and_go_with_the_projection(projected):
    """The substring tables are built with the projection, kept exact by the dispatcher through every
    kind of write, rebuilt (with the projection) when one is dropped by hand, and dropped with it."""
    from app.db import db
    from app.entities.indexes import sync_definition

    app, client, headers, definition_id, plan = projected
    assert plan.sides and side_tables(app, plan) == {s.name for s in plan.sides}
    created = create_record(client, headers, "items", {"name": "Zeta", "fields": {"title": "Zèta", "qty": 9}})
    client.put(f"{BASE}/items/records/{created['id']}", json={"fields": {"title": "zz", "qty": 3}}, headers=headers)
    assert differences(app, plan) == 0
    assert client.delete(f"{BASE}/items/records/{created['id']}", headers=headers).status_code in (200, 204)
    assert differences(app, plan) == 0
    with app.app_context(), db.engine.connect() as conn:
        count = conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.{plan.sides[0].name}"))
        indexed = conn.scalar(text("SELECT count(*) FROM pg_indexes WHERE schemaname = :s AND indexname = :i"),
                              {"s": SCHEMA, "i": plan.sides[0].index[0]})
    assert count == rows(app, plan) and indexed == 1
    # dropped by hand: the request answers from entity_records meanwhile, the next sync rebuilds
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text(f"DROP TABLE {SCHEMA}.{plan.sides[0].name}"))
        conn.commit()
    title = plan.sides[0].folded == plan.field("title").folded
    flt = {"title" if title else "email": {"$contains": "o"}}
    resp = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    with app.app_context():
        sync_definition("default", definition_id)
    assert side_tables(app, plan) == {s.name for s in plan.sides} and differences(app, plan) == 0
    again = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers)
    assert again.get_json() == resp.get_json()
    resp = client.delete(f"{BASE}/definitions/items?deleteRecords=true&hardDelete=true", headers=headers)
    assert resp.status_code in (200, 204), resp.get_json()
    assert side_tables(app, plan) == set() and tables(app, definition_id) == set()


def test_a_substring_count_of_a_reused_filter_shape_binds_each_requests_value(projected, monkeypatch):
    """Requests of one filter shape reuse its compiled form with their own values (a cached definition's
    shapes): the substring table's count binds each request's pattern, not the first one's."""
    app, client, headers, definition_id, plan = projected
    bulk(client, headers, "items", "create", CASE_RECORDS)
    query(client, headers, "items")  # the definition cached: its filter shapes are reused
    side = next(s for s in plan.sides if s.folded == plan.field("title").folded)
    for word in ("WORLD", "école", "o", "nothing-like-it", "% off_", "WORLD"):
        flt = {"title": {"$contains": word}}
        with statements(app) as seen:
            got = query(client, headers, "items", filters=flt, pageSize=2).get_json()
            count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers).get_json()
        assert all(side.name in sql for sql in seen), seen
        with monkeypatch.context() as m:  # entity_records alone
            m.setattr(projection, "resolver_for", lambda *a, **k: None)
            expected = query(client, headers, "items", filters=flt, pageSize=2).get_json()
        assert got == expected and count == expected["totalCount"], (word, got, expected)


def test_without_substring_tables_the_projection_counts_substring_matches_itself(make_app):
    """ENTITY_SUBSTRING_TABLES=0: the plan has none (another table name), counts read the projection,
    answers unchanged."""
    app = make_app(ENTITY_INDEX_MIN_RECORDS=3, REDIS_URL="", ENTITY_SUBSTRING_TABLES=0)
    client = app.test_client()
    _org, headers = org_headers()
    definition_id = create_definition(client, headers)
    bulk(client, headers, "items", "create", FIXED_RECORDS + CASE_RECORDS)
    plan = projection.plan_projection(definition_id, compile_definition_schema(ALL_TYPES_SCHEMA).catalog, 0)
    assert not plan.sides and plan.name != plan_of(definition_id).name
    assert pointed(app, definition_id) == plan.name and side_tables(app, plan) == set()
    flt = {"title": {"$contains": "o"}}
    with statements(app) as seen:
        count = client.post(f"{BASE}/items/records/count", json={"filters": flt}, headers=headers).get_json()
    assert used(seen, plan) and not any(projection.SIDE_PREFIX in s for s in seen), seen
    other = app.test_client()
    _o, other_headers = org_headers()
    create_definition(other, other_headers)
    for r in FIXED_RECORDS + CASE_RECORDS:
        create_record(other, other_headers, "items", r)
    assert count == other.post(f"{BASE}/items/records/count", json={"filters": flt},
                               headers=other_headers).get_json()
