"""Analytics: ingest throughput and latency, and dashboards over millions of chat-message facts.

(1) Ingest through HTTP: gunicorn as docker/gunicorn.conf.py configures it (gthread workers), a real
    Redis and ONE real Celery worker process (`-Q analytics -c 2`: celery's default concurrency on 2
    cores, so two flush tasks can drain at once; BENCH_ANALYTICS_WORKER_CONCURRENCY=1 for one).
    16 client threads POST N single events (keep-alive); reported: the HTTP accept rate, the rate at
    which events are *persisted* (first POST → last event stored: Redis empty, then counted in
    PostgreSQL), and POST latency p50/p99 while the worker is storing.
(2) Worker drain: N events already in the buffer, the flush task(s) store them (events/s), next to a raw
    COPY of the same rows into a copy of the events table (same primary key and index) — the floor.
(3) Dashboards over F chat-message facts (plus chat_started/chat_ended/csat events) in 200 orgs, org
    `bench-big` holding 30 % of them, spread over 90 days. The facts are written once through the real
    batch writer (`services.write_batch`, 5 000 events per call) and reused by later runs.
    Each dashboard of `bench-big` for the last 30 days (date-only window: whole days, rollups only)
    is timed in-process (Flask test client: auth, parsing, SQL, JSON), p50/p99 over 30 runs, next to
    hand-written SQL over the raw events answering the same question; the two answers are compared.
    While the batch ingest runs, a probe posts single events at a paced rate (PROBE_RATE/s): the
    latency a user sees at a sustained >= 5 000 events/s, next to the saturated figure of (1a).
    CPU seconds of each process group (gunicorn, Celery worker, PostgreSQL server, Redis, the client)
    are read from /proc around the batch ingest: the CPU cost per event of each half.
Scale: BENCH_ANALYTICS_EVENTS (default 100 000), BENCH_ANALYTICS_FACTS (default 5 000 000).
BENCH_ANALYTICS_PARTS: `ingest,dashboards` (default) or either one (iterate on ingest without the
dashboard part).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from bench.common import (
    BENCH_SECRET,
    ROOT,
    bench_app,
    bench_database_url,
    bench_token,
    percentile,
    summary,
    table,
    write_result,
)

SCHEMA = "product_default"
EVENTS = int(os.environ.get("BENCH_ANALYTICS_EVENTS", "100000"))
SINGLE = int(os.environ.get("BENCH_ANALYTICS_SINGLE", str(EVENTS // 5)))
PER_POST = 100
FACTS = int(os.environ.get("BENCH_ANALYTICS_FACTS", "5000000"))
BIG = "bench-big"
ORGS = [BIG] + [f"bench-org-{i:03d}" for i in range(199)]
DAYS = 90
AGENTS = ["support", "sales", "onboarding", "billing", "triage"]
CHANNELS = ["web"] * 6 + ["whatsapp"] * 2 + ["email", "sms"]
MODELS = [("chat", "gpt-4o-mini"), ("chat", "gpt-4o"), ("chat", "claude-haiku")]
THREADS = 16
PROBE_RATE = 20
PACED_RATE = int(os.environ.get("BENCH_ANALYTICS_PACED_RATE", "6000"))  # events/s of the paced batch ingest
# long enough for the probe's p99 to rest on several hundred requests (20/s × 30 s = 600)
PACED_EVENTS = PACED_RATE * int(os.environ.get("BENCH_ANALYTICS_PACED_SECONDS", "30"))
PACED_THREADS = 4
WORKER_CONCURRENCY = os.environ.get("BENCH_ANALYTICS_WORKER_CONCURRENCY", "2")
_PREFIX = [""]
PARTS = set(os.environ.get("BENCH_ANALYTICS_PARTS", "ingest,dashboards").split(","))
TABLES = ("analytics_events", "analytics_chats", "analytics_rollup", "analytics_daily_users", "analytics_usage",
          "analytics_agent_names")


def _pg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command, CPU seconds) for every process (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        out[int(name)] = (int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _tree_cpu(table: dict, root: int) -> float:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += table.get(pid, (0, "", 0.0))[2]
        stack.extend(children.get(pid, []))
    return total


def _cpu_snapshot(web: int, worker: int) -> dict[str, float]:
    """CPU seconds so far of gunicorn, the Celery worker, the PostgreSQL server, Redis and this client.
    (Backends that exit in between lose their share; the web and worker pools keep theirs open.)"""
    table = _proc_table()
    with open(os.path.join(ROOT, "var", "pg", "postmaster.pid")) as fh:
        postmaster = int(fh.readline())
    redis_pids = [pid for pid, (_, comm, _) in table.items() if comm == "redis-server"]
    return {"gunicorn": _tree_cpu(table, web), "worker": _tree_cpu(table, worker),
            "postgres": _tree_cpu(table, postmaster), "redis": sum(table[p][2] for p in redis_pids),
            "client": time.process_time()}


def _count(conn, prefix: str) -> int:
    """Stored events of the ingest orgs (`<prefix>00`…`<prefix>19`): an index scan, so polling does not
    compete with the worker (LIKE 'prefix%' would scan the whole table under a non-C collation)."""
    orgs = [f"{prefix}{i:02d}" for i in range(20)]
    return conn.execute(f"SELECT count(*) FROM {SCHEMA}.analytics_events WHERE org_id = ANY(%s)",
                        (orgs,)).fetchone()[0]


def _purge(conn, prefix: str) -> None:
    for t in TABLES:
        conn.execute(f"DELETE FROM {SCHEMA}.{t} WHERE org_id LIKE %s", (prefix + "%",))
    conn.commit()


# --- (1) + (2) ingest ------------------------------------------------------------------------------

def _bodies(prefix: str, n: int, orgs: int = 20) -> list[tuple[str, dict]]:
    from app.analytics.demo import demo_events

    out: list[tuple[str, dict]] = []
    per_org = n // orgs
    for i in range(orgs):
        org = f"{prefix}{i:02d}"
        events = []
        while len(events) < per_org:
            events.extend(demo_events(org, 7, 200, seed=i * 1000 + len(events)))
        for body in events[:per_org]:
            body["eventId"] = uuid.uuid4().hex
            out.append((org, body))
    random.Random(1).shuffle(out)
    return out


def _client(port: int, items: list[tuple[str, bytes]], headers: dict[str, dict], lat: list[float],
            path: str = "/api/v1/analytics/events", interval: float = 0.0) -> None:
    """POST each body in turn (keep-alive); with `interval`, one POST per interval seconds (paced)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    due = time.monotonic()
    for org, body in items:
        if interval:
            time.sleep(max(0.0, due - time.monotonic()))
            due += interval
        start = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers[org])
        resp = conn.getresponse()
        resp.read()
        lat.append((time.perf_counter() - start) * 1000)
        if resp.status != 202:
            raise RuntimeError(f"POST answered {resp.status}")


def ingest() -> dict:
    url = bench_database_url()
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    _PREFIX[0] = prefix
    port = _free_port()
    env = dict(os.environ, PORT=str(port), DATABASE_URL=url, REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix,
               JWT_SECRET=BENCH_SECRET, VAR_DIR=os.path.join(ROOT, "var", "bench"), LOG_LEVEL="WARNING")
    bindir = os.path.dirname(sys.executable)
    pg = psycopg.connect(_pg_url(url))
    _purge(pg, "bench-ingest-")
    _purge(pg, "bench-drain-")
    _purge(pg, "bench-single-")
    _purge(pg, "bench-probe-")
    _purge(pg, "bench-paced-")
    web = subprocess.Popen([os.path.join(bindir, "gunicorn"), "-c", "docker/gunicorn.conf.py", "--access-logfile",
                            "/dev/null", "wsgi:app"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([os.path.join(bindir, "celery"), "-A", "workers", "worker", "-Q", "analytics",
                               "-c", WORKER_CONCURRENCY, "--loglevel", "WARNING", "--without-gossip",
                               "--without-mingle", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        single = _bodies("bench-single-", SINGLE)
        bodies = _bodies("bench-ingest-", EVENTS)
        headers = {org: {"Authorization": f"Bearer {bench_token(org)}", "Content-Type": "application/json"}
                   for org in {o for o, _ in bodies + single}}
        _wait_http(port)
        warm: list[float] = []
        _client(port, [(o, json.dumps({"sessionId": "w", "userId": "w", "eventType": "warm",
                                       "eventCategory": "bench"}).encode()) for o in list(headers)[:5]] * 10,
                headers, warm)
        time.sleep(2)
        # (1a) one event per POST
        encoded = [(org, json.dumps(body).encode()) for org, body in single]
        lat1, posted1, persisted1 = _run(pg, port, "bench-single-", encoded, headers, "/api/v1/analytics/events",
                                         SINGLE)
        # (1b) 100 events per POST (/events/batch)
        by_org: dict[str, list] = {}
        for org, body in bodies:
            by_org.setdefault(org, []).append(body)
        encoded = [(org, json.dumps({"events": evs[i:i + PER_POST]}).encode())
                   for org, evs in by_org.items() for i in range(0, len(evs), PER_POST)]
        random.Random(2).shuffle(encoded)
        probe_items = [(org, json.dumps({**body, "eventId": uuid.uuid4().hex}).encode())
                       for org, body in _bodies("bench-probe-", 4000, orgs=20)]
        headers.update({org: {"Authorization": f"Bearer {bench_token(org)}", "Content-Type": "application/json"}
                        for org, _ in probe_items})
        stop = threading.Event()
        probe_lat: list[float] = []
        probe = threading.Thread(target=_probe, args=(port, probe_items, headers, probe_lat, stop))
        before = _cpu_snapshot(web.pid, worker.pid)
        probe.start()
        lat, posted, persisted = _run(pg, port, "bench-ingest-", encoded, headers, "/api/v1/analytics/events/batch",
                                      EVENTS)
        stop.set()
        probe.join()
        after = _cpu_snapshot(web.pid, worker.pid)
        cpu = {k: after[k] - before[k] for k in before}
        # (1c) the same batch POSTs paced at PACED_RATE events/s (a sustained, not saturating, load) with
        # the single-event probe alongside
        paced_bodies = _bodies("bench-paced-", PACED_EVENTS)
        headers.update({org: {"Authorization": f"Bearer {bench_token(org)}", "Content-Type": "application/json"}
                        for org, _ in paced_bodies})
        by_org = {}
        for org, body in paced_bodies:
            by_org.setdefault(org, []).append(body)
        encoded = [(org, json.dumps({"events": evs[i:i + PER_POST]}).encode())
                   for org, evs in by_org.items() for i in range(0, len(evs), PER_POST)]
        random.Random(3).shuffle(encoded)
        stop.clear()
        paced_probe: list[float] = []
        probe = threading.Thread(target=_probe, args=(port, probe_items[len(probe_lat):], headers, paced_probe, stop))
        probe.start()
        paced_lat, paced_posted, paced_persisted = _run(pg, port, "bench-paced-", encoded, headers,
                                                        "/api/v1/analytics/events/batch", PACED_EVENTS,
                                                        threads=PACED_THREADS,
                                                        interval=PACED_THREADS * PER_POST / PACED_RATE)
        stop.set()
        probe.join()
        drain = _drain(pg, prefix, redis_url, port, headers)
        rows = drain.pop("rows")
        copy = _copy_floor(pg, rows)
        copy_live = _copy_live(pg, rows)
        exact = _check_ingested(url, [o for o in headers if o.startswith(("bench-single-", "bench-ingest-"))])
        return {"posted": posted, "persisted": persisted, "lat": lat, "posted1": posted1, "persisted1": persisted1,
                "lat1": lat1, **drain, "copy": copy, "copy_live": copy_live, "exact": exact, "cpu": cpu,
                "probe": probe_lat, "paced_probe": paced_probe, "paced_lat": paced_lat,
                "paced_posted": paced_posted, "paced_persisted": paced_persisted}
    finally:
        web.terminate()
        worker.terminate()
        web.wait(40)
        worker.wait(40)
        pg.close()


def _probe(port: int, items: list[tuple[str, bytes]], headers: dict, lat: list[float], stop) -> None:
    """Single events at PROBE_RATE per second (paced, one connection) until `stop` is set."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    due = time.monotonic()
    for org, body in items:
        if stop.is_set():
            return
        due += 1 / PROBE_RATE
        start = time.perf_counter()
        conn.request("POST", "/api/v1/analytics/events", body=body, headers=headers[org])
        resp = conn.getresponse()
        resp.read()
        lat.append((time.perf_counter() - start) * 1000)
        if resp.status != 202:
            raise RuntimeError(f"POST answered {resp.status}")
        time.sleep(max(0.0, due - time.monotonic()))


def _run(pg, port, prefix, encoded, headers, path, expected, threads=THREADS, interval=0.0):
    base = _count(pg, prefix)
    pg.rollback()
    lat: list[float] = []
    slices = [encoded[i::threads] for i in range(threads)]
    threads = [threading.Thread(target=_client, args=(port, s, headers, lat, path, interval)) for s in slices]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    posted = time.monotonic() - start
    _wait_stored(pg, prefix, base + expected, start)
    return lat, posted, time.monotonic() - start


def _redis_busy() -> bool:
    """Events still in the buffer, in flight or a flush pending (the worker deletes a batch from Redis
    right after its commit). Polling Redis rather than counting rows every 0.2 s keeps the poller's own
    PostgreSQL CPU out of the ingest's figures; the count below stays the proof."""
    import redis

    client = redis.Redis.from_url(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    names = [f"{_PREFIX[0]}analytics:{k}" for k in ("buffer", "flush-pending", "flush-pending:1")]
    return bool(client.llen(names[0]) or client.exists(names[1], names[2])
                or client.zcard(f"{_PREFIX[0]}analytics:inflight"))


def _wait_stored(pg, prefix: str, expected: int, start: float) -> None:
    while True:
        while _redis_busy():
            if time.monotonic() - start > 1800:
                raise RuntimeError("ingest did not finish in 30 minutes")
            time.sleep(0.02)
        if _count(pg, prefix) >= expected:
            return
        pg.rollback()
        time.sleep(0.2)


def _wait_http(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not come up")


def _drain(pg, prefix: str, redis_url: str, port: int, headers: dict) -> dict:
    """N events pushed straight into the buffer, then one flush stores them."""
    import redis

    from app.analytics.services import normalise_event
    from app.tenancy import Tenant

    client = redis.Redis.from_url(redis_url)
    buffer, flag = f"{prefix}analytics:buffer", f"{prefix}analytics:flush-pending"
    while client.llen(buffer) or client.exists(flag):
        time.sleep(0.2)
    client.set(flag, "1", ex=600)  # hold the flush until the buffer is full
    rows = []
    pipe = client.pipeline(transaction=False)
    for org, body in _bodies("bench-drain-", EVENTS):
        event = normalise_event(body, Tenant(org_id=org, user_id="b", email=None, role=None))
        rows.append(event)
        pipe.rpush(buffer, json.dumps(event, separators=(",", ":")))
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()
    client.delete(flag)
    trigger_org = next(iter(headers))
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/api/v1/analytics/events", body=json.dumps(
        {"sessionId": "t", "userId": "t", "eventType": "trigger", "eventCategory": "bench"}),
        headers=headers[trigger_org])
    conn.getresponse().read()
    _wait_stored(pg, "bench-drain-", EVENTS, start)
    return {"drain": time.monotonic() - start, "rows": rows}


def _copy_floor(pg, rows: list[dict]) -> float:
    from psycopg.types.json import Jsonb

    pg.execute("DROP TABLE IF EXISTS bench_copy_floor")
    pg.execute(f"CREATE UNLOGGED TABLE bench_copy_floor (LIKE {SCHEMA}.analytics_events INCLUDING ALL)")
    pg.execute("ALTER TABLE bench_copy_floor SET LOGGED")
    pg.commit()
    records = [(r["org_id"], r["event_id"], r["session_id"], r["user_id"], r["event_type"], r["event_category"],
                r["page_path"], Jsonb(r["properties"]) if r["properties"] is not None else None, r["occurred_at"])
               for r in rows]
    start = time.monotonic()
    with pg.cursor() as cur, cur.copy("COPY bench_copy_floor (org_id, event_id, session_id, user_id, event_type, "
                                      "event_category, page_path, properties, occurred_at) FROM STDIN") as copy:
        for rec in records:
            copy.write_row(rec)
    pg.commit()
    elapsed = time.monotonic() - start
    pg.execute("DROP TABLE bench_copy_floor")
    pg.commit()
    return elapsed


def _copy_live(pg, rows: list[dict]) -> float:
    """For context: the same COPY into the live events table (millions of rows, bigger indexes), rolled
    back. The drain's own INSERT pays this, not the empty-table floor."""
    from psycopg.types.json import Jsonb

    records = [(r["org_id"] + "-live", r["event_id"], r["session_id"], r["user_id"], r["event_type"],
                r["event_category"], r["page_path"], Jsonb(r["properties"]) if r["properties"] is not None else None,
                r["occurred_at"]) for r in rows]
    start = time.monotonic()
    with pg.cursor() as cur, cur.copy(f"COPY {SCHEMA}.analytics_events (org_id, event_id, session_id, user_id, "
                                      "event_type, event_category, page_path, properties, occurred_at) "
                                      "FROM STDIN") as copy:
        for rec in records:
            copy.write_row(rec)
    elapsed = time.monotonic() - start
    pg.rollback()
    return elapsed


def _check_ingested(url: str, orgs: list[str]) -> bool:
    app = bench_app(DATABASE_URL=url)
    with app.app_context():
        return all(_dashboards_equal_raw(app, org, "2020-01-01", "2029-12-31") for org in orgs[:3])


# --- (3) dashboards --------------------------------------------------------------------------------

def _generate(app, facts: int) -> float:
    """F message events (+ chat_started/chat_ended/csat) through the real batch writer."""
    from app.analytics.services import write_batch
    from app.db import db

    rnd = random.Random(42)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    big_share = int(facts * 0.3)
    plan = [(BIG, big_share)] + [(org, (facts - big_share) // 199) for org in ORGS[1:]]
    start = time.monotonic()
    written = 0
    batch: list[dict] = []

    def flush() -> None:
        with app.app_context(), db.product_session("default") as s:
            write_batch(s, batch)
        batch.clear()

    for org, messages in plan:
        users = [f"u{n}" for n in range(max(50, messages // 40))]
        done = 0
        while done < messages:
            chat = uuid.uuid4().hex[:16]
            n = min(rnd.randint(4, 20), messages - done)
            at = today - timedelta(days=rnd.randrange(DAYS), hours=rnd.randrange(7, 22) - 24, minutes=rnd.randrange(60))
            agent, channel, user = rnd.choice(AGENTS), rnd.choice(CHANNELS), rnd.choice(users)
            service, model = rnd.choice(MODELS)
            props = {"chatId": chat, "agentId": agent, "agentName": agent.title(), "channel": channel}
            common = {"org_id": org, "session_id": chat, "user_id": user, "event_category": "chat", "page_path": None}
            batch.append({**common, "event_id": f"{chat}-s", "event_type": "chat_started", "occurred_at": at,
                          "properties": props})
            for i in range(n):
                at += timedelta(seconds=rnd.randint(3, 90))
                tin, tout = (0, 0) if i % 2 == 0 else (rnd.randint(100, 1500), rnd.randint(20, 500))
                batch.append({**common, "event_id": f"{chat}-{i}", "event_type": "message", "occurred_at": at,
                              "properties": {**props, "direction": "inbound" if i % 2 == 0 else "outbound",
                                             "service": service, "model": model, "inputTokens": tin,
                                             "outputTokens": tout, "cost": round((tin + 4 * tout) / 1e6, 6)}})
            batch.append({**common, "event_id": f"{chat}-e", "event_type": "chat_ended",
                          "occurred_at": at + timedelta(seconds=5), "properties": props})
            if rnd.random() < 0.4:
                batch.append({**common, "event_id": f"{chat}-c", "event_type": "csat",
                              "occurred_at": at + timedelta(seconds=30),
                              "properties": {**props, "score": rnd.randint(1, 5)}})
            done += n
            if len(batch) >= 5000:
                written += len(batch)
                flush()
        if org == BIG or org.endswith("0"):
            print(f"  {org}: {done} messages; {written} events so far, {time.monotonic() - start:.0f}s", flush=True)
    written += len(batch)
    flush()
    return written / (time.monotonic() - start)


RAW_BASE = f"""
WITH ev AS (
  SELECT event_id, user_id, event_type, properties p, occurred_at,
         coalesce(properties->>'agentId', '') AS agent_id
  FROM {SCHEMA}.analytics_events
  WHERE org_id = %(org)s AND event_category = 'chat'
    AND event_type IN ('chat_started', 'message', 'chat_ended', 'csat')),
firsts AS (
  SELECT DISTINCT ON (p->>'chatId') p->>'chatId' AS chat_id, agent_id, occurred_at AS first_at
  FROM ev ORDER BY p->>'chatId', occurred_at, event_id),
lasts AS (
  SELECT p->>'chatId' AS chat_id, max(occurred_at) FILTER (WHERE event_type <> 'csat') AS last_at
  FROM ev GROUP BY 1),
csat AS (
  SELECT DISTINCT ON (p->>'chatId') p->>'chatId' AS chat_id, (p->>'score')::int AS score
  FROM ev WHERE event_type = 'csat' ORDER BY p->>'chatId', occurred_at DESC, event_id DESC),
chats AS (
  SELECT f.chat_id, f.agent_id, f.first_at,
         coalesce((extract(epoch FROM l.last_at - f.first_at) * 1000000)::bigint, 0) AS duration_us, c.score
  FROM firsts f JOIN lasts l USING (chat_id) LEFT JOIN csat c USING (chat_id)
  WHERE f.first_at >= %(start)s AND f.first_at < %(end)s),
win AS (
  SELECT *, (occurred_at AT TIME ZONE 'UTC')::date AS day,
         CASE WHEN event_type = 'message' THEN 1 ELSE 0 END AS is_msg,
         CASE WHEN event_type = 'message' THEN coalesce((p->>'inputTokens')::bigint, 0)
              + coalesce((p->>'outputTokens')::bigint, 0) ELSE 0 END AS tokens,
         CASE WHEN event_type = 'message' THEN coalesce((p->>'cost')::numeric(18,6), 0) ELSE 0 END AS cost
  FROM ev WHERE occurred_at >= %(start)s AND occurred_at < %(end)s)
"""
RAW = {
    "summary": RAW_BASE + """
SELECT (SELECT count(*) FROM chats), (SELECT sum(is_msg) FROM win), (SELECT sum(tokens) FROM win),
       (SELECT sum(cost) FROM win), (SELECT count(DISTINCT user_id) FROM win),
       (SELECT sum(duration_us) FROM chats)""",
    "agents": RAW_BASE + """
, m AS (SELECT agent_id, sum(is_msg) AS messages, sum(tokens) AS tokens, count(DISTINCT user_id) AS users
        FROM win GROUP BY 1),
  c AS (SELECT agent_id, count(*) AS chats, sum(duration_us) AS dur, sum(score) AS csat_sum, count(score) AS csat_n
        FROM chats GROUP BY 1)
SELECT coalesce(m.agent_id, c.agent_id), coalesce(c.chats, 0), coalesce(m.messages, 0), coalesce(m.tokens, 0),
       coalesce(c.dur, 0), coalesce(m.users, 0), c.csat_sum, c.csat_n
FROM m FULL JOIN c USING (agent_id)""",
    "daily": RAW_BASE + """
, m AS (SELECT day, sum(is_msg) AS messages, sum(tokens) AS tokens, count(DISTINCT user_id) AS users
        FROM win GROUP BY 1),
  c AS (SELECT (first_at AT TIME ZONE 'UTC')::date AS day, count(*) AS chats FROM chats GROUP BY 1)
SELECT coalesce(m.day, c.day), coalesce(c.chats, 0), coalesce(m.messages, 0), coalesce(m.tokens, 0),
       coalesce(m.users, 0) FROM m FULL JOIN c USING (day)""",
    "usage": f"""
SELECT coalesce(properties->>'service', 'chat'), coalesce(properties->>'model', 'unknown'),
       sum(coalesce((properties->>'inputTokens')::bigint, 0)), sum(coalesce((properties->>'outputTokens')::bigint, 0)),
       sum(coalesce((properties->>'cost')::numeric(18,6), 0)), count(*)
FROM {SCHEMA}.analytics_events
WHERE org_id = %(org)s AND event_category = 'chat' AND event_type = 'message'
  AND occurred_at >= %(start)s AND occurred_at < %(end)s
GROUP BY 1, 2""",
}


def _raw_answer(cur, name: str, org: str, window) -> object:
    from app.analytics.services import _secs

    cur.execute(RAW[name], {"org": org, "start": window.start, "end": window.end})
    rows = cur.fetchall()
    if name == "summary":
        chats, msgs, tokens, cost, users, dur = rows[0]
        return {"total_chats": chats, "total_messages": int(msgs or 0), "total_tokens": int(tokens or 0),
                "total_cost": round(float(cost or 0), 6), "unique_users": users,
                "avg_session_duration": _secs(dur or 0, chats)}
    if name == "agents":
        return sorted((a, int(c), int(m), int(t), _secs(d, c), int(u),
                       round(int(s) / int(n), 3) if n else None) for a, c, m, t, d, u, s, n in rows)
    if name == "daily":
        return sorted((d.isoformat(), int(c), int(m), int(t), int(u)) for d, c, m, t, u in rows if c or m or u)
    return sorted((s, m, int(i), int(o), int(i) + int(o), round(float(c), 6), int(n)) for s, m, i, o, c, n in rows)


def _app_answer(name: str, data) -> object:
    if name == "summary":
        return data
    if name == "agents":
        return sorted((a["agent_id"], a["total_chats"], a["total_messages"], a["total_tokens"],
                       a["avg_duration_secs"], a["unique_users"], a["avg_csat"]) for a in data)
    if name == "daily":
        return sorted((d["date"], d["total_chats"], d["total_messages"], d["total_tokens"], d["unique_users"])
                      for d in data if d["total_chats"] or d["total_messages"] or d["unique_users"])
    return sorted((u["service"], u["model"], u["input_tokens"], u["output_tokens"], u["total_tokens"], u["cost"],
                   u["request_count"]) for u in data)


def _dashboards_equal_raw(app, org: str, start: str, end: str) -> bool:
    from app.analytics.services import resolve_window

    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token(org)}"}
    window = resolve_window(start, end)
    with psycopg.connect(_pg_url(app.config["DATABASE_URL"])) as pg, pg.cursor() as cur:
        for name in RAW:
            data = client.get(f"/api/v1/analytics/{name}", query_string={"from": start, "to": end},
                              headers=headers).get_json()["data"]
            if _app_answer(name, data) != _raw_answer(cur, name, org, window):
                print(f"  MISMATCH {name} {org}:\n  app {_app_answer(name, data)}\n  raw "
                      f"{_raw_answer(cur, name, org, window)}", flush=True)
                return False
    return True


def dashboards() -> tuple[list, dict]:
    url = bench_database_url()
    app = bench_app(DATABASE_URL=url)
    with psycopg.connect(_pg_url(url)) as pg:
        have = pg.execute(f"SELECT count(*) FROM {SCHEMA}.analytics_events WHERE (org_id = 'bench-big' "
                          "OR org_id LIKE 'bench-org-%%') AND event_type = 'message'").fetchone()[0]
        rate = None
        big_share = int(FACTS * 0.3)
        if have != big_share + 199 * ((FACTS - big_share) // 199):
            print(f"  building {FACTS} chat-message facts (have {have})", flush=True)
            _purge(pg, "bench-big")
            _purge(pg, "bench-org-")
            rate = _generate(app, FACTS)
            pg.autocommit = True
            for t in TABLES:
                pg.execute(f"VACUUM ANALYZE {SCHEMA}.{t}")
        stats = {"facts": pg.execute(f"SELECT count(*) FROM {SCHEMA}.analytics_events WHERE event_type='message' "
                                     "AND (org_id = 'bench-big' OR org_id LIKE 'bench-org-%%')").fetchone()[0],
                 "big": pg.execute(f"SELECT count(*) FROM {SCHEMA}.analytics_events WHERE event_type='message' "
                                   "AND org_id = %s", (BIG,)).fetchone()[0],
                 "rate": rate}
    today = datetime.now(UTC).date()
    start, end = (today - timedelta(days=29)).isoformat(), today.isoformat()
    client = app.test_client()
    user = {"Authorization": f"Bearer {bench_token(BIG)}"}
    admin = {"Authorization": f"Bearer {bench_token(BIG, role='admin')}"}
    window = {"from": start, "to": end}
    edge = {"from": f"{today - timedelta(days=29)}T09:30:00Z", "to": f"{today}T18:00:00Z"}
    routes = [("summary", user, window), ("chats", user, window), ("agents", user, window), ("usage", user, window),
              ("daily", user, window), ("events", user, window), ("summary (instant window, raw edges)", user, edge),
              ("global/summary", admin, window), ("global/orgs", admin, window), ("global/channels", admin, window),
              ("global/channels/web/daily", admin, window), ("global/channels/web/orgs", admin, window)]
    rows = []
    from app.analytics.services import resolve_window

    with psycopg.connect(_pg_url(url)) as pg, pg.cursor() as cur:
        for name, headers, params in routes:
            path = name.split(" ")[0]

            def call(path=path, headers=headers, params=params):
                r = client.get(f"/api/v1/analytics/{path}", query_string=params, headers=headers)
                assert r.status_code == 200, r.get_json()
                return r

            samples = []
            for _ in range(3):
                call()
            for _ in range(30):
                t = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t) * 1000)
            s = summary(samples)
            raw_p50, equal = "", ""
            if path in RAW and params is window:
                raw_samples = []
                for _ in range(3):
                    t = time.perf_counter()
                    raw = _raw_answer(cur, path, BIG, resolve_window(start, end))
                    raw_samples.append((time.perf_counter() - t) * 1000)
                raw_p50 = f"{percentile(raw_samples, 0.5):.0f}"
                equal = "yes" if _app_answer(path, call().get_json()["data"]) == raw else "NO"
            rows.append((name, s["p50"], s["p99"], raw_p50, equal))
            print(f"  {name}: p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, raw {raw_p50} ms, equal {equal}",
                  flush=True)
    return rows, stats


def _ingest_table(ing: dict) -> str:
    lat, lat1, probe = summary(ing["lat"]), summary(ing["lat1"]), summary(ing["probe"])
    paced, paced_probe = summary(ing["paced_lat"]), summary(ing["paced_probe"])
    rate = EVENTS / ing["persisted"]
    copy = EVENTS / ing["copy"]
    cpu = ing["cpu"]
    accounted = sum(cpu.values())
    rows = [
        (f"one event per POST /events, {THREADS} threads flat out (saturated): {SINGLE} events, accepted (events/s)",
         SINGLE / ing["posted1"]),
        ("… persisted through HTTP → Redis → worker → PostgreSQL (events/s)", SINGLE / ing["persisted1"]),
        ("… POST /events latency p50, saturated (ms)", lat1["p50"]),
        ("… POST /events latency p99, saturated (ms)", lat1["p99"]),
        (f"{PER_POST} events per POST /events/batch, {THREADS} threads: {EVENTS} events, accepted (events/s)",
         EVENTS / ing["posted"]),
        ("… persisted through HTTP → Redis → worker → PostgreSQL (events/s)", rate),
        ("… POST /events/batch latency p50 (ms)", lat["p50"]), ("… POST /events/batch latency p99 (ms)", lat["p99"]),
        (f"single-event POST /events paced at {PROBE_RATE}/s during that flat-out batch ingest: p50 (ms)",
         probe["p50"]),
        (f"… p99 (ms, {probe['n']} requests)", probe["p99"]),
        (f"batch POSTs paced at {PACED_RATE} events/s ({PACED_THREADS} threads): {PACED_EVENTS} events, accepted "
         "(events/s)", PACED_EVENTS / ing["paced_posted"]),
        ("… persisted (events/s)", PACED_EVENTS / ing["paced_persisted"]),
        ("… POST /events/batch latency p50 / p99 (ms)", f"{paced['p50']:.1f} / {paced['p99']:.1f}"),
        (f"single-event POST /events paced at {PROBE_RATE}/s during that paced batch ingest: p50 (ms)",
         paced_probe["p50"]),
        (f"… p99 (ms, {paced_probe['n']} requests)", paced_probe["p99"]),
        ("worker drain, buffer → PostgreSQL incl. rollups (events/s)", EVENTS / ing["drain"]),
        ("raw COPY of the same rows into a copy of the events table (events/s, floor)", copy),
        ("… for context: the same COPY into the live events table, rolled back (events/s)", EVENTS / ing["copy_live"]),
        ("end-to-end persisted (batch POSTs) / COPY floor", rate / copy),
        ("worker drain / COPY floor", (EVENTS / ing["drain"]) / copy),
    ]
    for name in ("gunicorn", "worker", "postgres", "redis", "client"):
        rows.append((f"CPU per event during the batch ingest: {name} (µs)", cpu[name] / EVENTS * 1e6))
    rows.append(("… all of them (µs per event; 2 cores = 1 000 000 µs/s)", accounted / EVENTS * 1e6))
    rows.append(("dashboards of 3 ingested orgs == SQL over their raw events", "yes" if ing["exact"] else "NO"))
    return table(["measure", "value"], rows)


def main() -> str:
    load = os.getloadavg()[0]
    body, parts = "", []
    if "ingest" in PARTS:
        print(f"== ingest {EVENTS} events", flush=True)
        ingest_table = _ingest_table(ingest())
        print(ingest_table, flush=True)
        load_after = os.getloadavg()[0]
        parts.append(f"## Ingest (gunicorn as configured, real Redis, one worker process `-c {WORKER_CONCURRENCY}`, "
                     f"{THREADS} client threads)\n\n"
                     f"{ingest_table}\n\nLoad average after the ingest part: {load_after:.1f}.")
    if "dashboards" in PARTS:
        print(f"== dashboards over {FACTS} chat-message facts", flush=True)
        rows, stats = dashboards()
        dash_table = table(["dashboard (bench-big, last 30 days)", "p50 ms", "p99 ms", "raw SQL p50 ms",
                            "rollup answer == raw answer"], rows)
        parts.append(f"## Dashboards\n\n{stats['facts']:,} chat-message facts in 200 orgs "
                     f"(`bench-big`: {stats['big']:,}), over {DAYS} days, plus chat_started/chat_ended/csat events."
                     + (f" Built through the batch writer at {stats['rate']:.0f} events/s." if stats["rate"] else "")
                     + f"\n\n{dash_table}")
    body = "\n\n".join(parts) + "\n"
    notes = (f"Load average when the run started: {load:.1f} (2 cores shared with other engineers' work). "
             "HTTP figures include the Python client (16 threads) on the same 2 cores. CPU per event: user+system "
             "CPU seconds of each process tree over the batch ingest (its 100 000 events plus the paced probe), "
             "read from /proc; Redis is shared with other work on this machine. Raw SQL = hand-written "
             "SQL over `analytics_events` answering the same question exactly (chats keyed by their earliest "
             "event, so it must group every chat event of the org); 3 runs. Dashboards are timed in-process "
             "(Flask test client) so the figure is the app's own cost, not the loopback.")
    return write_result("analytics", "Analytics: ingest and dashboards", body, notes)


if __name__ == "__main__":
    main()
