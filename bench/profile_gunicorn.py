"""Where a gunicorn worker's CPU goes under the query mix (a)-(e) (issue 25, goal 3's first step):

    .venv/bin/python -m bench.profile_gunicorn [SECONDS]      # 60 by default

1. In-process (the Flask test client: no gunicorn, no socket): the calling thread's CPU per request of
   the mix, then the same under cProfile with time.thread_time as its timer (self CPU by layer and
   by function; deterministic, blind to the machine's load, inflated on call-heavy code).
2. gunicorn as configured (docker/gunicorn.conf.py) but with one worker (WEB_CONCURRENCY=1: every
   request lands in the sampled process) on the entity benchmark's data set; one client thread sends
   (a)-(e) in turn over one keep-alive connection for SECONDS while `py-spy record --idle` samples
   every thread of the worker; samples whose leaf is a wait (epoll, the thread pool's queue, psycopg
   waiting for PostgreSQL…) are set apart, the others are scaled to the worker's CPU per request
   measured from /proc over the same window. Then 20 s more for the flamegraph (var/peers/profile.svg).
   On a loaded machine py-spy over-counts frames right after system calls (a thread waiting for a
   core keeps its frame on top): the in-process figures are the reliable ones for the app.

Writes var/peers/profile.txt (py-spy's collapsed stacks) and prints the tables; the analysis is
bench/results/peers-profile.md.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

from bench.bench_entities import BIG_ORG, ENTITY, QUERIES, bench_setup
from bench.bench_records_http import free_port, start_gunicorn, stop, worker_pids
from bench.common import ROOT, bench_token

OUT = os.path.join(ROOT, "var", "peers")
RATE = 200  # samples per second, every thread, idle or not (--idle): waits are told apart by their leaf
# (layer, path prefixes of a frame's file as py-spy prints them: relative to site-packages, the stdlib or
# the working directory) — the innermost frame that matches decides.
LAYERS = [
    ("psycopg (driver: send, receive, adapt rows)", ("psycopg/", "psycopg_c/", "psycopg_binary/")),
    ("SQLAlchemy (engine, Core compile/cache, result rows)", ("sqlalchemy/",)),
    ("marshmallow / flask-smorest / webargs (parsing, schemas)", ("marshmallow/", "flask_smorest/", "webargs/")),
    ("auth (JWT decode + verify)", ("jwt/", "app/auth.py", "cryptography/")),
    ("filter compile + query planning (app.entities query, filters, projection, cursor, fieldtypes)",
     ("app/entities/filters.py", "app/entities/query.py", "app/entities/projection.py",
      "app/entities/cursor.py", "app/entities/fieldtypes.py")),
    ("definition read / services (app.entities.services, reads)", ("app/entities/services/", "app/entities/reads.py")),
    ("row → JSON (json encoder, app.wire, record shaping)",
     ("json/", "app/wire.py", "orjson/", "simplejson/", "app/entities/schemas.py")),
    ("app: request hooks, tenancy, errors, db session, logging (app/*)", ("app/",)),
    ("werkzeug / Flask (routing, request/response objects)", ("werkzeug/", "flask/")),
    ("gunicorn (socket I/O, HTTP parsing, thread pool hand-off)", ("gunicorn/",)),
]
# leaves (function, file prefix) where a thread waits rather than runs
WAITS = [("select", "selectors.py"), ("_worker", "concurrent/futures/thread.py"), ("wait", "threading.py"),
         ("wait", "psycopg/"), ("wait_conn", "psycopg/"), ("sleep", ""), ("get", "queue.py"),
         ("accept", "socket.py"), ("recv_into", "socket.py"), ("readinto", "socket.py")]
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*):?(?P<line>\d*)\)$")


def parse(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame)
    return (m["func"], m["file"]) if m else (frame, "")


def layer_of(frames: list[tuple[str, str]]) -> str:
    for _func, file in reversed(frames):
        for layer, prefixes in LAYERS:
            if file.startswith(prefixes):
                return layer
    return "other (stdlib, interpreter)"


def waiting(frames: list[tuple[str, str]]) -> str | None:
    func, file = frames[-1]
    name = func.rsplit(".", 1)[-1]
    for wait_func, prefix in WAITS:
        if name == wait_func and file.startswith(prefix):
            if file.startswith("psycopg/"):
                return "waiting for PostgreSQL (psycopg wait: the SQL round trips)"
            return None if not any(f.startswith("flask/") for _f, f in frames) else "waiting (other, in a request)"
    return "cpu"


def drive(port: int, token: str, stop_at: float, served: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    bodies = [json.dumps({"query": q}) for q in QUERIES.values()]
    i = 0
    while time.time() < stop_at:
        try:
            conn.request("POST", f"/api/v1/entities/{ENTITY}/records/query", body=bodies[i % len(bodies)],
                         headers=headers)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, resp.status
            served[0] += 1
            i += 1
        except (http.client.HTTPException, ConnectionError):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def record(pid: int, port: int, token: str, seconds: int, fmt: str, path: str) -> tuple[int, float]:
    """py-spy on `pid` while one client sends the query mix; (requests served, worker CPU ms per request
    from /proc over the same window)."""
    from bench.bench_peers import task_cpu_ns

    served = [0]
    spy = subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "py-spy"), "record", "--pid", str(pid),
                            "--rate", str(RATE), "--duration", str(seconds), "--format", fmt, "--output", path,
                            "--idle"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attached
    cpu = task_cpu_ns(pid)
    driver = threading.Thread(target=drive, args=(port, token, time.time() + seconds - 1.5, served))
    driver.start()
    driver.join()
    cpu = task_cpu_ns(pid) - cpu
    _, err = spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0:
        raise RuntimeError(err.decode()[-2000:])
    return served[0], cpu / 1e6 / max(served[0], 1)


def analyse(path: str, requests: int, cpu_ms: float) -> str:
    """The samples on CPU, by layer and by function, scaled to the worker's measured CPU ms/request;
    the request threads' waits beside them (wall ms per request, from the sample count)."""
    per_layer: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    on_cpu = 0
    with open(path) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            n = int(count)
            frames = [parse(f) for f in stack.split(";") if f]
            if not frames:
                continue
            state = waiting(frames)
            if state is None:
                continue  # an idle thread
            if state != "cpu":
                waits[state] += n
                continue
            on_cpu += n
            per_layer[layer_of(frames)] += n
            self_time[key(frames[-1])] += n
            for frame in {key(f) for f in frames}:
                inclusive[frame] += n
    scale = cpu_ms / on_cpu  # ms per request of one on-CPU sample
    wall = 1000 / RATE / requests
    lines = [f"{requests} requests; worker CPU {cpu_ms:.2f} ms per request (/proc); {on_cpu} samples on CPU, "
             f"sampled CPU {on_cpu * wall:.2f} ms per request at {RATE} Hz "
             "(the table scales the shares to /proc's figure)",
             "", "| layer (innermost frame of a known layer) | CPU ms/request | share |", "|---|---|---|"]
    for layer, n in per_layer.most_common():
        lines.append(f"| {layer} | {n * scale:.2f} | {100 * n / on_cpu:.0f}% |")
    for state, n in waits.most_common():
        lines.append(f"| *{state}* (wall, not CPU) | *{n * wall:.2f}* | |")
    lines += ["", "| top functions by self time (on CPU) | CPU ms/request | share |", "|---|---|---|"]
    for frame, n in self_time.most_common(30):
        lines.append(f"| `{frame}` | {n * scale:.3f} | {100 * n / on_cpu:.1f}% |")
    lines += ["", "| top functions by inclusive time (on CPU) | CPU ms/request | share |", "|---|---|---|"]
    for frame, n in inclusive.most_common(70):
        lines.append(f"| `{frame}` | {n * scale:.2f} | {100 * n / on_cpu:.0f}% |")
    return "\n".join(lines)


def key(frame: tuple[str, str]) -> str:
    return f"{frame[0]} ({frame[1]})"


def inprocess(client, headers, n: int) -> str:
    """The Flask app alone (test client, no gunicorn, no socket) under cProfile with each thread's CPU
    clock (time.thread_time) as its timer: deterministic and blind to the machine's load, though the
    profiler's own cost inflates call-heavy code. Self CPU time by layer (the function's file)."""
    import cProfile
    import pstats

    bodies = list(QUERIES.values())
    for body in bodies * 4:  # warm
        client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": body}, headers=headers)
    plain = []
    for _ in range(3):
        start = time.thread_time()
        for i in range(n):
            client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": bodies[i % 5]}, headers=headers)
        plain.append((time.thread_time() - start) * 1000 / n)
    prof = cProfile.Profile(timer=time.thread_time)
    prof.enable()
    for i in range(n):
        client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": bodies[i % 5]}, headers=headers)
    prof.disable()
    per_layer: collections.Counter[str] = collections.Counter()
    per_function: collections.Counter[str] = collections.Counter()
    for (file, line, func), (_cc, _nc, tottime, _ct, _callers) in pstats.Stats(prof).stats.items():
        rel = relative(file)
        per_layer[layer_of([(func, rel)]) if rel else "C functions (builtins: json, re, psycopg's C parts…)"] \
            += tottime
        per_function[f"{func} ({rel or file}:{line})"] += tottime
    total = sum(per_layer.values())
    out = [f"in-process, {n} calls of (a)-(e) in turn: CPU of the calling thread {min(plain):.2f} ms per request "
           f"without the profiler (best of 3), {1000 * total / n:.2f} with it", "",
           "| layer (a function's own file; self time) | share |", "|---|---|"]
    out += [f"| {layer} | {100 * t / total:.0f}% |" for layer, t in per_layer.most_common()]
    out += ["", "| top functions by self CPU time (cProfile, thread_time) | share |", "|---|---|"]
    out += [f"| `{f}` | {100 * t / total:.1f}% |" for f, t in per_function.most_common(30)]
    return "\n".join(out)


def relative(file: str) -> str:
    """A path as py-spy prints it (relative to site-packages, the stdlib or the project)."""
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/", "/lib/python3.13/", ROOT + "/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return ""


def main() -> None:
    seconds = int(next((a for a in sys.argv[1:] if a.isdigit()), "60"))
    url, _app, _ids, _capture, client, headers = bench_setup()
    print(inprocess(client, headers, 500), flush=True)
    os.makedirs(OUT, exist_ok=True)
    port = free_port()
    os.environ["WEB_CONCURRENCY"] = "1"
    proc = start_gunicorn(url, port)
    try:
        (worker,) = worker_pids(proc.pid)
        token = bench_token(BIG_ORG)
        drive(port, token, time.time() + 5, [0])  # warm-up
        load_before = os.getloadavg()
        raw = os.path.join(OUT, "profile.txt")
        requests, cpu_ms = record(worker, port, token, seconds, "raw", raw)
        load_after = os.getloadavg()
        record(worker, port, token, min(seconds, 20), "flamegraph", os.path.join(OUT, "profile.svg"))
    finally:
        stop(proc)
    print(analyse(raw, requests, cpu_ms))
    print(f"\nload average before {load_before}, after {load_after}; {requests / seconds:.0f} req/s closed loop")


if __name__ == "__main__":
    main()
