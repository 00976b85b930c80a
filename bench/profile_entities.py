"""Where the fixed cost of an entity read goes (issue 14): the bench's in-process calls, profiled.

    .venv/bin/python -m bench.profile_entities [N] [--cprofile]

On the entities benchmark's data set (bench.bench_entities builds it on first use), for each of
query (b), (c), (d), the count, a record GET and `/api/v1/me` (the Flask layer alone): p50 wall time
of N calls, the CPU time of the calling thread (less distorted by other load on the machine than wall
time), and the time inside cursor.execute from the engine's cursor events (statements run through
`db.read_first`'s driver cursor are not seen), so the rest is mostly the app's Python. With
`--cprofile`, the top functions by cumulative time over N calls of each.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

from sqlalchemy import event

from bench.bench_entities import BIG_ORG, COUNT_FILTER, ENTITY, QUERIES, SCHEMA, bench_setup, psycopg_url
from bench.common import percentile


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "300"))
    profile = "--cprofile" in sys.argv
    url, app, ids, capture, client, headers = bench_setup()
    import psycopg

    with psycopg.connect(psycopg_url(url)) as conn:
        record_id = conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active LIMIT 1",
                                 (BIG_ORG,)).fetchone()[0]
    sql = {"t": 0.0}

    def before(*_a):
        sql["start"] = time.perf_counter()

    def after(*_a):
        sql["t"] += time.perf_counter() - sql["start"]

    from app.extensions import db
    event.listen(db.engine, "before_cursor_execute", before)
    event.listen(db.engine, "after_cursor_execute", after)

    calls = {}
    for key in ("(b)", "(c)", "(d)"):
        params = next(v for k, v in QUERIES.items() if k.startswith(key))
        calls[f"query {key}"] = lambda params=params: client.post(
            f"/api/v1/entities/{ENTITY}/records/query", json={"query": params}, headers=headers)
    calls["count"] = lambda: client.post(f"/api/v1/entities/{ENTITY}/records/count",
                                         json={"filters": COUNT_FILTER}, headers=headers)
    calls["record GET"] = lambda: client.get(f"/api/v1/entities/{ENTITY}/records/{record_id}", headers=headers)
    calls["/me"] = lambda: client.get("/api/v1/me", headers=headers)
    for name, fn in calls.items():
        assert fn().status_code == 200, (name, fn().get_json())
    for _round in range(2):
        for name, fn in calls.items():
            walls, cpus, sqls = [], [], []
            for _ in range(20):
                fn()
            for _ in range(n):
                sql["t"] = 0.0
                start, cpu = time.perf_counter(), time.thread_time()
                fn()
                cpus.append((time.thread_time() - cpu) * 1000)
                walls.append((time.perf_counter() - start) * 1000)
                sqls.append(sql["t"] * 1000)
            rest = [w - s for w, s in zip(walls, sqls, strict=True)]
            print(f"{name:12s} p50 {percentile(walls, .5):6.2f} ms  CPU of this thread p50 {percentile(cpus, .5):5.2f}"
                  f"  in cursor.execute p50 {percentile(sqls, .5):5.2f}  rest p50 {percentile(rest, .5):5.2f}")
    if profile:
        for name, fn in calls.items():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                fn()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
            print(f"\n===== {name} ({n} calls) =====\n" + out.getvalue())


if __name__ == "__main__":
    main()
