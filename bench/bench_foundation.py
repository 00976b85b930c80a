"""Foundation: cold start of `make run` to a healthy /health, and the auth+tenancy+envelope overhead.

(1) Cold start: a fresh gunicorn (as `make run` starts it, warm .venv, embedded PostgreSQL already
    initialised) until GET /health answers 200. Measured 3 times.
(2) Overhead: GET /api/v1/me (JWT verify, product check, tenant install, header re-stamp, JSON
    envelope, request id) against a bare Flask route registered on the same app, through the WSGI
    test client in one process, interleaved so both see the same machine state.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from bench.common import ROOT, bench_app, bench_token, summary, table, timed, write_result

PORT = 8765


def cold_start_seconds() -> float:
    env = dict(os.environ, PORT=str(PORT), VAR_DIR=os.path.join(ROOT, "var"))
    start = time.perf_counter()
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                             "docker/gunicorn.conf.py", "wsgi:app"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = start + 60
        while time.perf_counter() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return time.perf_counter() - start
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not become healthy in 60 s")
    finally:
        proc.terminate()
        proc.wait(35)


def main() -> str:
    starts = [cold_start_seconds() for _ in range(3)]
    app = bench_app()
    app.add_url_rule("/bare", "bare", lambda: {"ok": True})
    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token('bench-org')}"}
    me = lambda: client.get("/api/v1/me", headers=headers)  # noqa: E731
    bare = lambda: client.get("/bare")  # noqa: E731
    assert me().status_code == 200 and bare().status_code == 200
    me_samples, bare_samples = [], []
    for _ in range(10):  # interleave rounds
        me_samples += timed(me, 300, warmup=10)
        bare_samples += timed(bare, 300, warmup=10)
    m, b = summary(me_samples), summary(bare_samples)
    body = table(["measure", "value"], [
        ["cold start to healthy /health, best of 3 (s)", min(starts)],
        ["cold start, worst of 3 (s)", max(starts)],
    ]) + "\n\n" + table(["route", "p50 ms", "p99 ms", "n"], [
        ["GET /api/v1/me (auth + tenancy + envelope)", m["p50"], m["p99"], m["n"]],
        ["GET /bare (plain Flask route, same app)", b["p50"], b["p99"], b["n"]],
        ["ratio me/bare", m["p50"] / b["p50"], m["p99"] / b["p99"], ""],
        ["added per request (ms)", m["p50"] - b["p50"], m["p99"] - b["p99"], ""],
    ])
    return write_result("foundation", "Foundation benchmark", body,
                        "Cold start = gunicorn (2 gthread workers) spawn → first 200 from /health, "
                        "warm .venv, embedded PostgreSQL data directory already initialised.")


if __name__ == "__main__":
    main()
