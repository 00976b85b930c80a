"""Instructions a gunicorn worker executes per request (issue 25: the fixed per-request layer), counted by
valgrind's callgrind: deterministic, blind to the machine's load (wall and CPU time are not, on a shared
2-core machine).

    .venv/bin/python -m bench.callgrind_layer [N] [--connections C] [--route me|get|count|page|page_a..page_e]...
        [--tree DIR] [--pause MS] [--env K=V]...

`--tree DIR`: serve the code of another source tree (e.g. `git archive <commit> | tar -x -C DIR`), for
a before/after comparison on the same data. `--pause MS`: each client waits MS milliseconds after every
answer (requests one at a time, as in the side-by-side bench's A/B loop, instead of back to back).
`--env K=V`: a setting of the gunicorn run (e.g. GUNICORN_KEEPALIVE_LINGER_MS=0).

gunicorn as configured (docker/gunicorn.conf.py), one worker, run under `valgrind --tool=callgrind` with
instrumentation off until the worker is warm; then, per route: instrumentation on, N requests sent
over C keep-alive connections (one client thread each, back to back), instrumentation off, and the
worker's instruction count (every thread: the main loop, the request threads) read from the dump,
divided by N. Routes: `GET /api/v1/me` (the layer alone), a record GET, the count of three equalities,
the page query (a) of the entity benchmark (`page`), and each of its queries (a)-(e) as `page_a`-`page_e`.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import subprocess
import sys
import threading
import time

from bench.bench_entities import BIG_ORG, COUNT_FILTER, ENTITY, QUERIES, bench_setup
from bench.bench_records_http import free_port, worker_pids
from bench.common import BENCH_SECRET, ROOT, bench_token
from bench.profile_layer import _record_id

OUT_DIR = os.path.join(ROOT, "var", "callgrind")
PAUSE = 0.0  # seconds a client waits after each answer (--pause)


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _routes(record_id: str) -> dict[str, tuple[str, str, bytes | None]]:
    page_a = next(v for k, v in QUERIES.items() if k.startswith("(a)"))
    base = f"/api/v1/entities/{ENTITY}/records"
    return {"me": ("GET", "/api/v1/me", None),
            "get": ("GET", f"{base}/{record_id}", None),
            "count": ("POST", f"{base}/count", json.dumps({"filters": COUNT_FILTER}).encode()),
            "page": ("POST", f"{base}/query", json.dumps({"query": page_a}).encode()),
            **{f"page_{key[1]}": ("POST", f"{base}/query", json.dumps({"query": query}).encode())
               for key, query in QUERIES.items()}}


def _client(port: int, token: str, request: tuple, n: int, errors: list) -> None:
    try:
        _requests(port, token, request, n, errors)
    except OSError as exc:
        errors.append(exc)


def _requests(port: int, token: str, request: tuple, n: int, errors: list) -> None:
    method, path, body = request
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    for _ in range(n):
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            errors.append(response.status)
        if PAUSE:
            time.sleep(PAUSE)
    conn.close()


def _send(port: int, token: str, request: tuple, n: int, connections: int) -> None:
    errors: list = []
    threads = [threading.Thread(target=_client, args=(port, token, request, n // connections, errors))
               for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(isinstance(e, OSError) for e in errors):
        raise next(e for e in errors if isinstance(e, OSError))
    if errors:
        raise RuntimeError(f"non-200 answers: {errors[:5]}")


def _total(path: str) -> int:
    total = None
    with open(path) as fh:
        for line in fh:
            if line.startswith("totals:"):
                total = int(line.split()[1])  # the last one (a dump's header may carry a zero summary)
    if total is None:
        raise RuntimeError(f"no totals in {path}")
    return total


def main() -> None:
    global PAUSE
    PAUSE = float(_arg("--pause", "0")) / 1000
    extra = dict(sys.argv[i + 1].split("=", 1) for i, a in enumerate(sys.argv) if a == "--env")
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "200"))
    connections = int(_arg("--connections", "1"))
    wanted = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--route"] or ["me", "get", "count", "page"]
    url, _app, _ids, _capture, _client_, _headers = bench_setup()
    record_id = _record_id(url)
    routes = _routes(record_id)
    token = bench_token(BIG_ORG)
    os.makedirs(OUT_DIR, exist_ok=True)
    for old in glob.glob(os.path.join(OUT_DIR, "cg.*")):
        os.remove(old)
    tree = _arg("--tree", ROOT)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": tree, "PORT": str(port), "DATABASE_URL": url, "JWT_SECRET": BENCH_SECRET,
           "LOG_LEVEL": "WARNING", "REDIS_URL": "", "VAR_DIR": os.path.join(ROOT, "var", "bench"),
           "WEB_CONCURRENCY": "1", **extra}
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--instr-atstart=no",
           f"--callgrind-out-file={OUT_DIR}/cg.%p", os.path.join(ROOT, ".venv", "bin", "python"),
           os.path.join(ROOT, ".venv", "bin", "gunicorn"), "-c", os.path.join(tree, "docker", "gunicorn.conf.py"),
           "--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null", "--timeout", "600", "wsgi:app"]
    log = open(os.path.join(OUT_DIR, "gunicorn.log"), "w")  # noqa: SIM115 (valgrind's own lines)
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.time() + 600
        while True:
            try:
                _send(port, token, routes["me"], 1, 1)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("gunicorn under valgrind did not start") from None
                time.sleep(2)
        (worker,) = worker_pids(proc.pid)
        for name in wanted:
            _send(port, token, routes[name], 20, 1)  # warm: caches, prepared statements
        print(f"callgrind, gunicorn one worker, {n} requests per route over {connections} keep-alive "
              f"connection(s), pause {PAUSE * 1000:g} ms, settings {extra or 'as shipped'}; instructions per "
              f"request (all threads of the worker)")
        for name in wanted:
            subprocess.run(["callgrind_control", "-z", str(worker)], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "on", str(worker)], check=True, capture_output=True)
            _send(port, token, routes[name], n, connections)
            subprocess.run(["callgrind_control", "-i", "off", str(worker)], check=True, capture_output=True)
            before = set(glob.glob(os.path.join(OUT_DIR, f"cg.{worker}.*")))
            subprocess.run(["callgrind_control", "-d", name, str(worker)], check=True, capture_output=True)
            time.sleep(1)
            dumps = set(glob.glob(os.path.join(OUT_DIR, f"cg.{worker}.*"))) - before
            total = sum(_total(p) for p in dumps)
            print(f"  {name:6s} {total / n / 1e6:8.3f} M instructions per request")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


if __name__ == "__main__":
    main()
