"""A/B of the `api` pool's size: gunicorn servers with different GUNICORN_THREADS side by side, on the
stack's database and Redis, loaded in turn (rounds, so the machine's drifting load falls on each alike).

`python -m bench.ab_pool_threads [THREADS ...]` (default 4 8 16 128): starts the local stack as
`python -m bench stack` does (for its PostgreSQL, Redis and a seeded record), then one gunicorn per
thread count (docker/gunicorn.conf.py, WEB_CONCURRENCY=2, access log off), and runs wrk on the record GET
directly against each (no nginx) at 8 and 32 connections, ROUNDS rounds of SECONDS s. Prints req/s and
the CPU milliseconds per request of each server's workers (the median over the rounds). Not part of
`make bench` (only bench_<name>.py is); bench/results/stack.md quotes its figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import uuid

from bench.bench_records_http import cpu_seconds, free_port, start_gunicorn, stop, worker_pids
from bench.bench_stack import BenchStack, HeldUpstream, _script, wrk
from bench.common import bench_token, table

ROUNDS, SECONDS = 3, 8


def main(argv: list[str]) -> int:
    counts = [int(x) for x in argv] or [4, 8, 16, 128]
    upstream = HeldUpstream()
    stack, servers, script = None, {}, _script(None)
    try:
        stack = BenchStack(upstream.url)
        org = f"bench-{uuid.uuid4().hex[:8]}.example.com"
        seed = {"org": {"title": "Bench", "mainDomain": org, "product": "default"},
                "admin": {"email": "a@example.com", "firstName": "A", "lastName": "B"}}
        stack.http("POST", "/internal/seed", seed, {"X-Internal-Token": stack.env["INTERNAL_API_TOKEN"]}, timeout=180)
        token = bench_token(org, scopes=("read", "write"), role="admin")
        _status, record = stack.http("POST", "/api/v1/entities/deals/records", {"name": "Bench",
                                     "fields": {"stage": "new", "amount": 1}}, {"Authorization": f"Bearer {token}"})
        for threads in counts:
            port = free_port()
            proc = start_gunicorn(stack.env["DATABASE_URL"], port, REDIS_URL=stack.env["REDIS_URL"], ENV_FILE="",
                                  GUNICORN_THREADS=str(threads), WEB_CONCURRENCY="2")
            servers[threads] = (proc, f"http://127.0.0.1:{port}/api/v1/entities/deals/records/{record['id']}")
        results: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for round_no in range(ROUNDS):
            for connections in (8, 32):
                for threads, (proc, url) in servers.items():
                    wrk(url, connections, token, 1, script)
                    pids = worker_pids(proc.pid)
                    before = sum(cpu_seconds(p) for p in pids)
                    r = wrk(url, connections, token, SECONDS, script)
                    cpu_ms = 1000 * (sum(cpu_seconds(p) for p in pids) - before) / max(r["requests"], 1)
                    results.setdefault((threads, connections), []).append((r["rate"], cpu_ms, r["P95"]))
                    print(round_no, threads, connections, round(r["rate"]), round(cpu_ms, 3), flush=True)
        rows = [[threads, connections, statistics.median(x[0] for x in runs), statistics.median(x[2] for x in runs),
                 statistics.median(x[1] for x in runs)] for (threads, connections), runs in sorted(results.items())]
        print(table(["GUNICORN_THREADS", "connections", "req/s", "p95 ms", "worker CPU ms per request"], rows))
        print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        for proc, _url in servers.values():
            stop(proc)
        if stack is not None:
            stack.stop()
        upstream.close()
        os.unlink(script)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
