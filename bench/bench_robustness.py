"""Robustness (issue 12): what the safety layers cost against the floor without them.

(1) Caller regex: a definition-style `pattern` checked with RE2 (app.jsonschema_safe) against Python's
    `re` (the floor before: jsonschema's default), on an ordinary value and on the backtracking case
    `^(a+)+$` with n × "a" + "!" (Python's `re` only up to n = 22 here: it doubles per character).
(2) JSON body parsing: app.jsonbody.loads (UTF-8, depth walk, surrogate scan) against plain
    `json.loads`, on a 500-record bulk body and on one with `\\uXXXX` escapes (which turns the string
    scan on).
(3) Outbox: POST a record on a definition with embeddings enabled and a real Redis (no worker; the
    task is only queued), with the outbox (an INSERT in the request's transaction, a DELETE after the
    send) against the floor: sending after commit without a record of it. Needs REDIS_URL; skipped
    otherwise. Interleaved rounds.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid

from bench.common import bench_app, bench_token, summary, table, timed, write_result


def _regex_rows() -> list[list[object]]:
    from app.jsonschema_safe import compile_pattern

    rows = []
    normal = r"^[A-Z]{2}-\d{4,6}$"
    value = "AB-123456"
    program, python = compile_pattern(normal), re.compile(normal)
    rows.append(["ordinary pattern, RE2 (µs)", summary(timed(lambda: program.search(value), 20000))["p50"] * 1000])
    rows.append(["ordinary pattern, Python re (µs)", summary(timed(lambda: python.search(value), 20000))["p50"] * 1000])
    bomb_re2, bomb_py = compile_pattern(r"^(a+)+$"), re.compile(r"^(a+)+$")
    for n in (18, 22, 40, 10000):
        text = "a" * n + "!"
        rows.append([f"^(a+)+$ on {n}×a+!, RE2 (ms)", summary(timed(lambda t=text: bomb_re2.search(t), 50, 5))["p50"]])
        if n <= 22:
            start = time.perf_counter()
            bomb_py.search(text)
            rows.append([f"^(a+)+$ on {n}×a+!, Python re (ms)", (time.perf_counter() - start) * 1000])
    return rows


def _json_rows() -> list[list[object]]:
    from app.jsonbody import loads

    records = [{"name": f"record {i}", "fields": {"title": f"title {i}", "qty": i, "tags": ["a", "b"],
                                                  "meta": {"k": {"v": i}}}} for i in range(500)]
    plain = json.dumps({"records": records}).encode()
    escaped = json.dumps({"records": records, "note": "caf\u00e9 \U0001F600"}, ensure_ascii=True).encode()
    rows = []
    for label, body in (("500-record bulk body", plain), ("same with \\u escapes", escaped)):
        ours = summary(timed(lambda b=body: loads(b), 300))["p50"]
        floor = summary(timed(lambda b=body: json.loads(b), 300))["p50"]
        rows.append([f"{label} ({len(body) // 1024} KiB): app.jsonbody.loads (ms)", ours])
        rows.append([f"{label}: json.loads (ms)", floor])
    return rows


def _outbox_rows() -> list[list[object]]:
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        return [["outbox (skipped: REDIS_URL not set)", "-"]]
    import redis
    from sqlalchemy import event

    import app.tasks as tasks_module

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    app = bench_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix, RATE_LIMIT_BULK="0")
    client = app.test_client()
    org = f"bench-outbox-{uuid.uuid4().hex[:6]}"
    headers = {"Authorization": f"Bearer {bench_token(org)}"}
    resp = client.post("/api/v1/entities/definitions", headers=headers, json={
        "name": "notes", "schema": {"type": "object", "properties": {"body": {"type": "text"}}},
        "embeddingsConfig": {"enabled": True, "fields": ["body"]}})
    assert resp.status_code == 201, resp.get_json()
    real = tasks_module.enqueue_after_commit

    def without_outbox(session, task, *args, **kwargs):  # the floor: send after commit, nothing recorded
        session.info.setdefault("_pending_tasks", []).append((task, args, kwargs, None))
        if not session.info.get("_task_hooks"):
            session.info["_task_hooks"] = True
            event.listen(session, "after_commit", tasks_module._flush_pending)
            event.listen(session, "after_soft_rollback", tasks_module._drop_pending)

    def create():
        r = client.post("/api/v1/entities/notes/records", headers=headers, json={"fields": {"body": "hello"}})
        assert r.status_code == 201

    with_samples, floor_samples = [], []
    try:
        for _ in range(5):
            tasks_module.enqueue_after_commit = real
            with_samples += timed(create, 100, warmup=5)
            tasks_module.enqueue_after_commit = without_outbox
            floor_samples += timed(create, 100, warmup=5)
    finally:
        tasks_module.enqueue_after_commit = real
        conn = redis.Redis.from_url(redis_url)
        for key in conn.scan_iter(f"{prefix}*"):
            conn.delete(key)
    ours, floor = summary(with_samples), summary(floor_samples)
    return [["record create + embedding task, with outbox: p50 / p99 (ms)", f"{ours['p50']:.2f} / {ours['p99']:.2f}"],
            ["same, send after commit without outbox (floor): p50 / p99 (ms)",
             f"{floor['p50']:.2f} / {floor['p99']:.2f}"]]


def main() -> str:
    rows = _regex_rows() + _json_rows() + _outbox_rows()
    body = table(["measure", "value"], rows)
    return write_result("robustness", "Robustness: RE2, the JSON layer, the outbox", body, __doc__.split("\n\n", 1)[1])
