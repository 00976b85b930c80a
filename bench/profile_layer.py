"""The fixed per-request layer's CPU (issue 25): what every request pays besides its own query.

    .venv/bin/python -m bench.profile_layer [N] [--http] [--rounds R]

1. In-process (Flask test client, no gunicorn): the calling thread's CPU per request for `GET
   /api/v1/me` (the layer alone: token, hooks, envelope), a record GET, the count of three equalities
   and the page query (a) of the entity benchmark. R rounds (5) of N calls (300) after a warm-up; the
   lowest round median is reported (other load on the machine only adds to it).
2. With `--http`: gunicorn as configured (docker/gunicorn.conf.py) with one worker, wrk `-t1` at 8
   connections for 8 s per route (record GET, `/api/v1/me`): the worker process's CPU (every thread,
   from /proc) per request, so the gthread machinery around the app is included.
"""

from __future__ import annotations

import os
import sys
import time

from bench.bench_entities import BIG_ORG, COUNT_FILTER, ENTITY, QUERIES, SCHEMA, bench_setup, psycopg_url
from bench.common import bench_token, percentile


def _arg(name: str, default: int) -> int:
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def _record_id(url: str) -> str:
    import psycopg

    with psycopg.connect(psycopg_url(url)) as conn:
        return conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active "
                            "ORDER BY id LIMIT 1", (BIG_ORG,)).fetchone()[0]


def in_process(n: int, rounds: int) -> None:
    url, _app, _ids, _capture, client, headers = bench_setup()
    record_id = _record_id(url)
    page_a = next(v for k, v in QUERIES.items() if k.startswith("(a)"))
    calls = {
        "GET /api/v1/me": lambda: client.get("/api/v1/me", headers=headers),
        "record GET": lambda: client.get(f"/api/v1/entities/{ENTITY}/records/{record_id}", headers=headers),
        "count (3 equalities)": lambda: client.post(f"/api/v1/entities/{ENTITY}/records/count",
                                                    json={"filters": COUNT_FILTER}, headers=headers),
        "page query (a)": lambda: client.post(f"/api/v1/entities/{ENTITY}/records/query",
                                              json={"query": page_a}, headers=headers),
    }
    for name, fn in calls.items():
        response = fn()
        assert response.status_code == 200, (name, response.get_json())
    best = {name: float("inf") for name in calls}
    for _round in range(rounds):
        for name, fn in calls.items():
            for _ in range(30):
                fn()
            cpus = []
            for _ in range(n):
                cpu = time.thread_time()
                fn()
                cpus.append((time.thread_time() - cpu) * 1000)
            best[name] = min(best[name], percentile(cpus, .5))
    print(f"in-process, thread CPU ms per request (lowest of {rounds} round medians, {n} calls each); "
          f"load {os.getloadavg()[0]:.1f}")
    for name, value in best.items():
        print(f"  {name:22s} {value:6.3f}")


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime of every thread


def over_http() -> None:
    from bench.bench_records_http import free_port, start_gunicorn, stop, worker_pids, wrk

    url, _app, _ids, _capture, _client, _headers = bench_setup()
    record_id = _record_id(url)
    port = free_port()
    proc = start_gunicorn(url, port, WEB_CONCURRENCY="1")
    token = bench_token(BIG_ORG)
    tick = os.sysconf("SC_CLK_TCK")
    try:
        (worker,) = worker_pids(proc.pid)
        routes = {"record GET": f"http://127.0.0.1:{port}/api/v1/entities/{ENTITY}/records/{record_id}",
                  "GET /api/v1/me": f"http://127.0.0.1:{port}/api/v1/me"}
        print(f"gunicorn, one worker, wrk -t2 -c8 8 s: worker CPU ms per request; load {os.getloadavg()[0]:.1f}")
        for name, route in routes.items():
            wrk(route, 8, token, 2)
            before = _cpu_ticks(worker)
            result = wrk(route, 8, token, 8)
            cpu = (_cpu_ticks(worker) - before) / tick
            requests = result["rate"] * 8
            print(f"  {name:22s} {cpu / requests * 1000:6.3f} ms CPU, {result['rate']:7.0f} req/s, "
                  f"p50 {result['p50']:.2f} ms")
    finally:
        stop(proc)


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "300"))
    if "--http" in sys.argv:
        over_http()
    else:
        in_process(n, _arg("--rounds", 5))


if __name__ == "__main__":
    main()
