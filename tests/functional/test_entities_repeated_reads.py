"""A driver read repeated with the same statement and values runs as that statement with its values
written in as typed literals, prepared (app.db._execute_read): planned once per connection, the same
answers as planned for its values at every call."""

from __future__ import annotations

import datetime
import decimal
import uuid

import psycopg

import app.db as app_db
from app.db import db
from tests.functional.entities_support import create_definition, create_record, org_headers, query


def test_a_repeated_read_runs_with_its_values_written_in_and_answers_the_same(make_app):
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    client = one.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    for i in range(3):
        create_record(client, headers, "items", {"name": f"r{i}", "fields": {"title": "x" if i else "y'%"}})
    app_db._READS.clear()
    app_db._SEEN.clear()
    answers = [query(client, headers, "items", sortBy="title").get_json() for _ in range(4)]
    assert answers[0]["totalCount"] == 3 and all(a == answers[0] for a in answers)
    assert app_db._READS and all("%(" not in sql for sql in app_db._READS.values())
    app_db.REPEATED_PLANS = False
    try:
        assert query(client, headers, "items", sortBy="title").get_json() == answers[0]
    finally:
        app_db.REPEATED_PLANS = True
    create_record(client, headers, "items", {"name": "r3", "fields": {"title": "z"}})  # a write between
    assert query(client, headers, "items", sortBy="title").get_json()["totalCount"] == 4


def test_values_are_written_as_the_driver_binds_them(app):
    values = {"s": "o'p%\\", "i": 20, "big": 2**40, "d": decimal.Decimal("1000.50"), "f": 1.5, "b": True,
              "n": None, "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC),
              "day": datetime.date(2024, 1, 2), "u": uuid.UUID(int=7), "texts": ["red", "o'p", None],
              "ints": [1, 2**40],
              "empty": []}
    sql = ("SELECT %(s)s::text, %(i)s + 0, pg_typeof(%(i)s), %(big)s, pg_typeof(%(d)s), %(d)s, %(f)s, "
           "pg_typeof(%(f)s), %(b)s, %(n)s::text, %(ts)s, %(day)s, %(u)s, '100%%' LIKE '1%%', %(s)s::text, "
           "ARRAY['red']::text[] @> %(texts)s, %(ints)s, cardinality(%(empty)s::text[])")
    with app.app_context(), db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        literal = app_db._literal_sql(raw, sql, values)
        with raw.cursor() as cur:
            bound = cur.execute(sql, values, prepare=False).fetchone()
            written = cur.execute(literal, prepare=False).fetchone()
        assert written == bound
        with raw.cursor() as cur:
            try:
                cur.execute(app_db._literal_sql(raw, "SELECT %(s)s::int", {"s": "1; SELECT 2"}))
                raise AssertionError("a value must stay one literal")
            except psycopg.errors.InvalidTextRepresentation:
                pass
        raw.rollback()


def test_only_reads_that_repeat_within_the_kept_set_are_written_in(make_app, monkeypatch):
    """GETs cycling over more records than PLANNED_READS_MAX would push each other's literals out before
    a second use (a literal, a prepare and a deallocate each): they are never written in; a few records
    read again and again are. A written-in read beyond the limit drops the oldest, not all of them."""
    monkeypatch.setattr(app_db, "PLANNED_READS_MAX", 4)
    monkeypatch.setattr(app_db, "SEEN_READS_MAX", 16)
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    client = one.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    ids = [create_record(client, headers, "items", {"name": f"r{i}", "fields": {"title": f"t{i}"}})["id"]
           for i in range(40)]

    def get(record_id):
        response = client.get(f"/api/v1/entities/items/records/{record_id}", headers=headers)
        assert response.status_code == 200 and response.get_json()["id"] == record_id

    app_db._READS.clear()
    app_db._SEEN.clear()
    for _round in range(3):
        for record_id in ids:  # 40 records in turn: each comes again only after 39 others
            get(record_id)
    assert not any(record_id in sql for sql in app_db._READS.values() for record_id in ids)
    for _round in range(3):
        for record_id in ids[:3]:  # three records in turn: written in from their second read
            get(record_id)
    written = [record_id for record_id in ids if any(record_id in sql for sql in app_db._READS.values())]
    assert written == ids[:3]
    for record_id in ids[3:6] * 2:  # three more: the limit (4) drops the oldest one by one
        get(record_id)
    written = [record_id for record_id in ids if any(record_id in sql for sql in app_db._READS.values())]
    assert written == ids[2:6] and len(app_db._READS) == 4


def test_the_count_of_reads_seen_covers_a_few_times_the_kept_set():
    """A pair must come again within SEEN_READS_MAX other pairs to be written in: far above
    PLANNED_READS_MAX, reads cycling over a set too large to keep would be admitted and churn."""
    assert app_db.PLANNED_READS_MAX < app_db.SEEN_READS_MAX <= 4 * app_db.PLANNED_READS_MAX
