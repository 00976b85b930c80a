"""App CPU per request when requests come one at a time (issue 25: the side-by-side bench's A/B loop), against
back to back: where the difference goes.

    .venv/bin/python -m bench.serial_cpu [N] [--route get|me|page] [--pause MODE]... [--env K=V]...

gunicorn as configured (docker/gunicorn.conf.py) on the entity benchmark's data; one keep-alive connection,
N requests; the CPU time of every thread of every gunicorn worker (/proc/PID/task/*/schedstat). Between
calls, per MODE:

- `b2b`: nothing (the next request follows the answer at once);
- `sleep:MS`: the client sleeps MS milliseconds (the machine idles);
- `busy:MS`: the client works MS milliseconds through a 32 MB buffer (another program on the machine, as
  Directus's call in the A/B loop: the caches are someone else's when the next request comes);
- `par:K`: K connections, each from its own client thread, back to back (as wrk does, in a Python client).

The workers' CPU is read before and after the whole loop (reading every thread's counters between calls
takes longer than the keep-alive linger, so a call measured alone is never back to back); the workers'
CPU over the same time idle is subtracted. Reported per mode: CPU and context switches per call, and the
threads that ran most. `--env K=V` sets a setting of the gunicorn run (e.g.
GUNICORN_KEEPALIVE_LINGER_MS=0, WEB_CONCURRENCY=1, METRICS_ENABLED=false); one gunicorn per run.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import os
import sys
import threading
import time

from bench.bench_entities import BIG_ORG, ENTITY, QUERIES, bench_setup
from bench.bench_records_http import free_port, start_gunicorn, stop, worker_pids
from bench.common import bench_token
from bench.profile_layer import _record_id

BUFFER = bytes(32 * 1024 * 1024)


def _threads(pids: list[int]) -> dict[str, tuple[int, int]]:
    """tid → (CPU ns, context switches) of every thread of the processes."""
    out = {}
    for pid in pids:
        for task in glob.glob(f"/proc/{pid}/task/*"):
            try:
                with open(f"{task}/schedstat") as fh:
                    ns = int(fh.read().split()[0])
                switches = 0
                with open(f"{task}/status") as fh:
                    for line in fh:
                        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                            switches += int(line.split()[1])
                out[task] = (ns, switches)
            except (OSError, ValueError, IndexError):
                pass
    return out


def _role(task: str) -> str:
    """`main` (the worker's main thread: gunicorn's poller) or the thread id, and the system call it
    sleeps in now (7 poll: a keep-alive linger; 202 futex: an idle pool thread or the GIL; 232
    epoll_wait: the poller)."""
    parts = task.split("/")  # /proc/PID/task/TID
    try:
        with open(f"{task}/syscall") as fh:
            syscall = fh.read().split()[0]
    except OSError:
        syscall = "?"
    return f"{'main' if parts[2] == parts[4] else parts[4]}[{syscall}]"


def _pause(mode: str) -> None:
    if mode == "b2b" or mode.startswith("par:"):
        return
    kind, ms = mode.split(":")
    if kind == "sleep":
        time.sleep(float(ms) / 1000)
        return
    end = time.perf_counter() + float(ms) / 1000
    view = memoryview(BUFFER)
    offset = 0
    while time.perf_counter() < end:
        hashlib.sha1(view[offset:offset + 1024 * 1024]).digest()
        offset = (offset + 1024 * 1024) % len(BUFFER)


def _spent(before: dict, after: dict) -> tuple[float, float, dict]:
    """CPU ms and context switches of every thread between two readings, and per thread."""
    per = {t: (ns - before.get(t, (0, 0))[0], sw - before.get(t, (0, 0))[1]) for t, (ns, sw) in after.items()}
    return sum(v[0] for v in per.values()) / 1e6, sum(v[1] for v in per.values()), per


def _busiest(per: dict, n: int) -> str:
    top = sorted((tv for tv in per.items() if tv[1][0]), key=lambda tv: -tv[1][0])[:4]
    return "; ".join(f"{_role(t)} {ns / 1e6 / n:.3f} ms {sw / n:.1f} sw" for t, (ns, sw) in top)


def _burst(port: int, request: tuple, headers: dict, n: int) -> None:
    method, path, body = request
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(n):
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
    conn.close()


def run(port: int, pids: list[int], request: tuple, token: str, n: int, mode: str) -> str:
    """n calls with the pause after each, the workers' CPU read before and after the whole loop (no reading
    between calls: reading every thread's counters takes longer than the keep-alive linger); the same
    time idle (the workers' background threads), subtracted."""
    method, path, body = request
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call():
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    for _ in range(20):
        call()
        _pause(mode)
    before = _threads(pids)
    start = time.perf_counter()
    if mode.startswith("par:"):
        k = int(mode[4:])
        threads = [threading.Thread(target=_burst, args=(port, request, headers, n // k)) for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n = n // k * k
    else:
        for _ in range(n):
            call()
            _pause(mode)
    elapsed = time.perf_counter() - start
    cpu, switches, per = _spent(before, _threads(pids))
    idle_before = _threads(pids)
    time.sleep(min(elapsed, 10))
    idle, _sw, _per = _spent(idle_before, _threads(pids))
    idle *= elapsed / min(elapsed, 10)
    conn.close()
    return (f"{mode:9s} CPU per call {(cpu - idle) / n:5.3f} ms (idle workers over the same time "
            f"{idle / n:5.3f} ms per call, subtracted); switches/call {switches / n:4.1f}\n"
            f"    by thread: {_busiest(per, n)}")


def main() -> None:
    args = sys.argv[1:]
    n = int(next((a for a in args if a.isdigit()), "300"))
    route = args[args.index("--route") + 1] if "--route" in args else "get"
    modes = [args[i + 1] for i, a in enumerate(args) if a == "--pause"] or ["b2b", "sleep:10", "busy:10"]
    extra = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--env")
    url, _app, _ids, _capture, _client, _headers = bench_setup()
    record_id = _record_id(url)
    base = f"/api/v1/entities/{ENTITY}/records"
    page_a = next(v for k, v in QUERIES.items() if k.startswith("(a)"))
    request = {"get": ("GET", f"{base}/{record_id}", None), "me": ("GET", "/api/v1/me", None),
               "page": ("POST", f"{base}/query", json.dumps({"query": page_a}).encode())}[route]
    port = free_port()
    proc = start_gunicorn(url, port, **extra)
    try:
        time.sleep(1)
        pids = worker_pids(proc.pid)
        print(f"{route}, {n} calls, {len(pids)} worker(s), settings {extra or 'as shipped'}; "
              f"load {os.getloadavg()[0]:.1f}")
        for mode in modes:
            print(run(port, pids, request, bench_token(BIG_ORG), n, mode), flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
