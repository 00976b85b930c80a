"""Entity store: record query latency against the same SQL run straight through psycopg, count, and
bulk create against a raw COPY.

Data set (generated once with COPY, reused by later runs): 200 000 records of a 11-field definition
over 20 orgs; org `bench-big` holds 100 000 of them, the other 19 share the rest.

(1) Query latency, p50/p99, through the app in-process (Flask test client: routing, JWT auth, tenancy,
    marshmallow, the filter compiler, SQLAlchemy, JSON) for
    (a) equality + sort by a date field, page 1 of 20; (b) a number range; (c) `$contains` on a
    string; (d) `$search`. The floor is the very SQL the app sent for that request (captured from
    the engine: count + page) replayed through one psycopg connection, interleaved with the app runs.
(2) Count with a selective filter (p50, app vs floor).
    Next to (1) and (2), in the same rounds: the Flask layer alone (an authenticated GET /api/v1/me through
    the same test client and token) and (app − layer)/typed, the query engine's ratio without it.
(3) Bulk create of 5 000 records per request (validation included) in records/s, against a raw
    COPY of the same final rows (tsvectors precomputed outside the timing) into the same table, and
    against a raw COPY of the same rows into the hand-indexed typed table below (deleted again after
    each round); the same in CPU ms (this process + the local database server's processes), which
    moves far less with the machine's load. `BENCH_ENTITIES_ONLY=bulk` runs this part alone.
EXPLAIN (ANALYZE) of each floor statement is written below the table.

The second floor is the one a user would otherwise choose: the big org's 100 000 rows in a plain typed
table (`bench_typed.deals`: one column per field, title/description text, amount numeric, close_date
date, last_contact timestamptz, labels text[], a stored tsvector) with the ordinary indexes a
Directus/PostgREST user would add (b-tree status+close_date, amount, created_at; pg_trgm GIN on title;
GIN on the tsvector; status+priority+is_hot; GIN on labels), queried with the same page and the same exact count.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import event

from bench.common import bench_app, bench_database_url, bench_token, summary, table, timed, write_result

SCHEMA = "product_default"
BIG_ORG, BULK_ORG = "bench-big", "bench-bulk"
ORGS = [BIG_ORG] + [f"bench-org-{i:02d}" for i in range(19)]
TOTAL, BIG = 200_000, 100_000
ENTITY = "deals"
STATUSES = ["open", "won", "lost", "pending", "review"]
PRIORITIES = ["low", "medium", "high"]
LABELS = ["red", "green", "blue", "gold"]
WORDS = ("market growth pipeline renewal contract upgrade service cloud storage network partner region "
         "quarter budget pilot expansion support license hardware training audit migration security "
         "analytics platform mobile retail energy logistics finance health media").split()
RARE = ["quantum", "zephyr", "alpha"]  # each in ~1% of titles/descriptions
DEFINITION = {"type": "object", "required": ["title"], "properties": {
    "title": {"type": "string", "maxLength": 200}, "description": {"type": "text"},
    "status": {"type": "dropdown", "options": STATUSES}, "priority": {"type": "dropdown", "options": PRIORITIES},
    "amount": {"type": "float", "minimum": 0}, "quantity": {"type": "int"}, "close_date": {"type": "date"},
    "last_contact": {"type": "datetime"}, "owner_email": {"type": "email"},
    "labels": {"type": "multiselect", "options": LABELS}, "is_hot": {"type": "bool"}}}
QUERIES = {
    "(a) status = open, sort close_date desc, page 1/20": {
        "filters": {"status": "open"}, "sortBy": "close_date", "sortOrder": -1, "pageSize": 20},
    "(b) amount in [1000, 1500)": {"filters": {"amount": {"$gte": 1000, "$lt": 1500}}, "pageSize": 20},
    "(c) title $contains 'zephyr'": {"filters": {"title": {"$contains": "zephyr"}}, "pageSize": 20},
    "(d) $search 'quantum'": {"filters": {"$search": "quantum"}, "pageSize": 20},
    "(e) amount in [1000, 1500) and labels has red (a list field)": {
        "filters": {"amount": {"$gte": 1000, "$lt": 1500}, "labels": "red"}, "pageSize": 20},
}
COUNT_FILTER = {"status": "won", "priority": "high", "is_hot": True}
TYPED = "bench_typed.deals"
TYPED_COLUMNS = "id, name, title, description, status, priority, amount, quantity, close_date, last_contact, " \
                "owner_email, labels, is_hot, tags, created_at, updated_at"
# (count, page) on the typed table for each QUERIES entry, then the count query
TYPED_QUERIES = {
    "(a)": ("status = 'open'", "close_date DESC NULLS LAST, id DESC"),
    "(b)": ("amount >= 1000 AND amount < 1500", "created_at DESC, id DESC"),
    "(c)": ("title ILIKE '%zephyr%'", "created_at DESC, id DESC"),
    "(d)": ("search_vector @@ websearch_to_tsquery('english', 'quantum')",
            "ts_rank_cd(search_vector, websearch_to_tsquery('english', 'quantum')) DESC, id"),
    "(e)": ("amount >= 1000 AND amount < 1500 AND labels @> ARRAY['red']", "created_at DESC, id DESC"),
}
TYPED_COUNT = "status = 'won' AND priority = 'high' AND is_hot"
ROUNDS, PER_ROUND = 5, 20
READING = """### Reading the plans

- The big definition has a ready typed projection (app.entities.projection: `erp_…`, one typed column
  per scalar field, only its active records, kept exact by statement-level triggers on
  entity_records). Every query below is covered by it, so the app compiles it against the
  projection's columns: the count reads the projection alone, the page takes its 20 ids (and sort
  keys) from the projection, then the 20 records from entity_records by primary key (20 index probes).
- (a) The count is an index-only scan of the projection's shared b-tree over its few-valued fields
  (booleans and dropdowns, fewest values first: is_hot, priority, status; PostgreSQL 18 skips over the
  leading columns the filter leaves out). The page walks the projection's `close_date` b-tree (newest
  first) and stops after 20 `status = open` rows; the typed table sorts all 20k matches (top-N
  heapsort), which is why the app beats it here.
- (b) The count is an index-only scan of the projection's `amount` b-tree, as on the typed table; the
  page walks `(created_at, id)` backwards, as the typed table does.
- (c) `$contains`: the count is a bitmap scan of the title's substring table (`ers_…`: the record id and
  the folded title, with its own trigram GIN), its 1 000 candidates rechecked on ~90-byte rows (643
  heap pages; the typed table rechecks them on its 927); the page walks the projection's `(created_at,
  id)` b-tree backwards until 20 titles match, then the 20 records.
- (d) `$search`: a bitmap scan of the projection's tsvector GIN, `ts_rank_cd` + top-N.
- (e) The list field is projected too (a `text[]` column of the array's string elements, GIN):
  `labels @> ARRAY['red']` and the amount range are both answered on the projection (the planner
  combines the `amount` b-tree and the labels GIN, or takes one and filters), as on the typed table
  with its own GIN on `labels`; then the 20 records by primary key.
- count: all three equalities are the shared b-tree's columns: an index-only scan, as on the typed
  table (whose index is that very (status, priority, is_hot)).
- The 'fallback path' columns show the same queries compiled against entity_records, as a query the
  projection does not cover would be (`$exists`, lists, JSON, long text, `$similar`…): once the
  projection is ready the definition keeps no index of its own there (the generic indexes serve it,
  as they serve a small definition), so those are slow on 100 000 records.
- The app's overhead per request: the Flask layer every request pays (the 'Flask layer' column: an
  authenticated `GET /api/v1/me` in the same rounds), the definition read (one round trip, on the
  connection the count and page then use), the body's validation (a fast lane in front of
  marshmallow), filter compilation (the WHERE expression and its SQLAlchemy cache key), the count and
  the page (their SQL rendered once per statement shape, `db.execute_shaped`), record shaping and the
  JSON answer. It grows with the machine's load far more than the statements do (each of the app's
  round trips waits for the PostgreSQL backend to be scheduled; the load average is printed below).
  '(app − layer)/typed' is the query engine's ratio without the Flask layer; own SQL/typed is the ratio of
  the statements themselves."""


def psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def fake_fields(rng: random.Random, base: datetime) -> tuple[str, dict]:
    words = rng.sample(WORDS, 3)
    if rng.random() < 0.01:
        words[1] = "zephyr"
    title = " ".join(words).title()
    description = " ".join(rng.choices(WORDS, k=12) + (["quantum"] if rng.random() < 0.01 else []))
    fields = {
        "title": title, "description": description, "status": rng.choice(STATUSES),
        "priority": rng.choice(PRIORITIES), "amount": round(rng.uniform(0, 10_000), 2),
        "quantity": rng.randint(1, 500),
        "close_date": (base + timedelta(days=rng.randint(0, 730))).date().isoformat(),
        "last_contact": (base + timedelta(minutes=rng.randint(0, 10**6))).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "owner_email": f"owner{rng.randint(1, 200)}@example.com",
        "labels": rng.sample(LABELS, rng.randint(0, 2)), "is_hot": rng.random() < 0.2,
    }
    return title, fields


def ensure_dataset(app, url: str) -> dict[str, str]:
    """Definitions (through the API) and 200k records (COPY); returns org → definition id."""
    client = app.test_client()
    ids = {}
    for org in [*ORGS, BULK_ORG]:
        headers = {"Authorization": f"Bearer {bench_token(org)}"}
        got = client.get(f"/api/v1/entities/definitions/{ENTITY}", headers=headers)
        if got.status_code == 404:
            created = client.post("/api/v1/entities/definitions", headers=headers,
                                  json={"name": ENTITY, "schema": DEFINITION})
            assert created.status_code == 201, created.get_json()
            ids[org] = created.get_json()["id"]
        else:
            ids[org] = got.get_json()["definition"]["id"]
    with psycopg.connect(psycopg_url(url)) as conn:
        have = conn.execute(f"SELECT count(*) FROM {SCHEMA}.entity_records WHERE org_id = %s",
                            (BIG_ORG,)).fetchone()[0]
        if have >= BIG:
            return ids
        start = time.perf_counter()
        conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id LIKE 'bench-%%'")
        conn.execute("CREATE TEMP TABLE staging (id text, org_id text, entity_id text, name text, fields jsonb, "
                     "doc text, created_at timestamptz)")
        rng = random.Random(7)
        base = datetime(2025, 1, 1, tzinfo=UTC)
        per_small = (TOTAL - BIG) // (len(ORGS) - 1)
        with conn.cursor().copy("COPY staging FROM STDIN") as copy:
            copy.set_types(["text", "text", "text", "text", "jsonb", "text", "timestamptz"])
            for org in ORGS:
                for i in range(BIG if org == BIG_ORG else per_small):
                    title, fields = fake_fields(rng, base)
                    doc = " ".join([title, fields["title"], fields["description"], fields["status"],
                                    fields["priority"], fields["owner_email"], *fields["labels"]])
                    copy.write_row((str(uuid.uuid4()), org, ids[org], title, Jsonb(fields), doc,
                                    base + timedelta(seconds=i)))
        conn.execute(f"""INSERT INTO {SCHEMA}.entity_records (id, org_id, entity_id, name, fields, tags,
                         search_vector, is_active, version, created_at, updated_at, created_by, updated_by)
                         SELECT id, org_id, entity_id, name, fields, '{{}}', to_tsvector('english', doc), true, 1,
                                created_at, created_at, 'bench', 'bench' FROM staging""")
        conn.commit()
        conn.autocommit = True
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.entity_records")
        print(f"generated {TOTAL} records in {time.perf_counter() - start:.1f}s", flush=True)
    return ids


def ensure_typed_table(conn, definition_id: str) -> None:
    """The big org's rows as a hand-indexed typed table (the floor a user would otherwise choose)."""
    exists = conn.execute("SELECT to_regclass('bench_typed.deals') IS NOT NULL").fetchone()[0]
    if exists and conn.execute(f"SELECT count(*) FROM {TYPED}").fetchone()[0] >= BIG:
        if conn.execute("SELECT to_regclass('bench_typed.deals_labels_idx') IS NULL").fetchone()[0]:
            conn.execute(f"CREATE INDEX deals_labels_idx ON {TYPED} USING gin (labels)")  # (an older data set)
            conn.execute(f"VACUUM ANALYZE {TYPED}")
        return
    conn.execute("DROP SCHEMA IF EXISTS bench_typed CASCADE")
    conn.execute("CREATE SCHEMA bench_typed")
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    conn.execute(f"""CREATE TABLE {TYPED} (
        id text PRIMARY KEY, name text NOT NULL, title text, description text, status text, priority text,
        amount numeric, quantity integer, close_date date, last_contact timestamptz, owner_email text,
        labels text[], is_hot boolean, tags text[], search_vector tsvector, created_at timestamptz,
        updated_at timestamptz)""")
    conn.execute(f"""INSERT INTO {TYPED}
        SELECT id, name, fields->>'title', fields->>'description', fields->>'status', fields->>'priority',
               (fields->>'amount')::numeric, (fields->>'quantity')::int, (fields->>'close_date')::date,
               (fields->>'last_contact')::timestamptz, fields->>'owner_email',
               ARRAY(SELECT jsonb_array_elements_text(fields->'labels')), (fields->>'is_hot')::boolean, tags,
               search_vector, created_at, updated_at
          FROM {SCHEMA}.entity_records WHERE org_id = %s AND entity_id = %s AND is_active""",
                 (BIG_ORG, definition_id))
    for ddl in ("(status, close_date)", "(amount)", "(created_at)", "USING gin (title gin_trgm_ops)",
                "USING gin (search_vector)", "(status, priority, is_hot)", "USING gin (labels)"):
        conn.execute(f"CREATE INDEX ON {TYPED} {ddl}")
    conn.execute(f"VACUUM ANALYZE {TYPED}")


def typed_statements(key: str | None) -> list[tuple[str, None]]:
    if key is None:
        return [(f"SELECT count(*) FROM {TYPED} WHERE {TYPED_COUNT}", None)]
    where, order = TYPED_QUERIES[key]
    return [(f"SELECT count(*) FROM {TYPED} WHERE {where}", None),
            (f"SELECT {TYPED_COLUMNS} FROM {TYPED} WHERE {where} ORDER BY {order} LIMIT 20", None)]


TYPED_FIELDS = ("title", "description", "status", "priority", "amount", "quantity", "close_date", "last_contact",
                "owner_email", "labels", "is_hot")
TYPED_ROUTE = "/api/v1/bench-typed"


def register_typed_route(app) -> None:
    """A bench-only route on the bench's app: the typed-table statements of a query (`/<key>`, e.g. `(b)`)
    or of the count (`/count`) served behind the same Flask layer as the app's routes (token check with
    the same scope, hooks, the request's db session in autocommit, the same JSON shape through jsonify):
    the floor a typed table served by this very app would have."""
    from decimal import Decimal

    from flask import jsonify
    from sqlalchemy import text

    from app.extensions import Blueprint, db
    from app.wire import iso

    def value(v):
        if isinstance(v, Decimal):
            return float(v)
        if isinstance(v, datetime):
            return iso(v)
        return v.isoformat() if hasattr(v, "isoformat") else v

    @Blueprint.requires("read:entities")
    def typed(key: str):
        db.reads_only()
        statements = typed_statements(None if key == "count" else key)
        total = db.session.execute(text(statements[0][0])).scalar()
        if len(statements) == 1:
            return jsonify(total)
        records = [{"id": r["id"], "entityId": None, "name": r["name"],
                    "fields": {f: value(r[f]) for f in TYPED_FIELDS if r[f] is not None}, "tags": r["tags"] or [],
                    "metadata": None, "createdAt": iso(r["created_at"]), "updatedAt": iso(r["updated_at"]),
                    "createdBy": None, "updatedBy": None, "isActive": True, "version": 1}
                   for r in db.session.execute(text(statements[1][0])).mappings()]
        pages = -(-total // 20)
        return jsonify({"records": records, "totalCount": total, "currentPage": 1, "pageSize": 20, "totalPages": pages,
                        "hasNextPage": pages > 1, "hasPreviousPage": False, "nextCursor": None})

    app.add_url_rule(f"{TYPED_ROUTE}/<key>", "bench_typed", typed, methods=["POST"])


def typed_app_runner(client, headers, key: str):
    """The typed statements behind the app's Flask layer (register_typed_route)."""
    def run():
        resp = client.post(f"{TYPED_ROUTE}/{key}", json={}, headers=headers)
        assert resp.status_code == 200, resp.get_data()
    return run


class Capture:
    """Collects the statements the app sends during `during(fn)`: it listens to the engine's cursor events
    only then (a listener changes the app's path: app.db.Database._reads_raw)."""

    def __init__(self, engine):
        self.engine, self.statements = engine, []

    def _seen(self, _conn, _cursor, statement, parameters, _context, _executemany):
        self.statements.append((statement, parameters))

    def during(self, fn):
        self.statements = []
        event.listen(self.engine, "before_cursor_execute", self._seen)
        try:
            fn()
        finally:
            event.remove(self.engine, "before_cursor_execute", self._seen)
        return list(self.statements)


def measure(*calls) -> list[list[float]]:
    """Samples (ms) of each call, interleaved in rounds after a warm-up."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(3):
        for fn in calls:
            fn()
    for _ in range(ROUNDS):
        for fn, out in zip(calls, samples, strict=True):
            for _ in range(PER_ROUND):
                start = time.perf_counter()
                fn()
                out.append((time.perf_counter() - start) * 1000)
    return samples


def floor_runner(conn, statements):
    def run():
        with conn.cursor() as cur:
            for statement, params in statements:
                cur.execute(statement, params, prepare=False)  # a custom plan every time: the best case
                cur.fetchall()
    return run


def typed_runner(conn, statements):
    def run():
        with conn.cursor() as cur:
            for statement, _ in statements:
                cur.execute(statement)
                cur.fetchall()
    return run


def record_statement(statement: str) -> bool:
    """A statement over the records (entity_records or the definition's projection `erp_…`)."""
    return "entity_records" in statement or "erp_" in statement


def explain(conn, statements) -> str:
    lines = []
    for statement, params in statements:
        if not record_statement(statement) and TYPED not in statement \
                or "entity_definitions" in statement.split("FROM", 1)[0]:  # a definition read
            continue
        plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + statement,
                                           params).fetchall()]
        lines.append("\n".join("    " + p for p in plan[:24]))
    return "\n\n".join(lines)


def bench_deep_pages(app, client, headers, conn, definition_id: str) -> list[list]:
    """Page 1 and page 5 000 of the unfiltered listing, by `page` (OFFSET) and by `cursor` (keyset)."""
    from app.entities import cursor as cursors

    last = conn.execute(f"SELECT created_at, id FROM {SCHEMA}.entity_records WHERE org_id = %s AND entity_id = %s "
                        "AND is_active ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1",
                        (BIG_ORG, definition_id, 4999 * 20 - 1)).fetchone()
    with app.app_context():  # the nextCursor page 4 999 would have returned
        deep = cursors.encode(BIG_ORG, definition_id, cursors.query_digest({"pageSize": 20}),
                              cursors.Position(5000, last[0], last[1]))
    variants = {"page 1 (`page: 1`)": {"page": 1}, "page 5 000 (`page: 5000`)": {"page": 5000},
                "page 1 (no cursor)": {}, "page 5 000 (`cursor`)": {"cursor": deep}}
    out = []
    for label, extra in variants.items():
        cells = [label]
        for prefer in (None, "count=planned"):
            def call(extra=extra, prefer=prefer):
                resp = client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": {
                    "pageSize": 20, **extra}}, headers={**headers, **({"Prefer": prefer} if prefer else {})})
                assert resp.status_code == 200 and len(resp.get_json()["records"]) == 20, resp.get_json()
            cells.append(summary(timed(call, 40, warmup=5))["p50"])
        out.append(cells)
    return out


def result_row(label: str, app_ms, old_app_ms, floor_ms, old_floor_ms, typed_ms, layer_ms, typed_app_ms) -> list:
    a, oa, f, of, t, la, ta = (summary(x) for x in (app_ms, old_app_ms, floor_ms, old_floor_ms, typed_ms, layer_ms,
                                                    typed_app_ms))
    return [label, a["p50"], a["p99"], oa["p50"], f["p50"], of["p50"], t["p50"], a["p50"] / t["p50"],
            f["p50"] / t["p50"], of["p50"] / t["p50"], la["p50"], (a["p50"] - la["p50"]) / t["p50"], ta["p50"],
            a["p50"] / ta["p50"]]


def layer_runner(client, headers):
    """The app's fixed layer alone: an authenticated trivial call (GET /api/v1/me) through the same
    test client and token (routing, request/response objects, token check, hooks, JSON envelope)."""
    def run():
        resp = client.get("/api/v1/me", headers=headers)
        assert resp.status_code == 200
    return run


def without_projection(fn):
    """`fn` as the app ran it before the typed projection: every query compiled against entity_records."""
    from app.entities import projection

    def run():
        original = projection.resolver_for
        projection.resolver_for = lambda *a, **k: None
        try:
            return fn()
        finally:
            projection.resolver_for = original
    return run


def bulk_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    return [{"name": title, "fields": fields} for title, fields in (fake_fields(rng, base) for _ in range(count))]


def copy_rows(conn, definition_id: str, rows: list[dict], vectors: list[str]) -> float:
    """COPY the final rows (tsvectors computed beforehand) into entity_records; seconds."""
    now = datetime.now(UTC)
    start = time.perf_counter()
    with conn.cursor().copy(f"COPY {SCHEMA}.entity_records (id, org_id, entity_id, name, fields, tags, "
                            "search_vector, is_active, version, created_at, updated_at, created_by, "
                            "updated_by) FROM STDIN") as copy:
        copy.set_types(["text", "text", "text", "text", "jsonb", "text[]", "text", "bool", "int4",
                        "timestamptz", "timestamptz", "text", "text"])
        for row, vector in zip(rows, vectors, strict=True):
            copy.write_row((str(uuid.uuid4()), BULK_ORG, definition_id, row["name"], Jsonb(row["fields"]), [],
                            vector, True, 1, now, now, "bench", "bench"))
    conn.commit()
    return time.perf_counter() - start


def copy_typed_rows(conn, rows: list[dict], vectors: list[str]) -> float:
    """COPY the same rows into the hand-indexed typed table `bench_typed.deals` (the floor a user would
    otherwise choose: one column per field, its 7 indexes), timed with its commit as `copy_rows` is, then
    deleted again (the data set is unchanged); seconds."""
    now = datetime.now(UTC)
    start = time.perf_counter()
    with conn.cursor().copy(f"COPY {TYPED} (id, name, title, description, status, priority, amount, quantity, "
                            "close_date, last_contact, owner_email, labels, is_hot, tags, search_vector, "
                            "created_at, updated_at) FROM STDIN") as copy:
        copy.set_types(["text", "text", "text", "text", "text", "text", "numeric", "int4", "date", "timestamptz",
                        "text", "text[]", "bool", "text[]", "text", "timestamptz", "timestamptz"])
        for row, vector in zip(rows, vectors, strict=True):
            f = row["fields"]
            copy.write_row((str(uuid.uuid4()), row["name"], f["title"], f["description"], f["status"],
                            f["priority"], Decimal(str(f["amount"])), f["quantity"],
                            datetime.fromisoformat(f["close_date"]).date(), datetime.fromisoformat(f["last_contact"]),
                            f["owner_email"], f["labels"], f["is_hot"], [], vector, now, now))
    conn.commit()
    elapsed = time.perf_counter() - start
    conn.execute(f"DELETE FROM {TYPED} WHERE created_at = %s", (now,))
    conn.commit()
    return elapsed


def server_cpu(conn) -> dict[int, int] | None:
    """CPU time (ns, /proc schedstat) of each process of the PostgreSQL server behind `conn` so far,
    when it runs on this machine (the embedded one): on a shared machine CPU time moves far less with
    the load than wall time does. None when the server is elsewhere."""
    try:
        directory = conn.execute("SHOW data_directory").fetchone()[0]
        conn.commit()
        with open(os.path.join(directory, "postmaster.pid")) as fh:
            postmaster = int(fh.readline())
        with open(f"/proc/{postmaster}/task/{postmaster}/children") as fh:
            pids = [postmaster, *(int(p) for p in fh.read().split())]
    except (OSError, ValueError, psycopg.Error):
        conn.rollback()
        return None
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"autovacuum" in fh.read():
                    continue  # cleaning up after earlier rounds' deletes: not this round's work
            with open(f"/proc/{pid}/schedstat") as fh:
                used[pid] = int(fh.read().split()[0])
        except OSError:
            pass  # a process that ended meanwhile
    return used


def cpu_timed(conn, fn) -> tuple[float, float | None]:
    """(wall seconds, CPU ms of this thread + the database server's processes) of fn(). A process that
    started meanwhile counts whole; one that ended meanwhile counts nothing (its last moments are lost)."""
    server, thread = server_cpu(conn), time.thread_time()
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    after = server_cpu(conn)
    if server is None or after is None:
        return wall, None
    spent = sum(ns - server.get(pid, 0) for pid, ns in after.items())
    return wall, (time.thread_time() - thread) * 1000 + spent / 1e6


def bench_bulk(app, client, conn, definition_id) -> dict[str, float]:
    """records/s of the API bulk create and of a raw COPY of the same rows into the same table, in two
    states of the definition, interleaved round by round (the first round warms up):
    `before` = no projection, the per-field indexes on entity_records (the table before projections);
    `after` = the typed projection (its triggers fire) and the reduced index set.
    The index task a bulk create sends is left out (in production it runs in a worker; eager here, it
    would build the projection inside the timed request of the `before` state)."""
    from app.entities import bulk as bulk_module
    from app.entities import indexes, projection
    from app.entities.fieldtypes import compile_definition_schema
    from app.extensions import db

    headers = {"Authorization": f"Bearer {bench_token(BULK_ORG)}"}
    catalog = compile_definition_schema(DEFINITION).catalog
    plan = projection.plan_projection(definition_id, catalog)

    def set_state(projected: bool) -> None:
        conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id = %s", (BULK_ORG,))
        conn.commit()
        with app.app_context():
            engine = db.engine_for("default")
            projection.sync_projection(engine, SCHEMA, definition_id, plan if projected else None)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as ac:
                indexes.sync_indexes(ac, SCHEMA, definition_id, catalog, active_records=1, min_records=1,
                                     concurrently=False, projected=projected)

    seconds = {"before API": 0.0, "before COPY": 0.0, "after API": 0.0, "after COPY": 0.0, "typed COPY": 0.0}
    cpu: dict[str, list[float]] = {key: [] for key in seconds}
    n = 5000
    original = bulk_module.schedule_index_sync
    bulk_module.schedule_index_sync = lambda *a, **k: None
    try:
        for run in range(4):
            for state in ("before", "after"):
                set_state(state == "after")
                rows = bulk_rows(n, seed=100 + run)
                body = json.dumps({"records": rows})
                got = {}

                def create(body=body, got=got):
                    got["resp"] = client.post(f"/api/v1/entities/{ENTITY}/records/bulk/create", data=body,
                                              headers={**headers, "Content-Type": "application/json"})
                elapsed, api_cpu = cpu_timed(conn, create)
                resp = got["resp"]
                assert resp.status_code == 200 and resp.get_json()["count"] == n, resp.get_json()
                docs = [" ".join([r["name"], r["fields"]["title"], r["fields"]["description"], r["fields"]["status"],
                                  r["fields"]["priority"], r["fields"]["owner_email"], *r["fields"]["labels"]])
                        for r in rows]
                vectors = [v for (v,) in conn.execute(
                    "SELECT to_tsvector('english', d)::text FROM unnest(%s::text[]) d", (docs,)).fetchall()]
                copy_elapsed, copy_cpu = cpu_timed(conn, partial(copy_rows, conn, definition_id, rows, vectors))
                typed_elapsed, typed_cpu = cpu_timed(conn, partial(copy_typed_rows, conn, rows, vectors)) \
                    if state == "after" else (0.0, None)
                if run:
                    seconds[f"{state} API"] += elapsed
                    seconds[f"{state} COPY"] += copy_elapsed
                    seconds["typed COPY"] += typed_elapsed
                    for key, value in ((f"{state} API", api_cpu), (f"{state} COPY", copy_cpu),
                                       ("typed COPY", typed_cpu)):
                        if value is not None:
                            cpu[key].append(value)
    finally:
        bulk_module.schedule_index_sync = original
        set_state(True)
        conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id = %s", (BULK_ORG,))
        conn.commit()
    rates = {k: 3 * n / v for k, v in seconds.items()}
    rates.update({f"{k} CPU": statistics.median(v) for k, v in cpu.items() if v})
    return rates


def bench_setup():
    """The migrated bench database with the entity data set, an app on it, a statement capture, a
    test client and the big org's headers (shared by the entity and aggregation benchmarks)."""
    url = bench_database_url()
    app = bench_app(DATABASE_URL=url, DB_STATEMENT_TIMEOUT_MS=120_000)
    register_typed_route(app)
    ids = ensure_dataset(app, url)
    from app.entities.indexes import sync_definition
    from app.extensions import db

    with app.app_context():  # what the index task does after the definition grew (idempotent)
        for org in (BIG_ORG, BULK_ORG):
            sync_definition("default", ids[org])

    headers = {"Authorization": f"Bearer {bench_token(BIG_ORG)}"}
    return url, app, ids, Capture(db.engine), app.test_client(), headers


def bulk_table(rates: dict[str, float]) -> str:
    body = table(["bulk create, 5 000 records per request", "before: no projection, per-field indexes",
                  "after: typed projection, reduced indexes"], [
        ["POST …/records/bulk/create (validation + COPY → INSERT … SELECT), records/s", rates["before API"],
         rates["after API"]],
        ["raw COPY of the same final rows into the same table, records/s", rates["before COPY"],
         rates["after COPY"]],
        ["raw COPY of the same rows into the hand-indexed typed table `bench_typed.deals`, records/s", "",
         rates["typed COPY"]],
        ["ratio API/COPY (same state)", rates["before API"] / rates["before COPY"],
         rates["after API"] / rates["after COPY"]],
        ["ratio API after / COPY before (the table before projections)", "",
         rates["after API"] / rates["before COPY"]],
        ["ratio API after / COPY into the typed table", "", rates["after API"] / rates["typed COPY"]],
    ])
    if "after API CPU" not in rates:
        return body
    cpu = {k: rates[f"{k} CPU"] for k in ("before API", "before COPY", "after API", "after COPY", "typed COPY")}
    return body + "\n\n" + table([
        "the same, CPU ms per 5 000 records (this process + the database server; median of 3)",
        "before", "after"], [
        ["POST …/records/bulk/create", cpu["before API"], cpu["after API"]],
        ["raw COPY into the same table", cpu["before COPY"], cpu["after COPY"]],
        ["raw COPY into the typed table `bench_typed.deals`", "", cpu["typed COPY"]],
        ["ratio COPY before / API after (as the rate ratio above)", "", cpu["before COPY"] / cpu["after API"]],
        ["ratio COPY into the typed table / API after", "", cpu["typed COPY"] / cpu["after API"]],
    ])


def bulk_only() -> str:
    """`BENCH_ENTITIES_ONLY=bulk`: the bulk-create table alone (about a minute: for A/B runs)."""
    url, app, ids, _capture, client, _headers = bench_setup()
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        ensure_typed_table(conn, ids[BIG_ORG])
        conn.autocommit = False
        rates = bench_bulk(app, client, conn, ids[BULK_ORG])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return write_result("entities_bulk", "Entity store benchmark: bulk create", bulk_table(rates),
                        f"Machine load average (1/5/15 min) at the end: {load}.")


def main() -> str:
    if os.environ.get("BENCH_ENTITIES_ONLY") == "bulk":
        return bulk_only()
    url, app, ids, capture, client, headers = bench_setup()
    rows, plans = [], []
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        ensure_typed_table(conn, ids[BIG_ORG])
        for label, params in QUERIES.items():
            def call(params=params):
                resp = client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": params},
                                   headers=headers)
                assert resp.status_code == 200, resp.get_json()
                return resp
            statements = [s for s in capture.during(call) if record_statement(s[0])]
            old_statements = [s for s in capture.during(without_projection(call)) if record_statement(s[0])]
            total = call().get_json()["totalCount"]
            assert without_projection(call)().get_json()["totalCount"] == total
            typed = typed_statements(label[:3])
            samples = measure(call, without_projection(call), floor_runner(conn, statements),
                              floor_runner(conn, old_statements), typed_runner(conn, typed),
                              layer_runner(client, headers), typed_app_runner(client, headers, label[:3]))
            rows.append(result_row(f"{label} — {total} match", *samples))
            plans.append(f"**{label}**\n\n{explain(conn, statements)}\n\ntyped table:\n\n{explain(conn, typed)}")

        def count_call():
            resp = client.post(f"/api/v1/entities/{ENTITY}/records/count", json={"filters": COUNT_FILTER},
                               headers=headers)
            assert resp.status_code == 200
            return resp
        statements = [s for s in capture.during(count_call) if record_statement(s[0])]
        old_statements = [s for s in capture.during(without_projection(count_call)) if record_statement(s[0])]
        matched = count_call().get_json()
        assert without_projection(count_call)().get_json() == matched
        typed = typed_statements(None)
        samples = measure(count_call, without_projection(count_call), floor_runner(conn, statements),
                          floor_runner(conn, old_statements), typed_runner(conn, typed),
                          layer_runner(client, headers), typed_app_runner(client, headers, "count"))
        rows.append(result_row(f"count {json.dumps(COUNT_FILTER)} — {matched}", *samples))
        plans.append(f"**count**\n\n{explain(conn, statements)}\n\ntyped table:\n\n{explain(conn, typed)}")
        deep = bench_deep_pages(app, client, headers, conn, ids[BIG_ORG])
        conn.autocommit = False
        rates = bench_bulk(app, client, conn, ids[BULK_ORG])

    body = table(["query on the 100k-record org", "app p50 ms", "app p99 ms", "app p50 ms, fallback path",
                  "own SQL p50 ms", "own SQL p50 ms, fallback path", "typed table p50 ms", "ratio app/typed",
                  "ratio own SQL/typed", "ratio own SQL/typed, fallback path",
                  "Flask layer p50 ms (GET /api/v1/me)", "ratio (app − layer)/typed",
                  "typed behind the Flask layer p50 ms", "ratio app/(typed behind the layer)"], rows)
    body += "\n\n" + table(["listing, 20 per page, newest first (100 000 records)", "p50 ms, exact count",
                            "p50 ms, `Prefer: count=planned`"], deep)
    body += "\n\n" + bulk_table(rates)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"Machine load average (1/5/15 min) at the end: {load} — the 2 cores are shared with other work.\n\n"
             f"{TOTAL} records over {len(ORGS)} orgs (one org with {BIG}); {ROUNDS * PER_ROUND} samples per "
             "query per side, all sides interleaved in rounds. App = in-process Flask test client (no "
             "network), own SQL = the same statements through one psycopg connection, typed table = the same page "
             "and exact count on `bench_typed.deals` (see the module docstring) through the same connection; "
             "'fallback path' = the same app with the definition's typed projection ignored (every query "
             "compiled against entity_records, as queries the projection does not cover are), and its statements: "
             "NOT the state before projections, since a projected definition keeps no index of its own on "
             "entity_records (docs/decisions.md has the figures of that state). 'Flask layer' = an "
             "authenticated `GET /api/v1/me` through the same test client and token, in the same rounds: the "
             "fixed cost of any request of the app (routing, werkzeug request/response, token check, hooks, "
             "JSON), so '(app − layer)/typed' is the query engine's own ratio (definition read, parsing, "
             "filter compilation, the statements, shaping) without it. 'typed behind the Flask layer' = the typed "
             "table's statements served by a bench-only route of the same app (same token check and scope, "
             "hooks, the request's db session, the same JSON shape through jsonify): app/(typed behind the layer) "
             "is the ratio a user comparing two endpoints of this app would see.\n\n"
             + READING + "\n\n### EXPLAIN (ANALYZE) of the floor statements (count, then page)\n\n"
             + "\n\n".join(plans))
    return write_result("entities", "Entity store benchmark", body, notes)


if __name__ == "__main__":
    main()
