"""A repeated read (its values written in, app.db._repeated) on a connection that is not traced runs as a
statement prepared at the libpq level (app.db._run_prepared): the same rows as the driver's cursor, its
errors raised as SQLAlchemy's, a dead connection invalidated, statements deallocated behind its back
prepared again, at most PLANNED_READS_MAX of them per connection, and what it relies on of psycopg."""

from __future__ import annotations

import inspect
import time

import psycopg
import pytest
from sqlalchemy import func, literal, literal_column, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

import app.db as app_db
from app.db import db
from tests.functional.entities_support import BASE, create_definition, create_record, org_headers


@pytest.fixture(autouse=True)
def _fresh_reads():
    app_db._READS.clear()
    app_db._SEEN.clear()
    yield
    app_db._READS.clear()
    app_db._SEEN.clear()


def _ours(app) -> list[str]:
    """The names of this module's prepared statements on the (single) pooled connection of `app`."""
    with app.app_context():
        return db.session.scalars(text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'gw_read_%'")).all()


def test_psycopg_names_the_libpq_path_relies_on(app):
    """Fails when psycopg renames or reshapes what app.db._run_prepared calls."""
    with app.app_context():
        raw = db.engine.raw_connection()
        try:
            conn = raw.dbapi_connection
            assert isinstance(conn.pgconn, psycopg.pq.PGconn) and conn.cursor_factory is psycopg.Cursor
            assert conn.info.encoding == "utf-8"
        finally:
            raw.close()
    for method in ("prepare", "exec_prepared", "exec_"):
        assert callable(getattr(psycopg.pq.PGconn, method))
    for name in ("status", "ntuples", "nfields", "fname", "get_value", "error_field", "get_error_message"):
        assert hasattr(psycopg.pq.PGresult, name)
    tx = psycopg.adapt.Transformer
    assert {"set_pgresult", "load_row", "load_rows"} <= set(dir(tx))
    assert list(inspect.signature(psycopg.errors.error_from_result).parameters) == ["result", "encoding"]
    assert psycopg.pq.ExecStatus.TUPLES_OK and psycopg.pq.ExecStatus.COMMAND_OK
    assert psycopg.pq.DiagnosticField.SQLSTATE


def test_a_repeated_read_answers_what_the_cursor_answers(make_app, monkeypatch):
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    stmt = select(literal("o'p%").label("s"), literal(20).label("i"), func.now().label("now"),
                  func.jsonb_build_object("a", [1, 2], "b", None).label("j"), func.gen_random_uuid().label("u"),
                  literal(None).label("n"), literal_column("1.50::numeric").label("d"),
                  literal_column("ARRAY['x', NULL]").label("arr"), literal_column("'2024-01-02'::date").label("day"))
    with one.app_context():
        rows = [db.read_first(stmt, {}) for _ in range(app_db.PLAN_AFTER + 2)]
        assert _ours(one)  # ran prepared at the libpq level
        monkeypatch.setattr(app_db, "PREPARED_READS", False)
        by_cursor = db.read_first(stmt, {})
    for row in [*rows, by_cursor]:
        assert list(row) == list(by_cursor)
        assert {k: v for k, v in row.items() if k not in ("now", "u")} == \
            {k: v for k, v in by_cursor.items() if k not in ("now", "u")}
        assert {k: type(v) for k, v in row.items()} == {k: type(v) for k, v in by_cursor.items()}
    assert by_cursor["j"] == {"a": [1, 2], "b": None}
    with one.app_context():
        assert db.read_first(select(literal(1).label("x")).where(literal(1) == 2), {}) is None
        assert db.read_first(select(literal(1).label("x")).where(literal(1) == 2), {}) is None
        assert db.read_first(select(literal(1).label("x")).where(literal(1) == 2), {}) is None
        raw = db.engine.raw_connection()
        try:  # no transaction left open, the connection back in transaction mode for the next request
            assert raw.dbapi_connection.autocommit is False
            assert raw.dbapi_connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            raw.close()


def test_a_record_get_repeated_then_its_connection_dies_costs_one_503(make_app, app):
    busy = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    client = busy.test_client()
    _org, headers = org_headers()
    create_definition(client, headers)
    record = create_record(client, headers, "items", {"name": "r1", "fields": {"title": "x"}})
    url = f"{BASE}/items/records/{record['id']}"
    answers = [client.get(url, headers=headers) for _ in range(app_db.PLAN_AFTER + 2)]
    assert [a.status_code for a in answers] == [200] * len(answers)
    assert all(a.get_json() == answers[0].get_json() for a in answers)
    assert _ours(busy)
    with busy.app_context():
        pid = db.session.scalar(text("SELECT pg_backend_pid()"))
    with app.app_context(), db.engine.connect() as conn:  # the main test app's pool, not the one under test
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    time.sleep(0.05)
    first = client.get(url, headers=headers)
    assert first.status_code == 503, first.get_json()
    second = client.get(url, headers=headers)
    assert second.status_code == 200 and second.get_json() == answers[0].get_json()
    with busy.app_context():
        assert db.session.scalar(text("SELECT pg_backend_pid()")) != pid


def test_an_error_of_a_repeated_read_is_sqlalchemys_and_keeps_the_connection(make_app):
    slow = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600, DB_STATEMENT_TIMEOUT_MS=50)
    stmt = select(func.pg_sleep(0.3).label("slept"))
    with slow.app_context():
        pid = db.read_first(select(func.pg_backend_pid().label("pid")), {})["pid"]
        for _ in range(app_db.PLAN_AFTER + 1):
            with pytest.raises(OperationalError) as caught:
                db.read_first(stmt, {})
            assert isinstance(caught.value.orig, psycopg.errors.QueryCanceled)
            assert not caught.value.connection_invalidated
        assert stmt in {key[0] for key in db._state().rendered}
        assert any("pg_sleep" in sql for sql in app_db._READS.values())
        bad = select(func.pg_catalog.int4(literal("nan")).label("x"))
        for _ in range(app_db.PLAN_AFTER + 1):  # an error of the statement itself, prepared
            with pytest.raises(DBAPIError) as caught:
                db.read_first(bad, {})
            assert isinstance(caught.value.orig, psycopg.errors.InvalidTextRepresentation)
        assert db.read_first(select(func.pg_backend_pid().label("pid")), {})["pid"] == pid


def test_statements_deallocated_behind_its_back_are_prepared_again(make_app):
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    stmt = select(func.current_setting("plan_cache_mode").label("mode"))
    with one.app_context():
        for _ in range(app_db.PLAN_AFTER + 1):
            assert db.read_first(stmt, {}) == {"mode": "force_custom_plan"}
    assert _ours(one)
    with one.app_context():
        db.session.execute(text("DEALLOCATE ALL"))
        db.session.commit()
    assert not _ours(one)
    with one.app_context():
        assert db.read_first(stmt, {}) == {"mode": "force_custom_plan"}
    assert len(_ours(one)) == 1


def test_a_connection_holds_at_most_planned_reads_max_of_them(make_app, monkeypatch):
    """... also when some of them are gone already (psycopg deallocates every statement of a connection
    after a rollback of a transaction in which it had prepared its own: here DEALLOCATE ALL)."""
    monkeypatch.setattr(app_db, "PLANNED_READS_MAX", 3)
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    for i in range(8):
        with one.app_context():
            stmt = select(literal(i).label("i"))
            for _ in range(app_db.PLAN_AFTER + 1):
                assert db.read_first(stmt, {}) == {"i": i}
        assert 1 <= len(_ours(one)) <= 3
        if i == 1:
            with one.app_context():
                db.session.execute(text("DEALLOCATE ALL"))
                db.session.commit()


def test_a_traced_connection_keeps_the_cursor_path(make_app, monkeypatch):
    """A connection whose cursor class is not psycopg's own (the tracing instrumentation's, which makes
    the statement's span) runs its repeated reads through that cursor."""
    one = make_app(DB_POOL_SIZE=1, DB_PING_IDLE_SECONDS=3600)
    executed = []

    class Traced(psycopg.Cursor):
        def execute(self, query, *args, **kwargs):
            executed.append(query)
            return super().execute(query, *args, **kwargs)

    stmt = select(func.current_setting("statement_timeout").label("timeout"))
    with one.app_context():
        raw = db.engine.raw_connection()
        raw.dbapi_connection.cursor_factory = Traced
        raw.close()
        for _ in range(app_db.PLAN_AFTER + 2):
            assert db.read_first(stmt, {}) == {"timeout": "30s"}
    assert len(executed) == app_db.PLAN_AFTER + 2 and "%(" not in executed[-1]
    assert not _ours(one)
