"""A datetime field holding a value the API would refuse (left there by a schema change from string to
datetime) acts as NULL in every typed use — filter, sort, projection, index — instead of an error
(migration x0002: `public.entity_iso_timestamptz` answers NULL for what it cannot cast)."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import text

from app.entities import projection
from app.entities.fieldtypes import compile_definition_schema
from app.entities.filters import _DATETIME_RE
from tests.functional.entities_support import BASE, create_definition, org_headers
from tests.functional.test_entities_filter_property import KINDS, evaluate
from tests.support import assert_error

SCHEMA = "product_default"
VALID = {"v1": "2026-01-10T10:00:00Z", "v2": "2026-01-10T12:00:00+02:00", "v3": "2026-03-01T00:00:00.5z",
         "far": "2026-01-01T10:00:00+16:00"}  # RFC 3339 (the API takes it) but beyond the cast's ±15:59
BAD = {"feb30": "2026-02-30T10:00:00Z", "hour25": "2026-01-01T25:00:00Z", "month13": "2026-13-01T00:00:00Z",
       "year0": "0000-01-01T00:00:00Z", "min60": "2026-01-01T10:60:00Z"}
OTHER = {"text": "not a date", "none": None}  # no datetime shape; null


@pytest.fixture()
def indexing_app(make_app):
    """Tasks in-process: the index task (and the projection build) has run when the request returns."""
    return make_app(ENTITY_INDEX_MIN_RECORDS=3, REDIS_URL="")


def _records(client, headers, body):
    resp = client.post(f"{BASE}/events/records/query", json={"query": {"pageSize": 100, **body}}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["records"]


def test_invalid_datetimes_left_by_a_schema_change_act_as_null(indexing_app):
    client = indexing_app.test_client()
    _org, headers = org_headers()
    string_schema = {"type": "object", "properties": {"s": {"type": "string"}, "dt": {"type": "string"}}}
    definition_id = create_definition(client, headers, "events", string_schema)
    values = {**VALID, **BAD, **OTHER}
    body = [{"name": name, "fields": {"s": name, "dt": value}} for name, value in values.items()]
    body.append({"name": "missing", "fields": {"s": "missing"}})
    resp = client.post(f"{BASE}/events/records/bulk/create", json={"records": body}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    ids = {r["name"]: r["id"] for r in _records(client, headers, {})}
    # the field becomes a datetime: the index task builds the projection with a timestamptz column
    datetime_schema = {**string_schema, "properties": {**string_schema["properties"], "dt": {"type": "datetime"}}}
    resp = client.put(f"{BASE}/definitions/events", json={"schema": datetime_schema}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    plan = projection.plan_projection(definition_id, compile_definition_schema(datetime_schema).catalog)
    from app.db import db

    with indexing_app.app_context(), db.engine.connect() as conn:
        pointed = conn.scalar(text(f"SELECT projection FROM {SCHEMA}.entity_definitions WHERE id = :d"),
                              {"d": definition_id})
        column = plan.field("dt").column
        projected = dict(conn.execute(text(f"SELECT id, {column} FROM {SCHEMA}.{plan.name}")).all())
    assert pointed == plan.name  # built, backfilled, in use
    assert {name for name, i in ids.items() if projected[i] is not None} == set(VALID)
    assert projected[ids["far"]] == datetime.fromisoformat(VALID["far"])
    # filter and sort: a bad value is no instant (like null) and is still there for $exists
    stored = {name: {"name": name, "fields": {"s": name, **({"dt": v} if name != "missing" else {})}}
              for name, v in {**values, "missing": None}.items()}
    for flt in ({"dt": {"$gte": "2026-01-01T00:00:00Z"}}, {"dt": {"$lt": "2026-02-01T00:00:00Z"}},
                {"dt": {"$between": ["2026-01-10T09:00:00Z", "2026-01-10T10:00:00Z"]}},
                {"dt": {"$ne": "2026-01-10T10:00:00Z"}}, {"dt": "2026-01-10T10:00:00+00:00"},
                {"dt": {"$in": ["2026-01-10T10:00:00Z", "2026-03-01T00:00:00.5Z"]}},
                {"dt": None}, {"dt": {"$exists": True}}, {"$not": {"dt": {"$gt": "2020-01-01T00:00:00Z"}}}):
        found = {r["name"] for r in _records(client, headers, {"filters": flt})}
        expected = {name for name, record in stored.items()
                    if evaluate(flt, {**record, "tags": [], "version": 1, "id": ids[name]}, KINDS)}
        assert found == expected, flt
    order = [r["name"] for r in _records(client, headers, {"sortBy": "dt", "sortOrder": "asc"})]
    assert order[0] == "far" and set(order[1:3]) == {"v1", "v2"} and order[3] == "v3"  # 2025-12-31T18:00Z,
    # then the same instant twice, then March
    assert set(order[4:]) == {*BAD, *OTHER, "missing"}  # no instant: after every instant
    # the records can be read, fixed, deactivated and deleted (the projection's triggers compute the column)
    resp = client.get(f"{BASE}/events/records/{ids['feb30']}", headers=headers)
    assert resp.status_code == 200 and resp.get_json()["fields"]["dt"] == BAD["feb30"]
    resp = client.put(f"{BASE}/events/records/{ids['hour25']}", json={"fields": {"s": "x"}}, headers=headers)
    assert "fields.dt" in str(assert_error(resp, 400, "VALIDATION_ERROR")["error"]["details"])  # named, not 500
    resp = client.put(f"{BASE}/events/records/{ids['feb30']}", json={"fields": {"dt": "2026-02-28T10:00:00Z"}},
                      headers=headers)
    assert resp.status_code == 200, resp.get_json()
    resp = client.post(f"{BASE}/events/records/bulk/delete", json={"recordIds": [ids["month13"]]}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    resp = client.delete(f"{BASE}/events/records/{ids['year0']}?hardDelete=true", headers=headers)
    assert resp.status_code in (200, 204), resp.get_json()
    with indexing_app.app_context(), db.engine.connect() as conn:  # the statement writes what the trigger does
        conn.execute(text(f"UPDATE {SCHEMA}.entity_records SET name = name || '!' WHERE entity_id = :d"),
                      {"d": definition_id})
        conn.commit()
        projected = dict(conn.execute(text(f"SELECT id, {column} FROM {SCHEMA}.{plan.name}")).all())
    assert ids["month13"] not in projected and ids["year0"] not in projected
    assert projected[ids["feb30"]] == datetime.fromisoformat("2026-02-28T10:00:00+00:00")
    assert projected[ids["min60"]] is None and projected[ids["hour25"]] is None
    # a rebuild from scratch (backfill + indexes) over the same rows
    from app.entities import indexes

    with indexing_app.app_context():
        with db.engine.begin() as conn:  # table, function and triggers at once (a lone table would stop writes)
            conn.execute(text(f"UPDATE {SCHEMA}.entity_definitions SET projection = NULL WHERE id = :d"),
                         {"d": definition_id})
            projection.drop(conn, SCHEMA, plan.name)
        assert plan.name in indexes.sync_definition("default", definition_id)["created"]
    after = {"filters": {"dt": {"$gte": "2026-02-01T00:00:00Z"}}}
    names = {r["name"].rstrip("!") for r in _records(client, headers, after)}
    assert names == {"feb30", "v3"}


def test_the_cast_answers_as_postgresql_for_every_value_it_casts(app):
    """Over a grid of boundary values: where `text::timestamptz` succeeds, the function gives the same
    instant; where it raises, NULL — except offsets of 16 to 23 hours (RFC 3339, beyond the cast),
    which are applied by hand. And it stays IMMUTABLE (indexes and the projection hold it)."""
    from app.db import db

    grid = """
    WITH y(v) AS (VALUES ('0000'), ('0001'), ('0004'), ('0100'), ('1900'), ('2000'), ('2023'), ('2024'), ('9999')),
    mo(v) AS (VALUES ('00'), ('01'), ('02'), ('03'), ('04'), ('06'), ('09'), ('11'), ('12'), ('13'), ('99')),
    d(v) AS (VALUES ('00'), ('01'), ('28'), ('29'), ('30'), ('31'), ('32'), ('99')),
    t(v) AS (VALUES ('T00:00:00'), ('T24:00:00'), ('T23:59:60'), ('T23:59:60.5'), ('t12:00:00')),
    z(v) AS (VALUES ('Z'), ('+15:59'), ('-15:59'), ('+16:00'), ('-23:59')),
    h(v) AS (VALUES ('00'), ('01'), ('23'), ('24'), ('25'), ('99')),
    mi(v) AS (VALUES ('00'), ('01'), ('59'), ('60'), ('99')),
    se(v) AS (VALUES ('00'), ('01'), ('59'), ('60'), ('61'), ('99')),
    f(v) AS (VALUES (''), ('.0'), ('.000000'), ('.000001'), ('.5'), ('.999999'), ('.1234567')),
    tz(v) AS (VALUES ('Z'), ('z'), ('+00:00'), ('-00:00'), ('+05:30'), ('+15:59'), ('-15:59'), ('+16:00'),
                     ('+15:60'), ('+23:59'), ('-24:00'), ('+99:99'), ('')),
    dt(v) AS (VALUES ('2026-01-01'), ('9999-12-31'), ('0001-01-01'), ('2024-02-29')),
    sp(v) AS (VALUES ('T'), ('t'), (' '), ('x')),
    g AS (SELECT y.v || '-' || mo.v || '-' || d.v || t.v || z.v AS s FROM y, mo, d, t, z
          UNION ALL SELECT dt.v || sp.v || h.v || ':' || mi.v || ':' || se.v || f.v || tz.v
                    FROM h, mi, se, f, tz, dt, sp
          UNION ALL SELECT unnest(ARRAY['', 'x', '2026-01-01', '2026-01-01T10:00:00', '2026-01-01T10:00:00+0100',
                                        '2026-01-01T10:00:00.Z', ' 2026-01-01T10:00:00Z', '2026-01-01T10:00:00Z ',
                                        '2026-01-01T10:00:00+01', '٢٠٢٦-01-01T10:00:00Z'])),
    -- the compiler calls the function only on this shape (an explicit offset); anything else is NULL
    r AS (SELECT s, CASE WHEN s ~ :shape THEN pg_temp.cast_or_null(s) END AS c,
                 public.entity_iso_timestamptz(s) AS fn, s ~ '[+-](1[6-9]|2[0-3]):[0-5][0-9]$' AS far FROM g)
    SELECT count(*), count(c), count(*) FILTER (WHERE c IS NOT NULL AND fn IS DISTINCT FROM c),
           count(*) FILTER (WHERE c IS NULL AND fn IS NOT NULL AND NOT far),
           (array_agg(s) FILTER (WHERE fn IS DISTINCT FROM c AND NOT far))[1:5],
           count(*) FILTER (WHERE far AND fn IS NOT NULL)
    FROM r"""
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text("""CREATE FUNCTION pg_temp.cast_or_null(value text) RETURNS timestamptz LANGUAGE plpgsql
                             AS $$ BEGIN RETURN value::timestamptz; EXCEPTION WHEN others THEN RETURN NULL; END $$"""))
        conn.execute(text("SET TimeZone = 'America/St_Johns'"))  # an odd zone: the answers must not move
        total, casts, differ, extra, examples, far = conn.execute(text(grid), {"shape": _DATETIME_RE}).one()
        assert total > 150_000 and casts > 20_000, (total, casts)
        assert differ == 0 and extra == 0, examples
        assert far > 1_000
        volatility = conn.scalar(text("SELECT provolatile FROM pg_proc WHERE oid = "
                                      "'public.entity_iso_timestamptz(text)'::regprocedure"))
        assert volatility == "i"
        # offsets beyond the cast: the instant Python (and RFC 3339) gives
        for value in ("2026-01-01T10:00:00+16:00", "2026-01-01T10:00:00.25-23:59", "2026-07-01T24:00:00+20:00"):
            got = conn.scalar(text("SELECT public.entity_iso_timestamptz(:v)"), {"v": value})
            assert got == datetime.fromisoformat(value.replace("T24:", "T00:")).replace(day=2) \
                if "T24:" in value else got == datetime.fromisoformat(value), (value, got)
        edge = conn.execute(text("SELECT (public.entity_iso_timestamptz(:a) AT TIME ZONE 'UTC')::text, "
                                 "(public.entity_iso_timestamptz(:b) AT TIME ZONE 'UTC')::text"),
                            {"a": "0001-01-01T00:00:00+23:00", "b": "9999-12-31T23:59:59-20:30"}).one()
        assert edge == ("0001-12-31 01:00:00 BC", "10000-01-01 20:29:59"), edge
