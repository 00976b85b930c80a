"""Idempotency keys: a replayed image call against the original, and what a key costs a request.

(1) Image calls (POST /api/v1/agents/images, provider-a general) through the WSGI test client against
    the fake upstream of bench_images (a child process on loopback answering a ~1 MB PNG after
    UPSTREAM_DELAY): originals without a key, originals each with a new key (claim + stored answer),
    and replays of one key (the stored ~0.5 KB answer, no upstream call, no blob write).
(2) Record creates (POST /api/v1/entities/<name>/records): without a key, with a new key each, and
    replays: the key's own cost on a cheap write.

Wall-clock latency and the process CPU time of the gateway per call (the upstream runs in another
process, so its work is not counted); loopback only, about a minute.
"""

from __future__ import annotations

import os
import time
import uuid

from bench.bench_images import API_KEY, BODY, FakeUpstream, noise_png
from bench.common import bench_app, bench_token, percentile, table, write_result

UPSTREAM_DELAY = 1.0  # seconds: a slow image call (the real ones take up to 120 s)
IMAGE_CALLS = 15
REPLAYS = 300
RECORD_CALLS = 300
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "qty": {"type": "int"}}}


def _measure(call, n: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(n):
        start, cpu_start = time.perf_counter(), time.process_time()
        call()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - cpu_start) * 1000)
    return wall, cpu


def _expect(resp, status: int, replayed: bool) -> None:
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert (resp.headers.get("Idempotent-Replayed") == "true") is replayed, dict(resp.headers)


def images() -> dict[str, tuple[list[float], list[float]]]:
    upstream = FakeUpstream(noise_png(600, 580), UPSTREAM_DELAY)
    try:
        app = bench_app(PROVIDER_A_ENDPOINT=upstream.url, PROVIDER_A_API_KEY=API_KEY)
        client = app.test_client()
        headers = {"Authorization": f"Bearer {bench_token(f'bench-idem-{uuid.uuid4().hex[:8]}', ['write:image-gen'])}"}
        url = "/api/v1/agents/images"
        for _ in range(3):  # warm-up: pooled connections, imports, first blob directory
            _expect(client.post(url, json=BODY, headers=headers), 200, False)
        plain = _measure(lambda: _expect(client.post(url, json=BODY, headers=headers), 200, False), IMAGE_CALLS)
        keyed = _measure(lambda: _expect(client.post(url, json=BODY, headers=headers | {
            "Idempotency-Key": str(uuid.uuid4())}), 200, False), IMAGE_CALLS)
        one = headers | {"Idempotency-Key": str(uuid.uuid4())}
        _expect(client.post(url, json=BODY, headers=one), 200, False)
        replay = _measure(lambda: _expect(client.post(url, json=BODY, headers=one), 200, True), REPLAYS)
        return {"plain": plain, "keyed": keyed, "replay": replay}
    finally:
        upstream.close()


def records() -> dict[str, tuple[list[float], list[float]]]:
    app = bench_app()
    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token(f'bench-idem-{uuid.uuid4().hex[:8]}')}"}
    made = client.post("/api/v1/entities/definitions", json={"name": "items", "displayName": "Items",
                                                            "schema": SCHEMA}, headers=headers)
    assert made.status_code == 201, made.get_json()
    url, body = "/api/v1/entities/items/records", {"fields": {"title": "bench", "qty": 1}}
    for _ in range(20):
        _expect(client.post(url, json=body, headers=headers), 201, False)
    plain = _measure(lambda: _expect(client.post(url, json=body, headers=headers), 201, False), RECORD_CALLS)
    keyed = _measure(lambda: _expect(client.post(url, json=body, headers=headers | {
        "Idempotency-Key": str(uuid.uuid4())}), 201, False), RECORD_CALLS)
    one = headers | {"Idempotency-Key": str(uuid.uuid4())}
    _expect(client.post(url, json=body, headers=one), 201, False)
    replay = _measure(lambda: _expect(client.post(url, json=body, headers=one), 201, True), RECORD_CALLS)
    return {"plain": plain, "keyed": keyed, "replay": replay}


def _row(label: str, samples: tuple[list[float], list[float]]) -> list:
    wall, cpu = samples
    return [label, percentile(wall, 0.5), percentile(wall, 0.99), percentile(cpu, 0.5), len(wall)]


def main() -> str:
    load_before = os.getloadavg()[0]
    image = images()
    record = records()
    load_after = os.getloadavg()[0]
    headers = ["call", "p50 ms", "p99 ms", "CPU p50 ms", "n"]
    speedup = percentile(image["keyed"][0], 0.5) / percentile(image["replay"][0], 0.5)
    body = table(headers, [
        _row(f"image, original, no key ({UPSTREAM_DELAY:g} s upstream)", image["plain"]),
        _row("image, original with a new Idempotency-Key", image["keyed"]),
        _row("image, replay of a key (no upstream call)", image["replay"]),
    ]) + f"\n\nA replayed image call answers {speedup:.0f}x faster than its original (p50).\n\n" + table(headers, [
        _row("record create, no key", record["plain"]),
        _row("record create, new Idempotency-Key", record["keyed"]),
        _row("record create, replay of a key", record["replay"]),
    ])
    return write_result(
        "idempotency", "Idempotency keys benchmark", body,
        "In-process WSGI client against the benchmark database (embedded PostgreSQL). A new key costs a claim "
        "(INSERT … ON CONFLICT DO NOTHING, its own autocommit round trip) and the stored answer (one UPDATE in "
        "the request's transaction); a replay costs the claim attempt and one SELECT, and runs nothing else. "
        "CPU = process time of the gateway process per call (the upstream is a child process). Machine load "
        f"average (1 min) {load_before:.1f} before, {load_after:.1f} after: the machine is shared, so absolute "
        "figures move with it.")


if __name__ == "__main__":
    main()
