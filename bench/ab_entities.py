"""Same-process A/B of the query engine's per-request levers (stop 20), interleaved call by call so that
the machine's load hits both sides alike:

    .venv/bin/python -m bench.ab_entities [N] [shaped|json|driver|scan]

A = no definition cache (the definition read and compiled per request) and the projected count and
page as two statements; with `shaped`, A = every statement through SQLAlchemy's own compiled cache
instead of db.execute_shaped's per-shape SQL (db.SHAPED = False); with `json`, A = the page's records
decoded column by column and shaped in Python (query.RECORD_JSON = False); with `driver`, A = the
shaped SQL run through SQLAlchemy's exec_driver_sql and its result objects (db.DRIVER_ROWS = False);
with `scan`, A = JSON values decoded by json.loads itself (db.SCAN_JSON = False); B = as shipped.
For query (a)-(e) and the count: p50 CPU time of the calling thread per call (time.thread_time) and
p50 wall time, N calls per side.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

from bench.bench_entities import COUNT_FILTER, ENTITY, QUERIES, bench_setup
from bench.common import percentile


@contextmanager
def side(b: bool, lever: str | None = None):
    from app import db
    from app.entities import query
    from app.entities.services import definitions

    original = definitions.cached_definition
    if not b and lever == "shaped":
        db.SHAPED = False
    elif not b and lever == "json":
        query.RECORD_JSON = False
    elif not b and lever == "driver":
        db.DRIVER_ROWS = False
    elif not b and lever == "scan":
        db.SCAN_JSON = False
    elif not b:
        definitions.cached_definition = lambda name: None
        query.COUNT_WITH_PAGE = False
    try:
        yield
    finally:
        definitions.cached_definition = original
        query.COUNT_WITH_PAGE = query.RECORD_JSON = db.SHAPED = db.DRIVER_ROWS = db.SCAN_JSON = True


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "300"))
    lever = next((a for a in sys.argv[1:] if a in ("shaped", "json", "driver", "scan")), None)
    url, app, ids, capture, client, headers = bench_setup()
    calls = {}
    for key in ("(a)", "(b)", "(c)", "(d)", "(e)"):
        params = next(v for k, v in QUERIES.items() if k.startswith(key))
        calls[f"query {key}"] = lambda params=params: client.post(
            f"/api/v1/entities/{ENTITY}/records/query", json={"query": params}, headers=headers)
    calls["count"] = lambda: client.post(f"/api/v1/entities/{ENTITY}/records/count",
                                         json={"filters": COUNT_FILTER}, headers=headers)
    calls["/me"] = lambda: client.get("/api/v1/me", headers=headers)
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; {n} calls per side")
    for name, fn in calls.items():
        cpu: dict[bool, list[float]] = {False: [], True: []}
        wall: dict[bool, list[float]] = {False: [], True: []}
        for b in (False, True):
            with side(b, lever):
                a_resp = fn()
                assert a_resp.status_code == 200, a_resp.get_json()
                for _ in range(10):
                    fn()
        for i in range(n):
            for b in ((False, True) if i % 2 else (True, False)):
                with side(b, lever):
                    start, c = time.perf_counter(), time.thread_time()
                    fn()
                    cpu[b].append((time.thread_time() - c) * 1000)
                    wall[b].append((time.perf_counter() - start) * 1000)
        ca, cb = percentile(cpu[False], .5), percentile(cpu[True], .5)
        wa, wb = percentile(wall[False], .5), percentile(wall[True], .5)
        print(f"{name:10s} CPU p50 A {ca:5.2f} B {cb:5.2f} ms (B−A {cb - ca:+.2f})   "
              f"wall p50 A {wa:5.2f} B {wb:5.2f} ms (B−A {wb - wa:+.2f})")
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
