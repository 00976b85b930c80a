"""Entity records over real HTTP: gunicorn as configured (docker/gunicorn.conf.py), wrk on loopback.

(1) Throughput of `GET /api/v1/entities/deals/records/{id}` (a record of the 100k-record org of the
    `bench entities` data set; a different id per connection is not needed: every request runs the full
    path — token, definition, record, JSON) beside `GET /api/v1/me` (token only, no database), at 8 and
    32 connections, `wrk -t2`, 10 s each after a 2 s warm-up. wrk is the Debian package (`make
    bench-tools` installs it); it is a C event loop that uses a fraction of one core, so it takes far less
    CPU from the server than a Python load generator would. Server and load generator share the
    machine's 2 cores.
    The CPU time the workers spent per request is reported beside req/s (load-independent).
(2) Peak RSS of the serving processes (gunicorn workers, sampled every 5 ms from /proc) during one
    5 000-record bulk create and during one 500-record page.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg

from bench.bench_entities import BIG_ORG, BULK_ORG, ENTITY, SCHEMA, bench_setup, bulk_rows, psycopg_url
from bench.common import BENCH_SECRET, ROOT, bench_token, table, write_result

DURATION, WARMUP = 10, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(url: str, port: int, **env_extra: str) -> subprocess.Popen:
    """gunicorn as the Procfile runs it, on the bench database; `env_extra` overrides settings (no Redis
    unless it names REDIS_URL)."""
    env = {**os.environ, "PORT": str(port), "DATABASE_URL": url, "JWT_SECRET": BENCH_SECRET, "LOG_LEVEL": "WARNING",
           "REDIS_URL": "", "VAR_DIR": os.path.join(ROOT, "var", "bench"), **env_extra}
    cmd = [os.path.join(ROOT, ".venv", "bin", "gunicorn"), "-c", os.path.join(ROOT, "docker", "gunicorn.conf.py"),
           "--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null", "wsgi:app"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:]) from None
            time.sleep(0.3)
    stop(proc)
    raise RuntimeError("gunicorn did not start")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the process group this benchmark started
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def worker_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def wrk(url: str, connections: int, token: str, seconds: int) -> dict:
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "-H", f"Authorization: Bearer {token}", url], capture_output=True, text=True,
                         check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {"rate": rate, "p50": float(p50.group(1)) * scale[p50.group(2)],
            "p99": float(p99.group(1)) * scale[p99.group(2)], "errors": int(non2xx.group(1)) if non2xx else 0}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_during(master: int, fn) -> tuple[float, float]:
    """(baseline MB, peak MB) of the largest worker while `fn` runs."""
    pids = worker_pids(master)
    base = max(rss_kb(p) for p in pids)
    peak, done = base, threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, *(rss_kb(p) for p in pids))
            time.sleep(0.005)
    thread = threading.Thread(target=sample)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return base / 1024, peak / 1024


def http(method: str, url: str, token: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def main() -> str:
    url, _app, _ids, _capture, _client, _headers = bench_setup()
    with psycopg.connect(psycopg_url(url)) as conn:
        record_id = conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active "
                                 "ORDER BY id LIMIT 1 OFFSET 5000", (BIG_ORG,)).fetchone()[0]
        conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id = %s", (BULK_ORG,))
        conn.commit()
    port = free_port()
    token, bulk_token = bench_token(BIG_ORG), bench_token(BULK_ORG)
    base = f"http://127.0.0.1:{port}"
    record_url = f"{base}/api/v1/entities/{ENTITY}/records/{record_id}"
    proc = start_gunicorn(url, port)
    rows = []
    try:
        http("GET", record_url, token)  # the record exists and the token works
        for connections in (8, 32):
            for label, target in (("GET …/records/{id}", record_url), ("GET /api/v1/me", f"{base}/api/v1/me")):
                wrk(target, connections, token, WARMUP)
                workers = worker_pids(proc.pid)
                cpu_before = sum(cpu_seconds(p) for p in workers)
                r = wrk(target, connections, token, DURATION)
                cpu_ms = 1000 * (sum(cpu_seconds(p) for p in workers) - cpu_before) / (r["rate"] * DURATION)
                rows.append([label, connections, r["rate"], r["p50"], r["p99"], r["errors"], cpu_ms])
                print(rows[-1], flush=True)
        records = bulk_rows(5000, seed=900)
        bulk_base, bulk_peak = peak_rss_during(proc.pid, lambda: http(
            "POST", f"{base}/api/v1/entities/{ENTITY}/records/bulk/create", bulk_token, {"records": records}))
        page_base, page_peak = peak_rss_during(proc.pid, lambda: http(
            "POST", f"{base}/api/v1/entities/{ENTITY}/records/query", token, {"query": {"pageSize": 500}}))
    finally:
        stop(proc)
        with psycopg.connect(psycopg_url(url)) as conn:
            conn.execute(f"DELETE FROM {SCHEMA}.entity_records WHERE org_id = %s", (BULK_ORG,))
            conn.commit()
    body = table(["request", "connections", "req/s", "p50 ms", "p99 ms", "non-2xx",
                  "worker CPU ms per request"], rows)
    body += "\n\n" + table(["serving process (largest gunicorn worker)", "RSS before MB", "peak RSS MB"], [
        ["during one 5 000-record bulk create", bulk_base, bulk_peak],
        ["during one 500-record page", page_base, page_peak],
    ])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"Machine load average (1/5/15 min) at the end: {load}.\n\n"
             "gunicorn -c docker/gunicorn.conf.py (gthread, WEB_CONCURRENCY=2 workers × 128 "
             f"threads) on 127.0.0.1, wrk 4.1 (Debian) `-t2 -cN -d{DURATION}s` after a {WARMUP} s warm-up, "
             "same run, same machine (2 cores shared by server, PostgreSQL and wrk). The record is one of "
             "the 100 000-record org's; GET /api/v1/me checks the token and answers without the database. "
             "Worker CPU per request (user + system time of the gunicorn workers from /proc over the run, "
             "divided by the requests served) depends far less on the machine's load than req/s does.")
    return write_result("records_http", "Entity records over HTTP (gunicorn + wrk)", body, notes)


if __name__ == "__main__":
    sys.exit(main() and 0)
