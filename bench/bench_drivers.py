"""PostgreSQL driver: psycopg 3 (the project's) against psycopg2-binary, on the app's own statements.

Two statements the app sends on its hottest reads, over the embedded PostgreSQL of the benchmarks:
- page: `POST /entities/<name>/records/query` with `pageSize` 20 — the exact count + 20-row page statement
  (one round trip), captured from the engine while the app answers that request;
- one row: `GET /entities/<name>/records/<id>` — the record joined with its definition
  (`app.entities.reads._GET_RECORD`, rendered for the product as `db.read_first` does).
Data: one definition (5 fields) with 1 000 records of org `bench-drivers`, made through the API.

Each statement runs on one connection per configuration, in autocommit, with the settings the app's
pool gives every connection (`statement_timeout`, `plan_cache_mode = force_custom_plan`), rows
fetched as tuples (the JSONB columns decoded to Python by both drivers):
- psycopg 3 as the app uses it: it prepares a statement server-side once it ran 5 times on a
  connection (`prepare_threshold`, its default), so later runs skip parsing and planning setup;
- psycopg 3 with `prepare_threshold=None` (never prepares): the driver alone;
- psycopg2-binary: the same SQL (both drivers take `%(name)s` parameters), never prepared;
- the same three through SQLAlchemy (`exec_driver_sql` on an engine connection, the app's path for the
  page) — `postgresql+psycopg` against `postgresql+psycopg2`.
Configurations are interleaved in rounds so each sees the same machine state; p50/p99/mean in ms.

psycopg2-binary is not a dependency of the project (not in requirements*.txt: installed next to psycopg 3
it would also become SQLAlchemy's driver for a plain `postgresql://` URL). The benchmark needs it
installed by hand — `.venv/bin/pip install psycopg2-binary==2.9.13` — and skips, saying so, without it.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import create_engine, event

from bench.common import bench_app, bench_database_url, bench_token, summary, table, write_result

ORG = "bench-drivers"
ENTITY = "tickets"
RECORDS = 1_000
ROUNDS, PER_ROUND = 10, 200
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "status": {"type": "string", "enum": ["open", "closed"]},
    "priority": {"type": "int"}, "due": {"type": "date"}, "tags": {"type": "array", "items": {"type": "string"}}}}


def libpq_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def app_statements(app) -> tuple[tuple[str, dict], tuple[str, dict]]:
    """(page, one row): the SQL and parameters the app sends for the two requests."""
    from app.db import PRODUCT_PLACEHOLDER, db, schema_for
    from app.entities.reads import _GET_RECORD

    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token(ORG)}"}
    base = "/api/v1/entities"
    if client.get(f"{base}/definitions/{ENTITY}", headers=headers).status_code == 404:
        resp = client.post(f"{base}/definitions", json={"name": ENTITY, "schema": SCHEMA}, headers=headers)
        assert resp.status_code == 201, resp.get_json()
        records = [{"name": f"ticket {i}", "fields": {
            "title": f"Printer on floor {i % 9} jams", "status": "open" if i % 3 else "closed",
            "priority": i % 5, "due": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}", "tags": ["ops", f"t{i % 7}"]}}
            for i in range(RECORDS)]
        resp = client.post(f"{base}/{ENTITY}/records/bulk/create", json={"records": records}, headers=headers)
        assert resp.status_code in (200, 201), resp.get_json()
    with app.app_context():
        engine = db.engine
    seen: list[tuple[str, dict]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _executemany):
        seen.append((statement, dict(parameters)))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        resp = client.post(f"{base}/{ENTITY}/records/query", json={"query": {"pageSize": 20}}, headers=headers)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert resp.status_code == 200 and len(resp.get_json()["records"]) == 20, resp.get_json()
    page = next((s, p) for s, p in seen if "entity_records" in s and "LIMIT" in s)
    record_id = resp.get_json()["records"][0]["id"]
    compiled = _GET_RECORD.compile(dialect=engine.dialect, render_schema_translate=True,
                                   schema_translate_map={PRODUCT_PLACEHOLDER: schema_for("default")})
    one = (str(compiled), {**compiled.params, "record_id": record_id, "org": ORG, "entity_name": ENTITY})
    return page, one


def _session_settings(cursor, app) -> None:
    """What the app's pool sets on every connection (app.db.make_engine)."""
    cursor.execute(f"SET statement_timeout = {int(app.config.get('DB_STATEMENT_TIMEOUT_MS', 30000))}")
    cursor.execute(f"SET plan_cache_mode = {app.config.get('DB_PLAN_CACHE_MODE', 'force_custom_plan')}")


def raw_runners(url: str, app, statement: tuple[str, dict]) -> tuple[dict, list]:
    import psycopg
    import psycopg2

    sql, params = statement
    prepared = psycopg.connect(url, autocommit=True)  # prepare_threshold 5: the app's setting (the default)
    unprepared = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    legacy = psycopg2.connect(url)
    legacy.autocommit = True
    for conn in (prepared, unprepared, legacy):
        with conn.cursor() as cur:
            _session_settings(cur, app)

    def runner(conn):
        def run():
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        return run

    return {"psycopg 3 (prepares after 5 runs)": runner(prepared), "psycopg 3, never prepared": runner(unprepared),
            "psycopg2-binary": runner(legacy)}, [prepared, unprepared, legacy]


def sqlalchemy_runners(url: str, app, statement: tuple[str, dict]) -> tuple[dict, list]:
    sql, params = statement
    engines = {"SQLAlchemy + psycopg 3": create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1)),
               "SQLAlchemy + psycopg2": create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))}
    runners, connections = {}, []
    for name, engine in engines.items():
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with conn.connection.dbapi_connection.cursor() as cur:
            _session_settings(cur, app)
        connections.append(conn)
        runners[name] = (lambda c: lambda: c.exec_driver_sql(sql, params).fetchall())(conn)
    return runners, connections


def measure(runners: dict) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Wall-clock samples (ms) per configuration, and this process's CPU time per call (µs): the
    driver's own work (sending, decoding rows), which moves far less with the machine's load."""
    rows = {name: run() for name, run in runners.items()}
    first = next(iter(rows.values()))
    assert all(len(r) == len(first) for r in rows.values()), {k: len(v) for k, v in rows.items()}
    for _ in range(10):  # past psycopg's prepare threshold everywhere before timing
        for run in runners.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, float] = dict.fromkeys(runners, 0.0)
    for _ in range(ROUNDS):
        for name, run in runners.items():
            out = samples[name]
            cpu_start = time.process_time()
            for _ in range(PER_ROUND):
                start = time.perf_counter()
                run()
                out.append((time.perf_counter() - start) * 1000)
            cpu[name] += time.process_time() - cpu_start
    return samples, {name: seconds * 1e6 / (ROUNDS * PER_ROUND) for name, seconds in cpu.items()}


def main() -> str:
    try:
        import psycopg2
    except ImportError:
        message = ("bench drivers skipped: psycopg2-binary is not installed (it is not a project dependency). "
                   "Install it to compare: .venv/bin/pip install psycopg2-binary==2.9.13")
        print(message, flush=True)
        return message
    import psycopg

    app = bench_app()
    url = libpq_url(bench_database_url())
    page, one = app_statements(app)
    rows = []
    for label, statement in (("page: count + 20 records", page), ("one record by id", one)):
        raw, raw_conns = raw_runners(url, app, statement)
        orm, orm_conns = sqlalchemy_runners(url, app, statement)
        try:
            samples, cpu = measure({**raw, **orm})
        finally:
            for conn in raw_conns + orm_conns:
                conn.close()
        for name, values in samples.items():
            s = summary(values)
            ref_name = "SQLAlchemy + psycopg2" if name.startswith("SQLAlchemy") else "psycopg2-binary"
            ref = summary(samples[ref_name])["p50"]
            rows.append([label, name, s["p50"], s["p99"], s["p50"] / ref, cpu[name], cpu[name] / cpu[ref_name],
                         s["n"]])
    body = table(["statement", "driver", "p50 ms", "p99 ms", "p50 / psycopg2", "client CPU µs/call",
                  "CPU / psycopg2", "n"], rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"psycopg {psycopg.__version__} (libpq wrapper: {psycopg.pq.__impl__}), "
             f"psycopg2 {psycopg2.__version__.split()[0]}, PostgreSQL embedded "
             f"(local Unix socket). {RECORDS} records in the definition; {ROUNDS} interleaved rounds of {PER_ROUND} "
             f"runs per configuration. Ratios compare with psycopg2 on the same path (driver alone, or through "
             f"SQLAlchemy). Client CPU: this process's CPU time per call (the driver's own work, steadier than "
             f"wall time under load). Load average at the end: {load}. The page statement is the one the app "
             "sent (captured from the engine); the single-row one is `app.entities.reads._GET_RECORD` as "
             "`db.read_first` renders it.")
    return write_result("drivers", "PostgreSQL drivers: psycopg 3 against psycopg2-binary", body, notes)


if __name__ == "__main__":
    main()
