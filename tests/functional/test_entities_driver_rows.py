"""A record query's shaped count-and-page statement runs on the driver's cursor (app.db._driver_rows; in a
read-only request whose session holds no connection, on a pooled connection of its own, app.db._read_raw):
engine cursor events still see it (they keep it on the session's connection), a driver error is still
SQLAlchemy's (a dead connection answers 503 and the pool reconnects), and JSON values decode as
json.loads decodes them (app.db.json_loads)."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import event, text

import app.db as app_db
from app.db import db, json_loads
from tests.functional.entities_support import create_definition, create_record, org_headers, query


def test_engine_cursor_events_see_the_driver_path_before_and_after(app):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    create_record(client, headers, "items", {"name": "one", "fields": {"title": "x"}})
    seen: list[tuple[str, str]] = []

    def before(_conn, _cursor, statement, _parameters, _context, _executemany):
        seen.append(("before", statement))

    def after(_conn, cursor, statement, _parameters, _context, _executemany):
        seen.append(("after", statement))
        assert cursor.description is not None  # the statement ran on this cursor

    with app.app_context():
        engine = db.engine
    query(client, headers, "items")  # the definition cached: the next query's only statement is its page
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        resp = query(client, headers, "items", filters={"title": "x"})
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    assert resp.status_code == 200 and resp.get_json()["totalCount"] == 1
    pages = [(when, sql) for when, sql in seen if "count(*)" in sql]
    assert [when for when, _ in pages] == ["before", "after"], seen
    assert pages[0][1] == pages[1][1]


def test_a_connection_that_died_under_the_driver_path_costs_one_503_then_the_pool_reconnects(make_app, app):
    busy = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    client = busy.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    assert query(client, headers, "items").status_code == 200  # caches the definition
    with busy.app_context():
        pid = db.session.scalar(text("SELECT pg_backend_pid()"))
    with app.app_context(), db.engine.connect() as conn:  # the main test app's pool, not the one under test
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    time.sleep(0.05)
    first = query(client, headers, "items")
    assert first.status_code == 503, first.get_json()
    assert first.get_json()["error"]["code"] == "SERVICE_UNAVAILABLE"
    second = query(client, headers, "items")
    assert second.status_code == 200, second.get_json()
    with busy.app_context():
        assert db.session.scalar(text("SELECT pg_backend_pid()")) != pid


def test_a_read_only_query_and_count_run_on_a_connection_of_their_own(app, monkeypatch):
    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    create_record(client, headers, "items", {"name": "one", "fields": {"title": "x"}})
    query(client, headers, "items")  # the definition cached: the next query's only statement is its page
    paths: list[tuple[str, str]] = []
    read_raw, driver_rows = app_db._read_raw, app_db._driver_rows

    def counted_read_raw(engine, sql, params, **kwargs):
        paths.append(("own connection", sql))
        return read_raw(engine, sql, params, **kwargs)

    def counted_driver_rows(connection, sql, params):
        paths.append(("session", sql))
        return driver_rows(connection, sql, params)

    monkeypatch.setattr(app_db, "_read_raw", counted_read_raw)
    monkeypatch.setattr(app_db, "_driver_rows", counted_driver_rows)
    resp = query(client, headers, "items", filters={"title": "x"})
    assert resp.status_code == 200 and resp.get_json()["totalCount"] == 1
    count = client.post("/api/v1/entities/items/records/count", json={"filters": {"title": "x"}}, headers=headers)
    assert count.status_code == 200 and count.get_json() == 1
    assert [path for path, _sql in paths] == ["own connection"] * 2 and all("count(*)" in sql for _p, sql in paths)
    paths.clear()
    monkeypatch.setattr(app_db, "RAW_READS", False)  # the A side: the session's connection, as before
    assert query(client, headers, "items", filters={"title": "x"}).get_json() == resp.get_json()
    assert [path for path, _sql in paths] == ["session"]


@pytest.mark.parametrize("data", [
    b'{"a": 1, "b": [1, 2.50, -0, 1e400, 123456789012345678901234567890]}', b' {"a":1}', b'{"a":1} ', b'\t[]\n',
    '\ufeff{"a":1}'.encode(), '{"é": "\\u00e9\\ud83d\\ude00"}'.encode(), b'"x"', b"null", b"true", b"12",
    b'{"a":', b"", b"{} {}", b'{"a": NaN}', b'\xff{"a":1}', b'{"a": 1, "a": 2}',
])
def test_json_values_decode_as_json_loads_decodes_them(data):
    try:
        expected = json.loads(data)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            json_loads(data)
        return
    got = json_loads(data)
    assert got == expected or (got != got and expected != expected)
    assert json.dumps(got) == json.dumps(expected)  # same types too (2.5 vs 2.50, big integers, -0)


def test_page_records_sent_as_postgresql_wrote_them_are_the_records(app, monkeypatch):
    """A page without shaping answers each record as the text PostgreSQL built (query.PRE_ENCODED): the
    same JSON as the record's GET and as the decoded page, non-ASCII escaped, big integers exact."""
    from app.entities import query as entity_query

    client = app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    metadata = {"big": 123456789012345678901234567890, "tiny": 1e-7, "text": "Café ☕\x7f", "none": None}
    body = {"name": "Crème ☕", "fields": {"title": "Ünïcode", "price": 2.5e-8}, "metadata": metadata}
    record = create_record(client, headers, "items", body)
    got = client.get(f"/api/v1/entities/items/records/{record['id']}", headers=headers).get_json()
    assert got["metadata"] == metadata and got["name"] == "Crème ☕"
    page = query(client, headers, "items")
    assert page.status_code == 200 and page.data.isascii()
    assert page.get_json()["records"] == [got]
    assert b"123456789012345678901234567890" in page.data
    shaped = query(client, headers, "items", include=["title"])
    assert shaped.get_json()["records"] == [{**got, "fields": {"title": "Ünïcode"}}]
    plain = create_record(client, headers, "items", {"name": "Zoë", "fields": {"title": "b", "price": 1e-7},
                                                    "metadata": {"z": 1, "a": [1.5, "é"], "m": {"y": 2, "b": 3}}})
    both = query(client, headers, "items")
    assert [r["id"] for r in both.get_json()["records"]] == [plain["id"], record["id"]]
    monkeypatch.setattr(entity_query, "PRE_ENCODED", False)
    decoded = query(client, headers, "items")
    assert decoded.get_json() == both.get_json()
    # compact, keys sorted: the decoded page's bytes too, but for the exponent form of a float (json's
    # encoder writes 1e-07 where it takes over for a big integer, orjson 1e-7)
    def exponents(data: bytes) -> bytes:
        return data.replace(b"e-07", b"e-7").replace(b"e-08", b"e-8")

    assert exponents(decoded.data) == exponents(both.data)
