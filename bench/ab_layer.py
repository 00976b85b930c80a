"""A/B of the per-request layer over real HTTP (issue 25): gunicorn as configured (two workers) from two
source trees in turn, wrk `-t2` at 32 connections on a record GET (and `GET /api/v1/me`), rounds
interleaved; req/s and the workers' CPU (every thread, /proc) per request.

    .venv/bin/python -m bench.ab_layer OTHER_TREE [ROUNDS]

OTHER_TREE: a checkout of another commit (e.g. `git archive <commit> | tar -x -C /tmp/base`) with a
`.venv` link; its code serves the "before" column, this tree's the "after" column. On a shared machine
the req/s move with the load; interleaving and the CPU column make the comparison fairer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

from bench.bench_entities import BIG_ORG, ENTITY, bench_setup
from bench.bench_records_http import free_port, stop, worker_pids, wrk
from bench.common import BENCH_SECRET, ROOT, bench_token
from bench.profile_layer import _cpu_ticks, _record_id


def _start(root: str, url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "PORT": str(port), "DATABASE_URL": url, "JWT_SECRET": BENCH_SECRET, "LOG_LEVEL": "WARNING",
           "REDIS_URL": "", "VAR_DIR": os.path.join(ROOT, "var", "bench"), "PYTHONPATH": root}
    cmd = [os.path.join(ROOT, ".venv", "bin", "gunicorn"), "-c", os.path.join(root, "docker", "gunicorn.conf.py"),
           "--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null", "wsgi:app"]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.3)
    stop(proc)
    raise RuntimeError("gunicorn did not start")


def main() -> None:
    other = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    url, *_ = bench_setup()
    record_id = _record_id(url)
    token = bench_token(BIG_ORG)
    tick = os.sysconf("SC_CLK_TCK")
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _round in range(rounds):
        for label, root in (("before", other), ("after", ROOT)):
            port = free_port()
            proc = _start(root, url, port)
            try:
                workers = worker_pids(proc.pid)
                for route, path in (("record GET", f"/api/v1/entities/{ENTITY}/records/{record_id}"),
                                    ("GET /api/v1/me", "/api/v1/me")):
                    target = f"http://127.0.0.1:{port}{path}"
                    wrk(target, 32, token, 2)
                    before = sum(_cpu_ticks(w) for w in workers)
                    result = wrk(target, 32, token, 8)
                    cpu = (sum(_cpu_ticks(w) for w in workers) - before) / tick
                    per_request = cpu / (result["rate"] * 8) * 1000
                    results.setdefault((route, label), []).append((result["rate"], per_request))
                    print(f"{label:6s} {route:15s} {result['rate']:7.0f} req/s  {per_request:5.3f} ms CPU/request"
                          f"  load {os.getloadavg()[0]:.1f}", flush=True)
            finally:
                stop(proc)
    for (route, label), values in sorted(results.items()):
        rates = sorted(v[0] for v in values)
        cpus = sorted(v[1] for v in values)
        print(f"{route:15s} {label:6s} req/s median {rates[len(rates) // 2]:7.0f}  CPU ms/request median "
              f"{cpus[len(cpus) // 2]:5.3f}")


if __name__ == "__main__":
    main()
