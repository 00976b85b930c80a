"""Bulk create into a projected definition (app.entities.bulk): the projection's statement trigger
keeps the batch's rows (its transition table) in memory, not in a temporary file, and the session's
work_mem is as it was after the statement."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.functional.entities_support import BASE, create_definition, org_headers, query

SCHEMA = "product_default"
WIDE = {"type": "object", "required": ["title"], "properties": {
    "title": {"type": "string", "maxLength": 200}, "body": {"type": "text"}, "n": {"type": "int"},
    "at": {"type": "datetime"}}}


@pytest.fixture()
def indexing_app(make_app):
    return make_app(ENTITY_INDEX_MIN_RECORDS=3, REDIS_URL="")


def _temp_files(conn) -> int:
    conn.execute(text("SELECT pg_stat_force_next_flush()"))
    conn.commit()
    conn.execute(text("SELECT pg_stat_clear_snapshot()"))
    return conn.scalar(text("SELECT temp_files FROM pg_stat_database WHERE datname = current_database()"))


def test_a_5000_record_batch_keeps_its_transition_rows_in_memory(indexing_app):
    from app.db import db

    client = indexing_app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "wide", WIDE)
    seed = [{"fields": {"title": f"t{i}", "n": i}} for i in range(3)]
    assert client.post(f"{BASE}/wide/records/bulk/create", json={"records": seed}, headers=headers).status_code == 200
    assert query(client, headers, "wide", filters={"n": {"$gte": 0}}).get_json()["totalCount"] == 3
    batch = [{"fields": {"title": f"record {i}", "body": "lorem ipsum dolor sit amet " * 30, "n": i,
                         "at": "2026-01-01T10:00:00Z"}} for i in range(5000)]  # ~5MB of transition rows
    with indexing_app.app_context(), db.engine.connect() as conn:
        projected = conn.scalar(text(f"SELECT projection FROM {SCHEMA}.entity_definitions WHERE name = 'wide' "
                                     "AND projection IS NOT NULL"))
        assert projected  # the trigger fires for this batch
        before = _temp_files(conn)
        resp = client.post(f"{BASE}/wide/records/bulk/create", json={"records": batch}, headers=headers)
        assert resp.status_code == 200, resp.get_json()
        assert _temp_files(conn) == before
        assert conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.{projected}")) == 5003
    resp = query(client, headers, "wide", filters={"n": {"$gte": 4990}})
    assert resp.get_json()["totalCount"] == 10


def test_work_mem_is_put_back_after_the_insert(indexing_app):
    """The raised work_mem is local to the INSERT … SELECT: what else runs in the transaction (the
    write hook, the index task's scheduling) sees the session's own."""
    from app.db import db
    from app.entities import bulk

    seen = []
    original = bulk.records_written

    def spy(session, *args):
        seen.append(session.execute(text("SHOW work_mem")).scalar())
        return original(session, *args)

    client = indexing_app.test_client()
    _org, headers = org_headers()
    create_definition(client, headers, "small", WIDE)
    bulk.records_written = spy
    try:
        resp = client.post(f"{BASE}/small/records/bulk/create", json={"records": [{"fields": {"title": "x"}}]},
                           headers=headers)
    finally:
        bulk.records_written = original
    assert resp.status_code == 200, resp.get_json()
    with indexing_app.app_context(), db.engine.connect() as conn:
        assert seen == [conn.execute(text("SHOW work_mem")).scalar()] and seen[0] != bulk.BULK_WORK_MEM
