"""Same-process A/B of the fast lanes (app.fields.FastLane) against an earlier revision of app/fields.py,
interleaved round by round so that the machine's load hits both sides alike:

    .venv/bin/python -m bench.ab_fast_lane [ROUNDS] [REV]

A = `FastLane` as app/fields.py was at REV (default c0e6edb: one closure per field), B = as shipped (one
generated function per schema class). Per case: median µs per `lane.load` of each side (and quartiles),
the median of the per-round ratio B/A, and marshmallow's own load for scale (for the batch only the outer
schema: its events are `FastLoad`, so marshmallow's `Nested` loads them by their lane).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marshmallow import Schema

import app.fields as shipped
from app.analytics.schemas import AnalyticsEventSchema, EventBatchSchema
from app.entities.schemas import CountRequestSchema, QueryRequestSchema

CHAT = {"sessionId": "s-123", "userId": "u-456", "eventType": "message", "eventCategory": "chat",
        "eventId": "evt-0001", "timestamp": "2026-11-23T10:00:00Z", "pagePath": "/chat",
        "properties": {"chatId": "c-1", "agentId": "a-1", "channel": "web", "direction": "inbound", "model": "gpt",
                       "inputTokens": 120, "outputTokens": 48, "cost": 0.0021}}
PAGE = {"sessionId": "s-123", "userId": "u-456", "eventType": "page_view", "eventCategory": "navigation",
        "pagePath": "/pricing", "properties": {"referrer": "/home"}}
BATCH = {"events": [dict(CHAT, eventId=f"e{i}") if i % 2 else dict(PAGE) for i in range(100)]}
QUERY = {"query": {"page": 2, "pageSize": 50, "filters": {"status": "open", "priority": {"$gte": 2}},
                   "sortBy": "createdAt", "sortOrder": -1, "include": ["title", "status"]}}
COUNT = {"filters": {"status": "open"}}
CASES = [("chat event", AnalyticsEventSchema, CHAT, 2000), ("page-view event", AnalyticsEventSchema, PAGE, 2000),
         ("batch of 100", EventBatchSchema, BATCH, 20), ("query body", QueryRequestSchema, QUERY, 3000),
         ("count body", CountRequestSchema, COUNT, 10000)]


def earlier(rev: str):
    text = subprocess.run(["git", "show", f"{rev}:app/fields.py"], capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "fields_earlier.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("fields_earlier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.StrictInt = shipped.StrictInt  # the schemas' field class (the lanes compare classes by identity)
    return module


def per_load(lane, schema, body, n: int) -> float:
    load = lane.load
    start = time.perf_counter()
    for _ in range(n):
        load(schema, body)
    return (time.perf_counter() - start) / n * 1e6


def main(rounds: int, rev: str) -> None:
    old = earlier(rev)
    for name, cls, body, n in CASES:
        schema = cls()
        a, b = old.FastLane(schema), shipped.FastLane(schema)
        assert a.load(schema, body) == b.load(schema, body) == Schema.load(schema, body)
        times_a, times_b, ratios = [], [], []
        for r in range(rounds):
            if r % 2:
                ta = per_load(a, schema, body, n)
                tb = per_load(b, schema, body, n)
            else:
                tb = per_load(b, schema, body, n)
                ta = per_load(a, schema, body, n)
            times_a.append(ta)
            times_b.append(tb)
            ratios.append(tb / ta)
        start, m = time.perf_counter(), max(1, n // 10)
        for _ in range(m):
            Schema.load(schema, body)
        plain = (time.perf_counter() - start) / m * 1e6

        def spread(xs):
            q1, _, q3 = statistics.quantiles(xs, n=4)
            return f"{statistics.median(xs):8.2f} µs ({q1:.2f}-{q3:.2f})"
        print(f"{name:16} A {spread(times_a)} | B {spread(times_b)} | B/A {statistics.median(ratios):.2f}"
              f" | marshmallow {plain:.1f} µs", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 61, sys.argv[2] if len(sys.argv) > 2 else "c0e6edb")
