"""The Python client's overhead per call against raw httpx, on a record GET (same run, same server).

(1) Over HTTP: gunicorn as configured (docker/gunicorn.conf.py) on loopback, one record of a small
    definition. Raw httpx (`http.get(path, headers=…)`, status check, `.json()`) and the client
    (`api.entities.records.get(entity, id)`: token provider, request building, retry loop, error mapping,
    JSON) alternate in ROUNDS rounds of CALLS calls each, so load changes hit both alike. Reported: wall
    time per call (p50, p99) and the CPU time the calling process spent per call (time.process_time: what
    the client adds, independent of the server and of the machine's load).
(2) Without a network: both against httpx.MockTransport answering the same bytes the server answered,
    so the difference is the client's own code and nothing else (CPU per call, many calls).
The async client is measured the same way in (2) (httpx.AsyncClient, one event loop).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import httpx

from bench.bench_records_http import free_port, start_gunicorn, stop
from bench.common import bench_database_url, bench_token, percentile, table, write_result

ROUNDS, CALLS = 20, 50
OFFLINE_CALLS = 20000
SCHEMA = {"type": "object", "required": ["title"], "properties": {
    "title": {"type": "string"}, "amount": {"type": "float"}, "stage": {"type": "dropdown",
                                                                        "options": ["lead", "won", "lost"]}}}


def _measure(fn, n: int) -> tuple[list[float], float]:
    """(wall ms per call, process CPU µs per call) of n calls."""
    walls = []
    cpu = time.process_time()
    for _ in range(n):
        start = time.perf_counter()
        fn()
        walls.append((time.perf_counter() - start) * 1000)
    return walls, (time.process_time() - cpu) / n * 1e6


def _raw_get(http: httpx.Client, path: str, headers: dict[str, str]):
    def call():
        response = http.get(path, headers=headers)
        if response.status_code != 200:
            raise RuntimeError(response.text)
        return response.json()
    return call


def over_http(base: str, token: str, path: str, entity: str, record_id: str) -> list[list[object]]:
    from platform_gateway_client import Client

    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    raw_http, client_http = httpx.Client(base_url=base), httpx.Client(base_url=base)
    api = Client(token=lambda: token, http=client_http)
    raw = _raw_get(raw_http, path, headers)

    def client_call():
        return api.entities.records.get(entity, record_id)

    assert raw() == client_call()  # the same answer both ways
    for fn in (raw, client_call):
        _measure(fn, 50)  # warm-up: connections, caches
    walls: dict[str, list[float]] = {"raw": [], "client": []}
    cpus: dict[str, list[float]] = {"raw": [], "client": []}
    for _ in range(ROUNDS):
        for name, fn in (("raw", raw), ("client", client_call)):
            w, c = _measure(fn, CALLS)
            walls[name] += w
            cpus[name].append(c)
    raw_http.close()
    client_http.close()
    rows = []
    for name, label in (("raw", "raw httpx.Client.get + .json()"), ("client", "Client.entities.records.get")):
        cpu = sum(cpus[name]) / len(cpus[name])
        rows.append([label, len(walls[name]), percentile(walls[name], 0.5), percentile(walls[name], 0.99), cpu])
    rows.append(["client − raw", "", rows[1][2] - rows[0][2], "", rows[1][4] - rows[0][4]])
    return rows


def offline(body: bytes, path: str, entity: str, record_id: str, token: str) -> list[list[object]]:
    from platform_gateway_client import AsyncClient, Client

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    raw_http = httpx.Client(base_url="http://bench", transport=httpx.MockTransport(answer))
    api = Client(token=token, http=httpx.Client(base_url="http://bench", transport=httpx.MockTransport(answer)))
    raw = _raw_get(raw_http, path, headers)
    rows = []
    for label, fn in (("raw httpx.Client.get + .json()", raw),
                      ("Client.entities.records.get", lambda: api.entities.records.get(entity, record_id))):
        _measure(fn, 500)
        _, cpu = _measure(fn, OFFLINE_CALLS)
        rows.append([label, OFFLINE_CALLS, cpu])

    async def run_async() -> list[list[object]]:
        raw_async = httpx.AsyncClient(base_url="http://bench", transport=httpx.MockTransport(answer))
        aapi = AsyncClient(token=token, http=httpx.AsyncClient(base_url="http://bench",
                                                                transport=httpx.MockTransport(answer)))

        async def raw_call():
            response = await raw_async.get(path, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(response.text)
            return response.json()

        out = []
        for label, fn in (("raw httpx.AsyncClient.get + .json()", raw_call),
                          ("AsyncClient.entities.records.get", lambda: aapi.entities.records.get(entity, record_id))):
            for _ in range(500):
                await fn()
            cpu = time.process_time()
            for _ in range(OFFLINE_CALLS):
                await fn()
            out.append([label, OFFLINE_CALLS, (time.process_time() - cpu) / OFFLINE_CALLS * 1e6])
        return out

    rows += asyncio.run(run_async())
    return rows


def main() -> str:
    url = bench_database_url()
    port = free_port()
    proc = start_gunicorn(url, port)
    base = f"http://127.0.0.1:{port}"
    org = f"bench-client-{uuid.uuid4().hex[:8]}"
    token = bench_token(org)
    try:
        from platform_gateway_client import Client

        with Client(base, token=token) as setup:
            setup.entities.definitions.create({"name": "deals", "displayName": "Deals", "schema": SCHEMA})
            record = setup.entities.records.create("deals", {"name": "ACME renewal", "fields": {
                "title": "ACME renewal", "amount": 1200.0, "stage": "lead"}, "tags": ["q4"]})
        path = f"/api/v1/entities/deals/records/{record['id']}"
        http_rows = over_http(base, token, path, "deals", record["id"])
        body = httpx.get(base + path, headers={"Authorization": f"Bearer {token}"}).content
    finally:
        stop(proc)
    offline_rows = offline(body, path, "deals", record["id"], token)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = ("### (1) Over HTTP: gunicorn on loopback, calls alternating in rounds\n\n"
            + table(["caller", "calls", "p50 ms", "p99 ms", "caller CPU µs per call"], http_rows)
            + "\n\n### (2) Without a network (httpx.MockTransport answering the server's bytes)\n\n"
            + table(["caller", "calls", "caller CPU µs per call"], offline_rows)
            + f"\n\nMachine load average (1/5/15 min) at the end: {load}.")
    notes = (f"(1): gunicorn -c docker/gunicorn.conf.py (WEB_CONCURRENCY=2 × 128 threads), one keep-alive "
             f"connection per caller, {ROUNDS} rounds × {CALLS} calls each way, raw and client alternating per "
             f"round; the record is {len(body)} bytes of JSON. Caller CPU is time.process_time() of this process "
             "per call (server time excluded); wall times include the server and move with the machine's load. "
             f"(2): {OFFLINE_CALLS} calls each after 500 warm-up calls; the client's extra work per call is the "
             "token provider call, the Call object and its Idempotency/headers assembly, the retry loop's "
             "bookkeeping, path quoting, and the typed-answer cast (a no-op at run time).")
    return write_result("client", "Python client overhead per call against raw httpx (record GET)", text, notes)


if __name__ == "__main__":
    main()
