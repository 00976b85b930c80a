"""PostgreSQL's side of the entity query path (issue 25): the statements the app sends for the peers
bench's questions, their plans and the backend's CPU per execution, beside the plain SQL Directus
runs on its own table.

    .venv/bin/python -m bench.pg_entities [N] [--explain] [--sql] [--directus] [--repeated] [--only NAME,...]
        [--dump FILE]

On the entity benchmark's data set (bench.bench_entities builds it on first use): each question of
bench.cpu_entities ((a)-(e), the count, the record GET) is asked once through the app (Flask test
client) with its statements captured (a cached definition: the statements of a warm request), then
those very statements (SQL and parameters) are run N times each (200) on one psycopg connection set
up as the app's pool sets up its connections (plan_cache_mode, statement timeout; prepared after
psycopg's threshold, as in the app), interleaved, and the backend's CPU time per execution is read
from /proc/<backend pid>/schedstat (p50 and mean, ms). `--explain`: EXPLAIN (ANALYZE, BUFFERS, SUMMARY) of
each. `--directus`: the same questions as Directus asks them (knex: count + page, unnamed
statements, custom plans) on a copy of the rows in Directus's layout with the indexes the peers bench
gives it (`peers_scratch.deals` in the bench database: no Directus needed), measured the same way
(its core statements only: whatever else Directus sends per request is not in them). `--repeated`: beside them,
the same statements as the app runs a read repeated with the same values (app.db._literal_sql: the
values written in, prepared; planned once per connection). `--dump FILE`: the captured statements and
parameters, pickled (to replay variants of them).
"""

from __future__ import annotations

import os
import pickle
import statistics
import sys

import psycopg

from bench.bench_entities import BIG_ORG, COUNT_FILTER, ENTITY, QUERIES, SCHEMA, bench_setup, psycopg_url
from bench.bench_peers import COLUMNS, INDEXES

SCRATCH = "peers_scratch"
_TEXT = ("name", "title", "description", "status", "priority", "owner_email")
_SELECT = ", ".join(f'"deals"."{c.strip()}"' for c in COLUMNS.split(","))
# Directus 12's SQL for the peers bench's questions (knex, pg driver: parameters bound, unnamed statements)
DIRECTUS_SQL = {
    "(a)": ('"deals"."status" = %s', ["open"], '"deals"."close_date" DESC'),
    "(b)": ('"deals"."amount" >= %s AND "deals"."amount" < %s', [1000, 1500], '"deals"."created_at" DESC'),
    "(c)": ('LOWER("deals"."title") LIKE %s', ["%zephyr%"], '"deals"."created_at" DESC'),
    "(d)": ("(" + " OR ".join(f'LOWER("deals"."{c}") LIKE %s' for c in _TEXT) + ")", ["%quantum%"] * len(_TEXT),
            '"deals"."created_at" DESC'),
    "(e)": ('("deals"."amount" >= %s AND "deals"."amount" < %s AND "deals"."labels" LIKE %s)',
            [1000, 1500, "%red%"], '"deals"."created_at" DESC'),
}


def directus_statements(key: str, record_id: str) -> list[tuple[str, list]]:
    if key == "count":
        return [('SELECT count(*) AS "count" FROM "deals" WHERE ("deals"."status" = %s AND '
                 '"deals"."priority" = %s AND "deals"."is_hot" = %s)', ["won", "high", True])]
    if key == "GET":
        return [(f'SELECT {_SELECT} FROM "deals" WHERE "deals"."id" = %s LIMIT %s', [record_id, 1])]
    where, params, order = DIRECTUS_SQL[key]
    return [(f'SELECT {_SELECT} FROM "deals" WHERE {where} ORDER BY {order} LIMIT %s', [*params, 20]),
            (f'SELECT count(*) AS "count" FROM "deals" WHERE {where}', params)]


def ensure_scratch(conn, definition_id: str) -> None:
    """Directus's table (the columns its API creates for the peers bench's fields) with the big org's
    rows and the peers bench's indexes, in schema `peers_scratch` of the bench database."""
    if conn.execute(f"SELECT to_regclass('{SCRATCH}.deals') IS NOT NULL").fetchone()[0]:
        return
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCRATCH}")
    conn.execute(f"""CREATE TABLE {SCRATCH}.deals (id uuid PRIMARY KEY, name varchar(255), title varchar(255),
        description text, status varchar(255), priority varchar(255), amount numeric(10, 2), quantity integer,
        close_date date, last_contact timestamp, owner_email varchar(255), labels text, is_hot boolean,
        created_at timestamp)""")
    conn.execute(f"""INSERT INTO {SCRATCH}.deals ({COLUMNS})
        SELECT id::uuid, name, fields->>'title', fields->>'description', fields->>'status',
            fields->>'priority', (fields->>'amount')::numeric(10, 2), (fields->>'quantity')::int,
            (fields->>'close_date')::date, (fields->>'last_contact')::timestamptz, fields->>'owner_email',
            NULLIF(array_to_string(ARRAY(SELECT jsonb_array_elements_text(fields->'labels')), ','), ''),
            (fields->>'is_hot')::boolean, created_at
          FROM {SCHEMA}.entity_records WHERE org_id = %s AND entity_id = %s AND is_active""",
                 (BIG_ORG, definition_id))
    for name, ddl in INDEXES.items():
        conn.execute(f"CREATE INDEX {name} ON {SCRATCH}.deals {ddl}")
    conn.execute(f"VACUUM ANALYZE {SCRATCH}.deals")


def get_statement(app, record_id: str) -> tuple[str, dict]:
    """The record GET's statement (app.entities.reads), rendered as db.read_first renders it."""
    from app.db import PRODUCT_PLACEHOLDER
    from app.entities import reads

    with app.app_context():
        from app.extensions import db

        compiled = reads._GET_RECORD.compile(dialect=db.engine.dialect, render_schema_translate=True,
                                             schema_translate_map={PRODUCT_PLACEHOLDER: SCHEMA})
    return str(compiled), {**compiled.params, "record_id": record_id, "org": BIG_ORG, "entity_name": ENTITY}


def backend_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as fh:
        return int(fh.read().split()[0])


def main() -> None:
    args = sys.argv[1:]
    n = int(next((a for a in args if a.isdigit()), "200"))
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    url, app, ids, capture, client, headers = bench_setup()
    with psycopg.connect(psycopg_url(url)) as conn:
        record_id = conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active "
                                 "ORDER BY id LIMIT 1", (BIG_ORG,)).fetchone()[0]
    calls = {key[:3]: (lambda p=params: client.post(f"/api/v1/entities/{ENTITY}/records/query",
                                                    json={"query": p}, headers=headers))
             for key, params in QUERIES.items()}
    calls["count"] = lambda: client.post(f"/api/v1/entities/{ENTITY}/records/count", json={"filters": COUNT_FILTER},
                                         headers=headers)
    calls["GET"] = lambda: client.get(f"/api/v1/entities/{ENTITY}/records/{record_id}", headers=headers)
    if only:
        calls = {k: v for k, v in calls.items() if k in only}
    statements: dict[str, list] = {}
    for name, fn in calls.items():
        fn()
        got = capture.during(fn)
        statements[name] = [(s, p) for s, p in got if not s.lstrip().upper().startswith(("SET", "SHOW"))]
    if "GET" in statements and not statements["GET"]:  # db.read_first's driver path: no engine events
        statements["GET"] = [get_statement(app, record_id)]
    if "--dump" in args:
        with open(args[args.index("--dump") + 1], "wb") as fh:
            pickle.dump(statements, fh)
    timeout = app.config.get("DB_STATEMENT_TIMEOUT_MS", 30000)
    mode = app.config.get("DB_PLAN_CACHE_MODE", "force_custom_plan")
    runs: dict[tuple[str, str], list] = {}
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        conn.execute(f"SET statement_timeout = {timeout}; SET plan_cache_mode = {mode}")
        if "--directus" in args:
            ensure_scratch(conn, ids[BIG_ORG])
        for name, stmts in statements.items():
            runs["ours", name] = stmts
            if "--repeated" in args:
                from app.db import _literal_sql

                runs["repeated", name] = [(_literal_sql(conn, s, p), None) for s, p in stmts]
            if "--sql" in args:
                for s, p in stmts:
                    print(f"--- {name}\n{s}\n{p}\n")
            if "--directus" in args:
                runs["Directus", name] = directus_statements(name, record_id)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if "--directus" in args:
            conn.execute(f"SET search_path = {SCRATCH}, public")
        if "--explain" in args:
            for (side, name), stmts in runs.items():
                for s, p in stmts:
                    if side == "Directus":
                        conn.execute(f"SET search_path = {SCRATCH}, public")
                    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, SUMMARY) " + s, p).fetchall()
                    conn.execute("RESET search_path")
                    print(f"=== {side} {name}\n" + "\n".join(r[0] for r in plan) + "\n")
        spent: dict[tuple[str, str], list[float]] = {k: [] for k in runs}

        def run(side: str, stmts: list) -> None:
            if side == "Directus":
                conn.execute(f"SET search_path = {SCRATCH}, public")
            for s, p in stmts:  # Directus (knex, pg): unnamed statements, never prepared
                cur = conn.execute(s, p, prepare=False if side == "Directus" else True if p is None else None)
                if cur.description is not None:
                    cur.fetchall()
            if side == "Directus":
                conn.execute("RESET search_path")

        for _ in range(10):
            for (side, _name), stmts in runs.items():
                run(side, stmts)
        keys = list(runs)
        for i in range(n):
            for key in (keys if i % 2 == 0 else keys[::-1]):
                before = backend_ns(pid)
                run(key[0], runs[key])
                spent[key].append((backend_ns(pid) - before) / 1e6)
        # the search_path SET/RESET around Directus's statements: measured alone and subtracted
        overhead = []
        for _ in range(n):
            before = backend_ns(pid)
            conn.execute(f"SET search_path = {SCRATCH}, public")
            conn.execute("RESET search_path")
            overhead.append((backend_ns(pid) - before) / 1e6)
    base = statistics.median(overhead)
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; {n} runs each; backend CPU ms "
          f"per execution of the question's statements (p50 / mean)")
    for name in statements:
        line = f"{name:6s}"
        for side in ("ours", "repeated", "Directus"):
            if (side, name) in spent:
                s = [x - (base if side == "Directus" else 0) for x in spent[side, name]]
                line += f"  {side} {statistics.median(s):5.2f} / {statistics.mean(s):5.2f}"
        print(line)


if __name__ == "__main__":
    main()
