"""CPU per entity read, app and PostgreSQL, in one process (issue 25's query path):

    .venv/bin/python -m bench.cpu_entities [N] [--save FILE] [--check FILE] [--ab | --ab-raw | --ab-plans |
        --ab-shapes | --ab-prepared]

On the entities benchmark's data set (bench.bench_entities builds it on first use), for the side-by-side
bench's queries (a)-(e), the count of three equalities and a record GET through the Flask test client:
p50 of the calling thread's CPU time (time.thread_time) and p50 of the embedded PostgreSQL server's
CPU time (its processes' /proc schedstat, autovacuum left out; bench.bench_peers.PgCpu) per call, N
calls each, interleaved. `--save FILE` writes every answer's status, headers that matter and body
bytes; `--check FILE` compares this run's answers with a saved run's, byte for byte (the answers must
not change when the engine does). `--ab`: every call also made with the driver-cursor rows and the
JSON scan off (app.db.DRIVER_ROWS, app.db.SCAN_JSON: the engine before them), interleaved, both sides
reported. `--ab-raw`: the same with a read-only request's shaped reads on its session's connection
(app.db.RAW_READS off) as the before side. `--ab-plans`: the same with a repeated read planned at every
execution (app.db.REPEATED_PLANS off) as the before side. `--ab-shapes`: the same with every filter compiled
afresh (app.entities.query.REUSE_SHAPES off: no reuse of compiled filter shapes) as the before side.
`--ab-prepared`: the same with a repeated read run through the driver's cursor (app.db.PREPARED_READS
off) as the before side.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.bench_entities import BIG_ORG, COUNT_FILTER, ENTITY, QUERIES, SCHEMA, bench_setup, psycopg_url
from bench.bench_peers import PgCpu
from bench.common import ROOT, percentile


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "200"))
    args = sys.argv[1:]
    save = args[args.index("--save") + 1] if "--save" in args else None
    check = args[args.index("--check") + 1] if "--check" in args else None
    url, app, ids, capture, client, headers = bench_setup()
    import psycopg

    with psycopg.connect(psycopg_url(url)) as conn:
        record_id = conn.execute(f"SELECT id FROM {SCHEMA}.entity_records WHERE org_id = %s AND is_active "
                                 "ORDER BY id LIMIT 1", (BIG_ORG,)).fetchone()[0]
    pg = PgCpu(os.path.join(ROOT, "var", "pg"))
    calls = {}
    for key, params in QUERIES.items():
        calls[key[:3]] = lambda params=params: client.post(
            f"/api/v1/entities/{ENTITY}/records/query", json={"query": params}, headers=headers)
    # the other answers the byte check covers: a cursor page, include/exclude, the second page
    extra = {
        "(a) page 2 by cursor": None,
        "(b) include": {"filters": {"amount": {"$gte": 1000, "$lt": 1500}}, "pageSize": 5,
                        "include": ["title", "amount"]},
        "(c) page 3 sorted asc": {"filters": {"title": {"$contains": "zephyr"}}, "page": 3, "sortBy": "amount",
                                  "sortOrder": 1},
    }
    calls["count"] = lambda: client.post(f"/api/v1/entities/{ENTITY}/records/count",
                                         json={"filters": COUNT_FILTER}, headers=headers)
    calls["GET"] = lambda: client.get(f"/api/v1/entities/{ENTITY}/records/{record_id}", headers=headers)
    answers = {}
    for name, fn in calls.items():
        resp = fn()
        assert resp.status_code == 200, (name, resp.get_json())
        answers[name] = resp
    cursor = answers["(a)"].get_json()["nextCursor"]
    extra["(a) page 2 by cursor"] = dict(next(iter(QUERIES.values())), cursor=cursor)
    for name, params in extra.items():
        answers[name] = client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": params},
                                    headers=headers)
    saved = {name: [r.status_code, r.headers.get("Preference-Applied"), r.get_data(as_text=True)]
             for name, r in answers.items()}
    if save:
        with open(save, "w") as fh:
            json.dump(saved, fh)
    if check:
        with open(check) as fh:
            before = json.load(fh)
        same = [name for name in before if before[name] == saved.get(name)]
        print(f"answers byte-identical to {check}: {len(same)} of {len(before)}"
              + ("" if len(same) == len(before) else f"; differ: {sorted(set(before) - set(same))}"))
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; {n} calls each; "
          f"page bytes (a) {len(answers['(a)'].get_data())}")
    from app import db
    from app.entities import query

    sides = (False, True) if {"--ab", "--ab-raw", "--ab-plans", "--ab-shapes", "--ab-prepared"} & set(args) else (True,)
    levers = [(db, "RAW_READS")] if "--ab-raw" in args else [(db, "DRIVER_ROWS"), (db, "SCAN_JSON")]
    if "--ab-plans" in args:
        levers = [(db, "REPEATED_PLANS")]
    if "--ab-shapes" in args:
        levers = [(query, "REUSE_SHAPES")]
    if "--ab-prepared" in args:
        levers = [(db, "PREPARED_READS")]
    app_cpu = {(name, b): [] for name in calls for b in sides}
    pg_cpu = {(name, b): [] for name in calls for b in sides}
    for _ in range(10):
        for fn in calls.values():
            fn()
    for i in range(n):
        for name, fn in calls.items():
            for b in (sides if i % 2 else sides[::-1]):
                for module, lever in levers:
                    setattr(module, lever, b)
                p0 = pg.read()
                c0 = time.thread_time()
                fn()
                app_cpu[name, b].append((time.thread_time() - c0) * 1000)
                pg_cpu[name, b].append(PgCpu.spent(p0, pg.read()) / 1e6)
    for module, lever in levers:
        setattr(module, lever, True)
    for name in calls:
        for b in sides:
            a, p = percentile(app_cpu[name, b], .5), percentile(pg_cpu[name, b], .5)
            label = "" if len(sides) == 1 else (" after " if b else " before")
            print(f"{name:6s}{label} app CPU p50 {a:5.2f}  PG CPU p50 {p:5.2f}  sum {a + p:5.2f} ms")
    print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
