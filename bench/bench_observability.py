"""What observability costs a hot read: `GET /api/v1/entities/{name}/records/{id}` served by gunicorn as
the Procfile runs it (docker/gunicorn.conf.py), three variants side by side in one run:

- off: METRICS_ENABLED=false (no request hooks, no metric files, the plain pool);
- metrics: the default (multiprocess files under VAR_DIR/metrics, the request hooks, pool gauges);
- metrics + tracing at 10 %: the same, with OpenTelemetry's standard environment (OTLP over HTTP to a
  local sink this benchmark runs, answering 200; parent-based 10 % trace-id sampling).

Two measurements:

1. Throughput: `wrk -t2 -c8` against each server (WEB_CONCURRENCY=2 workers), in ROUNDS short rounds
   interleaved (off, metrics, tracing, then the next round in a rotated order) so that the machine's
   load drifts over all three alike. Per variant: the median req/s of the rounds and their spread, and
   the CPU time (user + system, from /proc) of every gunicorn process per request served, which depends
   far less on the shared machine's load than req/s does.
2. Instructions per request (BENCH_OBSERVABILITY_CALLGRIND=1, the default; needs valgrind): one server
   per variant with one worker (4 threads) runs under `valgrind --tool=callgrind` with counting off; after
   a warm-up, a window of CALLGRIND_REQUESTS sequential GETs on one keep-alive connection is counted
   (bench.callgrind: signals to the worker start and dump the count). Instruction counts do not depend
   on the machine's load, so this table settles a difference that the spread of req/s hides. Tracing is
   also counted at 0 % and 100 % sampling: the cost of a request the sampler leaves out and of one it
   keeps, hence the expected cost at 10 % without the luck of the draw. The servers run at the same
   time (their counts do not depend on it), before the wrk rounds.

Settings: BENCH_OBSERVABILITY_ROUNDS (12), BENCH_OBSERVABILITY_SECONDS (3, one wrk round),
BENCH_OBSERVABILITY_CALLGRIND (1), BENCH_OBSERVABILITY_CALLGRIND_REQUESTS (200).

`python -m bench observability` → bench/results/observability.md, in about 5 minutes (wrk is installed by
`make bench-tools` when missing); every process it starts is stopped before it returns.
"""

from __future__ import annotations

import gzip
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench import callgrind
from bench.bench_records_http import cpu_seconds, free_port, stop, worker_pids, wrk
from bench.bench_records_http import http as http_call
from bench.common import BENCH_SECRET, ROOT, bench_app, bench_token, table, write_result

DURATION = int(os.environ.get("BENCH_OBSERVABILITY_SECONDS", "3"))  # seconds of one wrk round
ROUNDS = int(os.environ.get("BENCH_OBSERVABILITY_ROUNDS", "12"))  # interleaved rounds per variant
CALLGRIND = os.environ.get("BENCH_OBSERVABILITY_CALLGRIND", "1") not in ("0", "false", "")
CALLGRIND_REQUESTS = int(os.environ.get("BENCH_OBSERVABILITY_CALLGRIND_REQUESTS", "200"))
CALLGRIND_WARMUP = 40
CONNECTIONS = 8
ORG = "bench-observability"
ENTITY = "observed"

VARIANTS = {
    "off (METRICS_ENABLED=false)": {"METRICS_ENABLED": "false"},
    "metrics": {"METRICS_ENABLED": "true"},
    "metrics + tracing 10 %": {"METRICS_ENABLED": "true", "OTEL_TRACES_EXPORTER": "otlp",
                               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
}


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector stand-in: reads the export and answers 200 (an empty protobuf response)."""

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received += 1
        self.server.server_spans += _server_spans(body)  # the requests traced (one SERVER span each)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _start_sink() -> ThreadingHTTPServer:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    sink.received = sink.server_spans = 0
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    return sink


def _server_spans(body: bytes) -> int:
    if body[:2] == b"\x1f\x8b":  # OTEL_EXPORTER_OTLP_COMPRESSION=gzip
        body = gzip.decompress(body)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    request = ExportTraceServiceRequest.FromString(body)
    return sum(1 for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans
               if span.kind == Span.SpanKind.SPAN_KIND_SERVER)


def _record(app) -> str:
    """One definition and one record of the bench org (made once, reused by later runs)."""
    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token(ORG)}"}
    found = client.post(f"/api/v1/entities/{ENTITY}/records/query", json={"query": {"pageSize": 1}}, headers=headers)
    if found.status_code == 200 and found.get_json()["records"]:
        return found.get_json()["records"][0]["id"]
    schema = {"type": "object", "properties": {"title": {"type": "text"}, "qty": {"type": "int"}}}
    resp = client.post("/api/v1/entities/definitions", headers=headers,
                       json={"name": ENTITY, "displayName": "Observed", "schema": schema})
    assert resp.status_code == 201, resp.get_json()
    resp = client.post(f"/api/v1/entities/{ENTITY}/records", headers=headers,
                       json={"name": "one", "fields": {"title": "a record of ordinary size", "qty": 3},
                             "tags": ["bench"], "metadata": {"source": "bench"}})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()["id"]


def _environment(settings: dict[str, str], database_url: str, port: int, sink_url: str, **extra: str) -> dict:
    """The server's environment: this process's, without any OTEL_* or metric directory of its own, plus the
    variant's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({"PORT": str(port), "DATABASE_URL": database_url, "JWT_SECRET": BENCH_SECRET, "LOG_LEVEL": "WARNING",
                "REDIS_URL": "", "VAR_DIR": os.path.join(ROOT, "var", "bench"), **settings, **extra})
    if "OTEL_TRACES_EXPORTER" in settings:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink_url
    return env


LOGS = os.path.join(ROOT, "var", "bench", "observability-logs")


def _start(cmd: list[str], env: dict, port: int, wait: float) -> subprocess.Popen:
    """Start a server; its stderr goes to LOGS/<port>.log (a pipe nobody reads could fill and stall it)."""
    os.makedirs(LOGS, exist_ok=True)
    log_path = os.path.join(LOGS, f"{port}.log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log_file,
                                start_new_session=True)  # its own process group: `stop` ends all of it
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return proc
        except OSError:
            if proc.poll() is not None:
                with open(log_path) as fh:
                    raise RuntimeError(fh.read()[-2000:]) from None
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"gunicorn did not start in {wait:.0f} s: {' '.join(cmd[:3])}")


def _gunicorn(config: str, port: int) -> list[str]:
    return [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "gunicorn", "-c", os.path.join(ROOT, config),
            "--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null", "wsgi:app"]


# -- 1. req/s and CPU per request ------------------------------------------------------------------------

def throughput(database_url: str, path: str, token: str, sink_url: str) -> dict[str, dict]:
    servers: dict[str, tuple] = {}
    results = {label: {"rates": [], "cpu": [], "errors": 0} for label in VARIANTS}
    try:
        for label, settings in VARIANTS.items():
            port = free_port()
            proc = _start(_gunicorn("docker/gunicorn.conf.py", port),
                          _environment(settings, database_url, port, sink_url), port, 90)
            servers[label] = (proc, f"http://127.0.0.1:{port}{path}")
            http_call("GET", servers[label][1], token)  # the record answers
        for _proc, target in servers.values():
            wrk(target, CONNECTIONS, token, 2)  # warm-up: every thread and connection made
        labels = list(VARIANTS)
        for round_ in range(ROUNDS):
            for label in labels[round_ % 3:] + labels[:round_ % 3]:  # rotated: no variant always runs first
                proc, target = servers[label]
                pids = [proc.pid, *worker_pids(proc.pid)]
                before = sum(cpu_seconds(p) for p in pids)
                result = wrk(target, CONNECTIONS, token, DURATION)
                used = sum(cpu_seconds(p) for p in pids) - before
                results[label]["rates"].append(result["rate"])
                results[label]["cpu"].append(1000 * used / (result["rate"] * DURATION))
                results[label]["errors"] += result["errors"]
            print(f"round {round_ + 1}/{ROUNDS}:",
                  ", ".join(f"{label.split(' (')[0]} {results[label]['rates'][-1]:.0f}/s" for label in labels),
                  flush=True)
    finally:
        for proc, _target in servers.values():
            stop(proc)
    return results


# -- 2. instructions per request (callgrind) -------------------------------------------------------------

def _get(conn: http.client.HTTPConnection, path: str, token: str) -> None:
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"GET {path}: {resp.status}")


def _wait_for(path: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError(f"{path} did not appear in {seconds:.0f} s")
        time.sleep(0.2)


def instructions(label: str, settings: dict, database_url: str, path: str, token: str, workdir: str
                 ) -> tuple[float, int]:
    """(instructions one worker runs per request (callgrind), over CALLGRIND_REQUESTS requests after a
    warm-up; the requests of the window that were traced)"""
    sink = _start_sink()  # this server's own: the count of traced requests is the window's
    sink_url = f"http://127.0.0.1:{sink.server_address[1]}"
    try:
        return _instructions(label, settings, database_url, path, token, sink, sink_url, workdir)
    finally:
        sink.shutdown()


def _instructions(label, settings, database_url, path, token, sink, sink_url, workdir) -> tuple[float, int]:
    port = free_port()
    out = os.path.join(workdir, f"callgrind-{port}")
    marker = os.path.join(workdir, f"window-{port}")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
           *_gunicorn("bench/callgrind_gunicorn.py", port)]
    # Spans are exported when the window starts (what the warm-up left) and when it ends (the window's
    # spans: one export, counted), never on the batch processor's timer: under callgrind's slowdown the
    # 5 s timer would export every few requests, where at full speed one export carries hundreds.
    env = _environment(settings, database_url, port, sink_url, WEB_CONCURRENCY="1", GUNICORN_THREADS="4",
                       BENCH_CALLGRIND_MARKER=marker, OTEL_BSP_SCHEDULE_DELAY="3600000")
    proc = _start(cmd, env, port, 240)
    try:
        worker = worker_pids(proc.pid)[0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(CALLGRIND_WARMUP):
            _get(conn, path, token)
        os.kill(worker, callgrind.SIGNAL_START)
        _wait_for(marker + ".on", 120)
        # the export of the warm-up's spans (under callgrind, on a loaded machine) can outlast gunicorn's
        # 5 s keep-alive: the window starts on a new connection (one accept in 600 requests)
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        traced = sink.server_spans
        for _ in range(CALLGRIND_REQUESTS):
            _get(conn, path, token)
        os.kill(worker, callgrind.SIGNAL_DUMP)
        _wait_for(marker + ".dumped", 300)
        traced = sink.server_spans - traced
        conn.close()
        total = callgrind.total_instructions(f"{out}.{worker}.1")
    finally:
        stop(proc)
    print(f"callgrind {label}: {total / CALLGRIND_REQUESTS:,.0f} instructions per request, {traced} traced",
          flush=True)
    return total / CALLGRIND_REQUESTS, traced


def _sampled(ratio: str) -> dict[str, str]:
    return {**VARIANTS[TRACED], "OTEL_TRACES_SAMPLER_ARG": ratio}


TRACED = "metrics + tracing 10 %"
# counted too: what tracing costs a request the sampler leaves out, and one it keeps
CALLGRIND_VARIANTS = {**VARIANTS, "metrics + tracing 0 % (no request kept)": _sampled("0"),
                      "metrics + tracing 100 % (every request kept)": _sampled("1")}


def all_instructions(database_url: str, path: str, token: str) -> dict[str, tuple[float, int]]:
    """{variant: (instructions per request, requests traced in the window)}"""
    found: dict[str, tuple[float, int]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as workdir:
        def run(label: str, settings: dict) -> None:
            try:
                found[label] = instructions(label, settings, database_url, path, token, workdir)
            except Exception as exc:  # reported in the table; the req/s part still stands
                failures.append(f"{label}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=run, args=item) for item in CALLGRIND_VARIANTS.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for failure in failures:
        print("callgrind failed:", failure, flush=True)
    return found


def _ensure_wrk() -> None:
    if shutil.which("wrk") is None:  # the Debian package, as `make bench-tools` installs it
        subprocess.run(["make", "-s", "bench-tools"], cwd=ROOT, check=True)


def main() -> str:
    _ensure_wrk()
    started = time.time()
    app = bench_app(METRICS_ENABLED=False)
    database_url = app.config["DATABASE_URL"]
    path = f"/api/v1/entities/{ENTITY}/records/{_record(app)}"
    token = bench_token(ORG)
    use_callgrind = CALLGRIND and shutil.which("valgrind") is not None and callgrind.available()
    counts = all_instructions(database_url, path, token) if use_callgrind else {}
    sink = _start_sink()
    try:
        results = throughput(database_url, path, token, f"http://127.0.0.1:{sink.server_address[1]}")
    finally:
        sink.shutdown()
    base = next(iter(VARIANTS))

    def versus(value: float, reference: float) -> str:
        return f"{100 * (value / reference - 1):+.1f} %"

    base_rate, base_cpu = statistics.median(results[base]["rates"]), statistics.median(results[base]["cpu"])
    metrics_rate, metrics_cpu = (statistics.median(results["metrics"]["rates"]),
                                 statistics.median(results["metrics"]["cpu"]))
    rows = []
    for label in VARIANTS:
        rates, cpu = results[label]["rates"], results[label]["cpu"]
        rate, cpu_ms = statistics.median(rates), statistics.median(cpu)
        traced = label == TRACED
        rows.append([label, f"{rate:.0f}", versus(rate, base_rate), versus(rate, metrics_rate) if traced else "–",
                     f"{min(rates):.0f}–{max(rates):.0f}", f"{cpu_ms:.3f}", versus(cpu_ms, base_cpu),
                     versus(cpu_ms, metrics_cpu) if traced else "–", f"{min(cpu):.3f}–{max(cpu):.3f}",
                     results[label]["errors"]])
    body = table(["variant", "req/s (median)", "vs off", "vs metrics", f"req/s range ({ROUNDS} rounds)",
                  "CPU ms per request (median)", "vs off", "vs metrics", "CPU ms range", "non-2xx"], rows)
    if counts:
        body += "\n\nInstructions per request (callgrind; the same under any load):\n\n" + _instruction_table(counts)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    callgrind_note = (
        f"Instructions: `valgrind --tool=callgrind` (valgrind {_valgrind_version()}) of one gunicorn worker "
        f"(WEB_CONCURRENCY=1, 4 threads) per variant, counting only a window of {CALLGRIND_REQUESTS} sequential "
        f"GETs on one keep-alive connection after {CALLGRIND_WARMUP} uncounted ones (the whole worker: "
        "gunicorn's parsing and polling, the app, psycopg, the metrics writer and span export threads). "
        "Objects made before the window are frozen (gc.freeze), so that a full garbage collection falling "
        "due inside a short window does not weigh on one variant alone. The spans are exported when the "
        "window starts (the warm-up's) and when it ends (the window's, in one export, counted), not on the "
        "batch processor's 5 s timer, which under callgrind's slowdown would export every few requests "
        "where at full speed one export carries hundreds of spans. The sampler keeps about one request in "
        f"ten at random ({CALLGRIND_REQUESTS // 10} ± {(CALLGRIND_REQUESTS * 0.09) ** 0.5:.0f} of "
        f"{CALLGRIND_REQUESTS} by chance); the 0 % and 100 % servers give the cost of a request left out and "
        "of one kept, and the \"10 % expected\" row is the 0 % row plus a tenth of the difference."
        if counts else
        "Instructions: not measured (BENCH_OBSERVABILITY_CALLGRIND=0, or valgrind is not installed).")
    notes = (f"Throughput: gunicorn -c docker/gunicorn.conf.py (gthread, WEB_CONCURRENCY=2 workers) on "
             f"127.0.0.1, wrk 4.1 `-t2 -c{CONNECTIONS} -d{DURATION}s`, {ROUNDS} rounds per variant "
             "interleaved (the order rotated each round) after a 2 s warm-up of each, one record of one org, "
             "same machine (server, PostgreSQL and wrk share the cores). CPU per request: user + system "
             "time of the master and workers from /proc over a round, divided by the requests served; median "
             f"and range over the rounds. OTLP exports received by the local sink: {sink.received}. Machine "
             f"load average (1/5/15 min) at the end: {load}.\n\n"
             f"{callgrind_note}\n\nWall time of the benchmark: {time.time() - started:.0f} s.")
    return write_result("observability", "Cost of metrics and tracing on a record GET (gunicorn + wrk)", body, notes)


def _instruction_table(counts: dict[str, tuple[float, int]]) -> str:
    base = next(iter(VARIANTS))
    none_kept, all_kept = list(CALLGRIND_VARIANTS)[len(VARIANTS):]
    rows: list[list] = []

    def row(label: str, value: float, traced: str) -> None:
        off = counts.get(base, (0, 0))[0]
        metered = counts.get("metrics", (0, 0))[0]
        versus_metrics = f"{100 * (value / metered - 1):+.1f} %" if metered and label not in (base, "metrics") else "–"
        rows.append([label, f"{value / 1e6:.3f}", f"{100 * (value / off - 1):+.1f} %" if off else "",
                     versus_metrics, traced])

    for label in CALLGRIND_VARIANTS:
        if label in counts:
            value, traced = counts[label]
            row(label, value, f"{traced} of {CALLGRIND_REQUESTS}" if "OTEL_TRACES_EXPORTER" in
                CALLGRIND_VARIANTS[label] else "–")
        else:
            rows.append([label, "failed", "", "", ""])
    if none_kept in counts and all_kept in counts:
        low, high = counts[none_kept][0], counts[all_kept][0]
        row("metrics + tracing 10 % expected (0 % + a tenth of the 100 % extra)", low + 0.1 * (high - low),
            f"{CALLGRIND_REQUESTS // 10} of {CALLGRIND_REQUESTS}")
    return table(["variant", "million instructions per request", "vs off", "vs metrics", "requests traced"], rows)


def _valgrind_version() -> str:
    try:
        return subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip().split("-")[-1]
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main() and 0)
