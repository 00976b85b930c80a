"""The local stack (`make stack`: the Procfile under honcho, nginx in front) through its ingress, with
wrk on loopback: the two API pools.

(1) Throughput of a record GET (`GET /api/v1/entities/deals/records/{id}`: token, definition, record,
    JSON) beside `GET /api/v1/me` (token only, no database), at 8 and 32 connections, `wrk -t2`,
    DURATION s each after a WARMUP s warm-up, through nginx to the `api` pool.
(2) Record GET latency (8 connections, each pausing PACE_MS between requests) idle and while
    IMAGE_CALLS image calls (`POST /api/v1/agents/images`, one organization each: the image rate limit
    is per organization) wait on a fake provider that holds every call until the phase ends; phases
    interleaved in ROUNDS rounds (idle first, then loaded first, alternately), the median reported,
    because the machine's load drifts.

Beside req/s and latency: CPU milliseconds per request of the API pool (every gunicorn process of the
`api` lines), nginx and PostgreSQL (each process tree, user + system time from /proc), and the load
average. The stack runs under var/bench/stack (PostgreSQL's data kept between runs) on free ports, with
its own Redis, workers and Flower, as `make stack` runs it; it stops at the end (and by itself when this
process dies, or after STACK_MAX_SECONDS). Settings of the run (the environment): API_THREADS,
IMAGES_THREADS, WEB_CONCURRENCY, STACK_API_PROCESSES as for `make stack`.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.bench_records_http import cpu_seconds
from bench.common import BENCH_SECRET, ROOT, bench_token, table, write_result
from stack import free_port

DURATION, WARMUP = 10, 2
PACE_MS, PACED_CONNECTIONS, PHASE_SECONDS, ROUNDS = 10, 8, 8, 4
IMAGE_CALLS = 64
STACK_DIR = os.path.join(ROOT, "var", "bench", "stack")
API_KEY = "bench-provider-key"

LUA = """
%s
done = function(summary, latency, requests)
  io.write(string.format("P50 %%d\\nP95 %%d\\nP99 %%d\\n", latency:percentile(50), latency:percentile(95),
                         latency:percentile(99)))
end
"""


# -- the slow provider: holds every image call until released ---------------------------------------------

class HeldUpstream:
    """provider-a's generation endpoint in a child process (its work is not the gateway's): each call
    waits until `release()` (or `hold` seconds), then answers one small PNG. `waiting()` counts the calls
    it holds."""

    def __init__(self, hold: float = 90.0) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.released, self.count = ctx.Event(), ctx.Value("i", 0)
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(self.released, self.count, hold, child), daemon=True)
        self.process.start()
        self.url = parent.recv()

    def waiting(self) -> int:
        return self.count.value

    def release(self) -> None:
        self.released.set()

    def hold(self) -> None:
        self.released.clear()

    def close(self) -> None:
        self.released.set()
        self.process.terminate()
        self.process.join(10)


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def _serve(released, count, hold: float, pipe) -> None:
    body = json.dumps({"created": 0, "data": [{"b64_json": b64encode(_png()).decode()}],
                       "usage": {"input_tokens": 10, "output_tokens": 100, "total_tokens": 110}}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with count.get_lock():
                count.value += 1
            released.wait(hold)
            with count.get_lock():
                count.value -= 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.request_queue_size = 256
    pipe.send(f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.serve_forever()


# -- the stack ----------------------------------------------------------------------------------------------

class BenchStack:
    def __init__(self, upstream_url: str) -> None:
        from app.config import SETTINGS
        from stack import SECRETS, Stack
        from stack import SETTINGS as STACK_SETTINGS

        for sub in ("redis", "nginx", "blobs", "outbox", "stack.env"):  # PostgreSQL's data is kept
            path = os.path.join(STACK_DIR, sub)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        keep = {"API_THREADS", "IMAGES_THREADS", "WEB_CONCURRENCY", "STACK_API_PROCESSES"}
        drop = (set(SETTINGS) | set(STACK_SETTINGS) | set(SECRETS) | {"PORT", "CELERY_KEY_PREFIX"}) - keep
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("FLOWER_")}
        env.update({
            "STACK_DIR": STACK_DIR, "STACK_PORT": str(free_port()), "STACK_API_PORT": str(free_port(pair=True)),
            "STACK_PG_PORT": str(free_port()), "STACK_REDIS_PORT": str(free_port()),
            "FLOWER_PORT": str(free_port()), "ENV_FILE": "", "JWT_SECRET": BENCH_SECRET, "LOG_LEVEL": "WARNING",
            "STACK_PARENT_PID": str(os.getpid()), "STACK_MAX_SECONDS": "1200",
            "PROVIDER_A_ENDPOINT": upstream_url, "PROVIDER_A_API_KEY": API_KEY,
        })
        self.settings = Stack.from_env(env)
        os.makedirs(STACK_DIR, exist_ok=True)
        self.log_path = os.path.join(STACK_DIR, "stack.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "stack", "up"], cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.url = self.settings.public_url
        self._wait_up()
        from stack import read_env_file

        self.env = read_env_file(self.settings.env_file)

    def _wait_up(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        ports = self.settings.api_ports + self.settings.images_ports
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the stack exited (rc={self.proc.returncode}); see {self.log_path}")
            try:
                for port in ports:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3)
                urllib.request.urlopen(self.url + "/health", timeout=3)
                return
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"the stack did not come up; see {self.log_path}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def started(self, prefix: str) -> list[int]:
        """Pids honcho started for the processes named `prefix.N`."""
        return [int(pid) for pid in re.findall(rf"\| {re.escape(prefix)}\.\d+ started \(pid=(\d+)\)", self.log())]

    def honcho(self) -> list[int]:
        """honcho's pid: the child of `python -m stack up`."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as fh:
            return [int(pid) for pid in fh.read().split()]

    def relays(self) -> list[int]:
        """honcho's relay processes (its children: each reads one Procfile line's output and passes it on)."""
        found = []
        for pid in self.honcho():
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    found += [int(child) for child in fh.read().split()]
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(200)  # the nodes drain first (stack up's ordered stop)
            except subprocess.TimeoutExpired:
                pass
        from stack import nodes

        node_pids = [pid for pid in (node.pid() for node in nodes(self.settings)) if pid]
        for pid in [self.proc.pid, *(int(p) for p in re.findall(r"started \(pid=(\d+)\)", self.log())), *node_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)  # each honcho process is its own group, each node too
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait(10)

    def http(self, method: str, path: str, body=None, headers=None, timeout: float = 60):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            pass
    return out


class CpuMeter:
    """CPU seconds of each group of process trees (user + system of the live processes); `alone` names
    groups counted without their descendants."""

    def __init__(self, groups: dict[str, list[int]], alone: frozenset[str] = frozenset()) -> None:
        self.groups, self.alone = groups, alone

    def sample(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for root in roots for p in ([root] if name in self.alone else tree(root)))
                for name, roots in self.groups.items()}


# -- load -------------------------------------------------------------------------------------------------

def _script(pace_ms: int | None) -> str:
    fd, path = tempfile.mkstemp(suffix=".lua", prefix="bench-stack-")
    with os.fdopen(fd, "w") as fh:
        fh.write(LUA % (f"function delay() return {pace_ms} end" if pace_ms else ""))
    return path


def wrk(url: str, connections: int, token: str, seconds: int, script: str, threads: int = 2) -> dict:
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "-s", script,
                          "-H", f"Authorization: Bearer {token}", url], capture_output=True, text=True,
                         check=True).stdout
    result = {k: int(re.search(rf"{k} (\d+)", out).group(1)) / 1000 for k in ("P50", "P95", "P99")}
    result["rate"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    result["requests"] = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["errors"] = int(non2xx.group(1)) if non2xx else 0
    return result


def image_calls(stack: BenchStack, n: int, round_no: int) -> tuple[list[threading.Thread], list]:
    statuses: list = []

    def call(i: int) -> None:
        token = bench_token(f"img-{round_no}-{i}.example.com", scopes=("write:image-gen",))
        status, _ = stack.http("POST", "/api/v1/agents/images", {"provider": "provider-a", "model": "gpt-image-1",
                               "prompt": "a slow image"}, {"Authorization": f"Bearer {token}"}, timeout=200)
        statuses.append(status)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, statuses


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def main() -> str:
    upstream = HeldUpstream()
    stack = None
    scripts = {"full": _script(None), "paced": _script(PACE_MS)}
    load_start = os.getloadavg()
    try:
        stack = BenchStack(upstream.url)
        org = f"bench-{uuid.uuid4().hex[:8]}.example.com"
        internal = {"X-Internal-Token": stack.env["INTERNAL_API_TOKEN"]}
        seed = {"org": {"title": "Bench", "mainDomain": org, "product": "default"},
                "admin": {"email": "a@example.com", "firstName": "A", "lastName": "B"}}
        status, body = stack.http("POST", "/internal/seed", seed, internal, timeout=180)
        assert status in (200, 201), body
        token = bench_token(org, scopes=("read", "write"), role="admin")
        status, record = stack.http("POST", "/api/v1/entities/deals/records", {"name": "Bench",
                                    "fields": {"stage": "new", "amount": 1}}, {"Authorization": f"Bearer {token}"})
        assert status == 201, record
        record_url = f"{stack.url}/api/v1/entities/deals/records/{record['id']}"
        # honcho (alone): it relays every process's output, the access line of each request included: its
        # main process prints, one relay process per Procfile line reads the line's pipe (honcho's children)
        meter = CpuMeter({"api": stack.started("api"), "nginx": stack.started("proxy"),
                          "postgres": stack.started("postgres"), "api-images": stack.started("api-images"),
                          "honcho": stack.honcho() + stack.relays()}, alone=frozenset({"honcho"}))

        rows = []
        for connections in (8, 32):
            for label, target in (("GET …/records/{id}", record_url), ("GET /api/v1/me", f"{stack.url}/api/v1/me")):
                wrk(target, connections, token, WARMUP, scripts["full"])
                before = meter.sample()
                r = wrk(target, connections, token, DURATION, scripts["full"])
                after = meter.sample()
                cpu = {k: 1000 * (after[k] - before[k]) / max(r["requests"], 1) for k in before}
                rows.append([label, connections, r["rate"], r["P50"], r["P95"], r["P99"], r["errors"], cpu["api"],
                             cpu["nginx"], cpu["postgres"], cpu["api"] + cpu["nginx"] + cpu["postgres"],
                             cpu["honcho"]])
                print(rows[-1], flush=True)

        runs: dict[str, list[dict]] = {"idle": [], f"{IMAGE_CALLS} image calls waiting": []}
        wrk(record_url, PACED_CONNECTIONS, token, WARMUP, scripts["paced"])
        for round_no in range(ROUNDS):
            if round_no % 2 == 0:  # idle first in even rounds, last in odd ones: drift falls on both alike
                runs["idle"].append(wrk(record_url, PACED_CONNECTIONS, token, PHASE_SECONDS, scripts["paced"]))
            upstream.hold()
            threads, statuses = image_calls(stack, IMAGE_CALLS, round_no)
            try:
                _wait(lambda: upstream.waiting() >= IMAGE_CALLS, 60, f"{IMAGE_CALLS} image calls upstream")
                before = meter.sample()
                r = wrk(record_url, PACED_CONNECTIONS, token, PHASE_SECONDS, scripts["paced"])
                after = meter.sample()
                r["images_cpu"] = after["api-images"] - before["api-images"]
                r["waiting_after"] = upstream.waiting()
                runs[f"{IMAGE_CALLS} image calls waiting"].append(r)
            finally:
                upstream.release()
                for thread in threads:
                    thread.join(200)
            if round_no % 2 == 1:
                runs["idle"].append(wrk(record_url, PACED_CONNECTIONS, token, PHASE_SECONDS, scripts["paced"]))
            print(round_no, runs["idle"][-1], r, sorted(set(statuses)), flush=True)
            if set(statuses) != {200}:
                raise RuntimeError(f"image calls answered {sorted(set(statuses))}")
        idle_p95 = statistics.median(x["P95"] for x in runs["idle"])
        latency_rows = []
        for label, results in runs.items():
            m = {k: statistics.median(x[k] for x in results) for k in ("rate", "P50", "P95", "P99", "errors")}
            latency_rows.append([label, m["rate"], m["P50"], m["P95"], m["P99"], m["P95"] / idle_p95, int(m["errors"]),
                                 min(x.get("waiting_after", 0) for x in results) if label != "idle" else ""])
        settings = {name: os.environ.get(name) or default for name, default in (
            ("API_THREADS", "8"), ("IMAGES_THREADS", "128"), ("WEB_CONCURRENCY", "2"), ("STACK_API_PROCESSES", "2"))}
    finally:
        if stack is not None:
            stack.stop()
        upstream.close()
        for path in scripts.values():
            os.unlink(path)
    body = table(["request (through nginx)", "connections", "req/s", "p50 ms", "p95 ms", "p99 ms", "non-2xx",
                  "CPU ms/req api pool", "nginx", "PostgreSQL", "total",
                  "honcho (log relay: main + relay processes)"], rows)
    body += "\n\n" + table(["record GET, paced", "req/s", "p50 ms", "p95 ms", "p99 ms", "p95 / idle p95", "non-2xx",
                            "image calls still waiting at the end"], latency_rows)
    load_end = os.getloadavg()
    notes = (f"Machine load average (1/5/15 min): {', '.join(f'{x:.1f}' for x in load_start)} at the start, "
             f"{', '.join(f'{x:.1f}' for x in load_end)} at the end.\n\n"
             f"`python -m stack up` (the Procfile under honcho: nginx, the `api` pool of "
             f"{settings['STACK_API_PROCESSES']} processes × WEB_CONCURRENCY={settings['WEB_CONCURRENCY']} gthread "
             f"workers × API_THREADS={settings['API_THREADS']}, the `api-images` pool with "
             f"IMAGES_THREADS={settings['IMAGES_THREADS']}, PostgreSQL, Redis, workers, Flower) on one machine "
             f"with wrk 4.1 (Debian): throughput `-t2 -cN -d{DURATION}s` after a {WARMUP} s warm-up; latency "
             f"`-t2 -c{PACED_CONNECTIONS}` with a {PACE_MS} ms pause per connection between requests, "
             f"{PHASE_SECONDS} s per phase, idle and loaded phases interleaved in {ROUNDS} rounds (idle first and "
             f"last alternately), the median of each column. The {IMAGE_CALLS} image calls (one organization "
             "each) wait on a fake provider that "
             "holds each call until the phase ends, then answers a 64×48 PNG. CPU ms per request: user + system "
             "time of each process tree (the api pool's gunicorn processes, nginx, the PostgreSQL server and its "
             "backends) from /proc over the run, divided by the requests served; honcho's own process beside "
             "them (it relays every process's output, an access line per request: the machine's log pipeline, "
             "which compose leaves to Docker's logging driver; its main process and the relay process that reads "
             "each Procfile line's pipe). Server, PostgreSQL and wrk share "
             "the machine's cores with whatever else runs on it.")
    return write_result("stack", "The local stack through its ingress: two API pools", body, notes)


if __name__ == "__main__":
    sys.exit(main() and 0)
