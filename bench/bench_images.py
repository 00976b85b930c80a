"""Image generation: gateway overhead, and other routes' latency while 64 image calls wait.

(1) Overhead: POST /api/v1/agents/images (provider-a general) through the WSGI test client against a
    fake upstream on loopback that answers a ~1 MB PNG after a fixed delay. Overhead = call time minus
    that delay: auth, validation, upstream HTTP (pooled connection), JSON + base64 decoding, Pillow
    decode, the blob write (local backend) and the usage line.
(2) Concurrency: a real gunicorn (docker/gunicorn.conf.py: gthread workers) on loopback; 64 image
    calls in flight against a 5 s upstream while GET /health and GET /api/v1/me (authenticated, cheap)
    are polled; their p95 next to an idle baseline.

Loopback only; bounded in time (about a minute).
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

from bench.common import BENCH_SECRET, ROOT, bench_app, bench_database_url, bench_token, percentile, table, write_result

API_KEY = "bench-key"
PORT = 8766
OVERHEAD_DELAY = 0.100
OVERHEAD_CALLS = 80
CONCURRENT_CALLS = 64
SLOW_DELAY = 5.0


def noise_png(width: int, height: int) -> bytes:
    rng = random.Random(7)
    img = Image.frombytes("RGB", (width, height), bytes(rng.getrandbits(8) for _ in range(width * height * 3)))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


class FakeUpstream:
    """provider-a generations answering one precomputed image after `delay` seconds.

    Served from a child process: the upstream is not part of the gateway, so its work (and its share
    of the GIL) must not be counted as gateway overhead.
    """

    def __init__(self, image: bytes, delay: float) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve_upstream, args=(image, delay, child), daemon=True)
        self.process.start()
        self.url = parent.recv()

    def close(self) -> None:
        self.process.terminate()
        self.process.join(10)


def _serve_upstream(image: bytes, delay: float, pipe) -> None:
    server = _UpstreamServer(image, delay)
    pipe.send(server.url)
    server.httpd.serve_forever()


class _UpstreamServer:
    def __init__(self, image: bytes, delay: float) -> None:
        body = json.dumps({"created": 0, "data": [{"b64_json": b64encode(image).decode()}],
                           "usage": {"input_tokens": 10, "output_tokens": 100, "total_tokens": 110}}).encode()
        upstream = self
        self.delay = delay

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(upstream.delay)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 256
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


BODY = {"provider": "provider-a", "model": "gpt-image-1", "prompt": "benchmark image"}


def overhead() -> tuple[list[float], list[float], int]:
    image = noise_png(600, 580)
    upstream = FakeUpstream(image, OVERHEAD_DELAY)
    try:
        app = bench_app(PROVIDER_A_ENDPOINT=upstream.url, PROVIDER_A_API_KEY=API_KEY)
        client = app.test_client()
        headers = {"Authorization": f"Bearer {bench_token('bench-images', scopes=['write:image-gen'])}"}
        for _ in range(5):  # warm-up: pooled connection, imports, first blob directory
            assert client.post("/api/v1/agents/images", json=BODY, headers=headers).status_code == 200
        samples, cpu = [], []
        for _ in range(OVERHEAD_CALLS):
            start, cpu_start = time.perf_counter(), time.process_time()
            resp = client.post("/api/v1/agents/images", json=BODY, headers=headers)
            elapsed = time.perf_counter() - start
            cpu.append((time.process_time() - cpu_start) * 1000)  # this process only: not the upstream
            assert resp.status_code == 200, resp.get_data(as_text=True)
            samples.append((elapsed - OVERHEAD_DELAY) * 1000)
        return samples, cpu, len(image)
    finally:
        upstream.close()


def _get(url: str, headers: dict | None = None) -> float:
    start = time.perf_counter()
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        assert resp.status == 200
    return (time.perf_counter() - start) * 1000


def _poll(url: str, headers: dict | None, seconds: float) -> list[float]:
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_get(url, headers))
        time.sleep(0.02)
    return samples


def _post_image(base: str, headers: dict) -> int:
    req = urllib.request.Request(f"{base}/api/v1/agents/images", data=json.dumps(BODY).encode(),
                                 headers=headers | {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
        return resp.status


def concurrency() -> dict:
    upstream = FakeUpstream(noise_png(256, 256), SLOW_DELAY)
    base = f"http://127.0.0.1:{PORT}"
    env = dict(os.environ, PORT=str(PORT), DATABASE_URL=bench_database_url(), JWT_SECRET=BENCH_SECRET,
               VAR_DIR=os.path.join(ROOT, "var", "bench"), REDIS_URL="", LOG_LEVEL="WARNING",
               PROVIDER_A_ENDPOINT=upstream.url, PROVIDER_A_API_KEY=API_KEY, PUBLIC_BASE_URL=base)
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                             "docker/gunicorn.conf.py", "--access-logfile", "/dev/null", "wsgi:app"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    me_headers = {"Authorization": f"Bearer {bench_token('bench-images')}"}
    image_headers = {"Authorization": f"Bearer {bench_token('bench-images', scopes=['write:image-gen'])}"}
    try:
        _wait_healthy(base)
        for _ in range(20):  # warm both workers
            _get(f"{base}/health")
            _get(f"{base}/api/v1/me", me_headers)
        idle_health = _poll(f"{base}/health", None, 3)
        idle_me = _poll(f"{base}/api/v1/me", me_headers, 3)
        with ThreadPoolExecutor(CONCURRENT_CALLS + 2) as pool:
            started = time.monotonic()
            images = [pool.submit(_post_image, base, image_headers) for _ in range(CONCURRENT_CALLS)]
            time.sleep(0.5)  # let all 64 reach the upstream
            busy_health = pool.submit(_poll, f"{base}/health", None, SLOW_DELAY - 1.5)
            busy_me = pool.submit(_poll, f"{base}/api/v1/me", me_headers, SLOW_DELAY - 1.5)
            statuses = [f.result() for f in images]
            wall = time.monotonic() - started
            busy_health, busy_me = busy_health.result(), busy_me.result()
        return {"idle_health": idle_health, "idle_me": idle_me, "busy_health": busy_health, "busy_me": busy_me,
                "ok": sum(s == 200 for s in statuses), "wall": wall}
    finally:
        proc.terminate()
        proc.wait(40)
        upstream.close()


def _wait_healthy(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _get(f"{base}/health")
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("gunicorn did not become healthy")


def main() -> str:
    load_before = os.getloadavg()[0]
    samples, cpu, image_bytes = overhead()
    c = concurrency()
    load_after = os.getloadavg()[0]
    p95 = lambda s: percentile(s, 0.95)  # noqa: E731
    body = table(["gateway overhead (call minus upstream delay)", "p50 ms", "p99 ms", "CPU p50 ms", "n"], [
        [f"POST /api/v1/agents/images, {image_bytes / 1e6:.2f} MB PNG, local blob store",
         percentile(samples, 0.5), percentile(samples, 0.99), percentile(cpu, 0.5), len(samples)],
    ]) + "\n\n" + table(["route", "idle p95 ms", f"p95 ms with {CONCURRENT_CALLS} image calls in flight",
                         "ratio", "n busy"], [
        ["GET /health", p95(c["idle_health"]), p95(c["busy_health"]), p95(c["busy_health"]) / p95(c["idle_health"]),
         len(c["busy_health"])],
        ["GET /api/v1/me", p95(c["idle_me"]), p95(c["busy_me"]), p95(c["busy_me"]) / p95(c["idle_me"]),
         len(c["busy_me"])],
    ]) + (f"\n\n{c['ok']}/{CONCURRENT_CALLS} image calls answered 200 against a {SLOW_DELAY:g} s upstream; "
          f"all done after {c['wall']:.2f} s.")
    return write_result("images", "Image generation benchmark", body,
                        f"Overhead: in-process WSGI client, fake provider-a (child process, loopback) answering after "
                        f"{OVERHEAD_DELAY * 1000:.0f} ms; target p50 <= 15 ms. CPU = process time of the gateway "
                        "process per call (independent of other load on the machine). Concurrency: gunicorn as "
                        "docker/gunicorn.conf.py configures it (gthread); the fake upstream runs in a child "
                        f"process of the bench. Machine load average (1 min) {load_before:.1f} before, "
                        f"{load_after:.1f} after: the machine is shared, so absolute figures move with it.")


if __name__ == "__main__":
    main()
