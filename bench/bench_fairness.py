"""Fairness between organizations over real HTTP: gunicorn as configured (docker/gunicorn.conf.py) with
Redis, wrk on loopback.

Org B (one of the 19 small orgs of the `bench entities` data set) reads one of its records
(`GET …/records/{id}`, 4 connections, each pausing PACE_MS between requests: a normal tenant's traffic)
while org C (the 100 000-record org) floods `POST …/records/query` (pageSize 20, exact totalCount) from
32 connections. Reported: org B's p50/p95/p99 idle and under the flood, and what org C got served.

Server configurations, same run:
  * CONCURRENCY_LIMIT_RECORDS=0: no per-org limit (the state before the limit existed);
  * the default limit (app.config): org C's requests beyond it answer 429 at once. The flood is run twice:
    a client that honours Retry-After (waits the 1 s it says on that connection), and one that ignores
    it and sends again at once (an abusive client: its refusals still cost the API a token check each).

wrk is the Debian package (`make bench-tools`); its Lua hooks pace org B and make the flood honour
Retry-After per connection. Server, PostgreSQL, Redis and wrk share the machine's cores.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg

from app.config import SETTINGS
from bench.bench_entities import BIG_ORG, ENTITY, ORGS, SCHEMA, bench_setup, psycopg_url
from bench.bench_records_http import cpu_seconds, free_port, start_gunicorn, stop, worker_pids
from bench.common import bench_token, table, write_result

DURATION, WARMUP, PACE_MS, ROUNDS = 6, 2, 10, 3
VICTIM = ORGS[1]
FLOOD_CONNECTIONS, VICTIM_CONNECTIONS = 32, 4

VICTIM_LUA = f"""
function delay() return {PACE_MS} end
done = function(summary, latency, requests)
  io.write(string.format("P50 %d\\nP95 %d\\nP99 %d\\n", latency:percentile(50), latency:percentile(95),
                         latency:percentile(99)))
end
"""

FLOOD_LUA = """
wrk.method = "POST"
wrk.body = '{"query": {"pageSize": 20}}'
wrk.headers["Content-Type"] = "application/json"
local honour = %s
local wait = 0
local ok, limited = 0, 0
function response(status, headers, body)
  if status == 429 then
    limited = limited + 1
    if honour then wait = 1000 * tonumber(headers["Retry-After"] or "1") end
  else
    if status == 200 then ok = ok + 1 end
  end
end
function delay() local d = wait; wait = 0; return d end
done = function(summary, latency, requests) end
"""


def _script(text: str) -> str:
    fd, path = tempfile.mkstemp(suffix=".lua", prefix="bench-fairness-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def _wrk(url: str, connections: int, token: str, seconds: int, script: str) -> subprocess.Popen:
    return subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", script,
                             "-H", f"Authorization: Bearer {token}", url], stdout=subprocess.PIPE, text=True)


def _victim_result(out: str) -> dict:
    ms = {k: int(re.search(rf"{k} (\d+)", out).group(1)) / 1000 for k in ("P50", "P95", "P99")}
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {**ms, "rate": rate, "errors": int(non2xx.group(1)) if non2xx else 0}


def _flood_result(out: str) -> dict:
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    refused = int(non2xx.group(1)) if non2xx else 0
    return {"served": (total - refused) / DURATION, "refused": refused / DURATION}


def run_phase(victim_url: str, victim_token: str, flood_url: str | None, flood_token: str,
              honour: bool, scripts: dict[str, str], pids: list[int]) -> dict:
    flood = None
    if flood_url:
        flood_script = scripts["honour" if honour else "ignore"]
        flood = _wrk(flood_url, FLOOD_CONNECTIONS, flood_token, WARMUP + DURATION + 1, flood_script)
        time.sleep(WARMUP)
    cpu_before = sum(cpu_seconds(p) for p in pids)
    victim = _victim_result(_wrk(victim_url, VICTIM_CONNECTIONS, victim_token, DURATION,
                                 scripts["victim"]).communicate()[0])
    victim["cpu"] = sum(cpu_seconds(p) for p in pids) - cpu_before
    if flood is not None:
        victim.update(_flood_result(flood.communicate()[0]))
    return victim


def main() -> str:
    url, _app, _ids, _capture, _client, _headers = bench_setup()
    with psycopg.connect(psycopg_url(url)) as conn:
        record_id = conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active "
                                 "ORDER BY id LIMIT 1", (VICTIM,)).fetchone()[0]
    victim_token, flood_token = bench_token(VICTIM), bench_token(BIG_ORG)
    redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    default_limit = SETTINGS["CONCURRENCY_LIMIT_RECORDS"][0]
    scripts = {"victim": _script(VICTIM_LUA), "honour": _script(FLOOD_LUA % "true"),
               "ignore": _script(FLOOD_LUA % "false")}
    rows = []
    try:
        for limit in (0, 2, default_limit):
            port = free_port()
            base = f"http://127.0.0.1:{port}/api/v1/entities/{ENTITY}/records"
            proc = start_gunicorn(url, port, REDIS_URL=redis_url, CONCURRENCY_LIMIT_RECORDS=str(limit),
                                  CELERY_KEY_PREFIX=f"bench-fair-{uuid.uuid4().hex[:8]}:")
            try:
                pids = worker_pids(proc.pid)
                victim_url, flood_url = f"{base}/{record_id}", f"{base}/query"
                _wrk(victim_url, VICTIM_CONNECTIONS, victim_token, WARMUP, scripts["victim"]).communicate()
                phases = [("idle", None, True), ("org C floods", flood_url, True)]
                if limit:
                    phases = [("idle", None, True), ("org C floods, honours Retry-After", flood_url, True),
                              ("org C floods, ignores Retry-After", flood_url, False)]
                # phases interleaved in rounds, the median round reported: the machine's load drifts
                runs = {label: [] for label, _, _ in phases}
                for _ in range(ROUNDS):
                    for label, flood, honour in phases:
                        runs[label].append(run_phase(victim_url, victim_token, flood, flood_token, honour,
                                                     scripts, pids))
                idle = statistics.median(r["P95"] for r in runs["idle"])
                for label, _, _ in phases:
                    r = {k: statistics.median(x[k] for x in runs[label]) for k in runs[label][0]}
                    rows.append([limit or "off", label, r["rate"], r["P50"], r["P95"], r["P99"],
                                 r["P95"] / idle, r["errors"], r.get("served", ""), r.get("refused", ""),
                                 r["cpu"]])
                    print(rows[-1], flush=True)
            finally:
                stop(proc)
    finally:
        for path in scripts.values():
            os.unlink(path)
    body = table(["CONCURRENCY_LIMIT_RECORDS", "phase", "org B req/s", "org B p50 ms", "org B p95 ms",
                  "org B p99 ms", "p95 / idle p95", "org B non-2xx", "org C queries served/s",
                  "org C 429/s", "API worker CPU s per phase"], rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"Machine load average (1/5/15 min) at the end: {load}.\n\n"
             "gunicorn -c docker/gunicorn.conf.py (gthread, WEB_CONCURRENCY=2 × 128 threads) with Redis on "
             f"127.0.0.1; org B: wrk `-t1 -c{VICTIM_CONNECTIONS}`, {PACE_MS} ms pause per connection between "
             f"requests, {DURATION} s per phase, phases interleaved in {ROUNDS} rounds, the median of each "
             f"column over the rounds; org C: wrk `-t1 -c{FLOOD_CONNECTIONS}` POST …/records/query (pageSize 20, "
             f"exact count over 100 000 records) started {WARMUP} s earlier. Server, PostgreSQL, Redis and "
             "both wrk share the machine's cores. API worker CPU: user + system seconds of the gunicorn "
             "workers during org B's run.")
    return write_result("fairness", "Fairness between organizations (per-org concurrency limit)", body, notes)


if __name__ == "__main__":
    sys.exit(main() and 0)
