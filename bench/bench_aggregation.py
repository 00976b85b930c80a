"""Entity aggregation: POST …/records/aggregate against the same SQL run straight through psycopg.

Data set: the entity store benchmark's (bench/bench_entities.py, generated once with COPY and reused):
org `bench-big` holds 100 000 `deals` records. Its `created_at` values are one second apart (about
1.2 days), so `last_contact:day` (spread over ~2 years) is added to show a many-group case.

For each request, p50/p99 through the app in-process (Flask test client: routing, JWT auth, tenancy,
marshmallow, planning, the SQL compiler, SQLAlchemy, JSON) next to the floor: the very statement the
app sent (captured from the engine) replayed through one psycopg connection, interleaved with the app
runs. A third column runs the statement a person would write by hand for the same answer (groups and
totals, `(fields->>'x')::numeric` casts) to show what the generated SQL costs against idiomatic SQL.
EXPLAIN (ANALYZE) of each captured statement is written below the table.
"""

from __future__ import annotations

import os

import psycopg

from bench.bench_entities import (
    BIG_ORG,
    ENTITY,
    SCHEMA,
    bench_setup,
    explain,
    floor_runner,
    measure,
    psycopg_url,
)
from bench.common import summary, table, write_result

SCOPE = f"FROM {SCHEMA}.entity_records WHERE org_id = %(org)s AND entity_id = %(entity)s AND is_active"
REQUESTS = {
    "groupBy created_at:day; count, avg amount, percentile 0.9 amount": (
        {"groupBy": ["created_at:day"], "aggregates": [
            {"function": "count"}, {"function": "avg", "field": "amount"},
            {"function": "percentile", "field": "amount", "percentile": 0.9}]},
        f"""SELECT k, count(*), avg(amount), percentile_cont(0.9) WITHIN GROUP (ORDER BY amount)
            FROM (SELECT date_trunc('day', created_at AT TIME ZONE 'UTC') AS k,
                         (fields->>'amount')::numeric AS amount {SCOPE}) r
            GROUP BY GROUPING SETS ((k), ()) ORDER BY grouping(k) DESC, k LIMIT 1002"""),
    "groupBy status (dropdown); sum amount, distinct_count owner_email": (
        {"groupBy": ["status"], "aggregates": [
            {"function": "sum", "field": "amount"}, {"function": "distinct_count", "field": "owner_email"}]},
        f"""SELECT k, sum(amount), count(DISTINCT owner), count(*)
            FROM (SELECT fields->>'status' AS k, (fields->>'amount')::numeric AS amount,
                         NULLIF(fields->>'owner_email', '') AS owner {SCOPE}) r
            GROUP BY GROUPING SETS ((k), ()) ORDER BY grouping(k) DESC, k LIMIT 1002"""),
    "groupBy last_contact:day (≈700 groups); count, avg amount, percentile 0.9 amount": (
        {"groupBy": ["last_contact:day"], "aggregates": [
            {"function": "count"}, {"function": "avg", "field": "amount"},
            {"function": "percentile", "field": "amount", "percentile": 0.9}]},
        f"""SELECT k, count(*), avg(amount), percentile_cont(0.9) WITHIN GROUP (ORDER BY amount)
            FROM (SELECT date_trunc('day', (fields->>'last_contact')::timestamptz AT TIME ZONE 'UTC') AS k,
                         (fields->>'amount')::numeric AS amount {SCOPE}) r
            GROUP BY GROUPING SETS ((k), ()) ORDER BY grouping(k) DESC, k LIMIT 1002"""),
}


def main() -> str:
    url, app, ids, capture, client, headers = bench_setup()
    params = {"org": BIG_ORG, "entity": ids[BIG_ORG]}
    rows, plans = [], []
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        for label, (request, hand_sql) in REQUESTS.items():
            def call(request=request):
                resp = client.post(f"/api/v1/entities/{ENTITY}/records/aggregate", json=request, headers=headers)
                assert resp.status_code == 200, resp.get_json()
                return resp
            statements = [s for s in capture.during(call) if "entity_records" in s[0]]
            assert len(statements) == 1, "one SQL statement per aggregate request"
            body = call().get_json()
            hand = floor_runner(conn, [(hand_sql, params)])
            assert len(conn.execute(hand_sql, params).fetchall()) == len(body["groups"]) + 1
            app_ms, floor_ms = measure(call, floor_runner(conn, statements))
            _, hand_ms = measure(hand, hand)
            a, f, h = summary(app_ms), summary(floor_ms), summary(hand_ms)
            rows.append([f"{label} — {len(body['groups'])} groups", a["p50"], a["p99"], f["p50"], f["p99"],
                         a["p50"] / f["p50"], h["p50"], f["p50"] / h["p50"]])
            plans.append(f"**{label}**\n\n{explain(conn, statements)}")
    body = table(["aggregate request on the 100k-record org", "app p50 ms", "app p99 ms", "same SQL p50 ms",
                  "same SQL p99 ms", "p50 ratio app/SQL", "hand-written SQL p50 ms",
                  "p50 ratio generated/hand-written"], rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"Machine load average (1/5/15 min) at the end: {load} — other work shares the 2 cores, so "
             "absolute times are noisy; the interleaved ratios are the meaningful figures.\n\n"
             "App = in-process Flask test client (no network); same SQL = the statement the app sent, "
             "captured from the engine and replayed with its parameters through one psycopg connection, "
             "interleaved with the app runs; hand-written = an equivalent GROUPING SETS query with plain "
             "`(fields->>'x')::numeric` casts (it does not guard against non-numeric values the way the "
             "generated SQL does).\n\n### EXPLAIN (ANALYZE) of the captured statements\n\n" + "\n\n".join(plans))
    return write_result("aggregation", "Entity aggregation benchmark", body, notes)


if __name__ == "__main__":
    main()
