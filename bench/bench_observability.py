"""What observability costs a hot read: `GET /api/v1/entities/{name}/records/{id}` served by gunicorn as
the Procfile runs it (docker/gunicorn.conf.py, WEB_CONCURRENCY=2), `wrk -t2 -c8`, three variants side by
side in one run:

- off: METRICS_ENABLED=false (no request hooks, no metric files, the plain pool);
- metrics: the default (multiprocess files under VAR_DIR/metrics, the request hooks, pool gauges);
- metrics + tracing at 10 %: the same, with OpenTelemetry's standard environment (OTLP over HTTP to a
  local sink this benchmark runs, answering 200; parent-based 10 % trace-id sampling). Tracing is
  enabled from that environment by the tracing part of app.observability; a build without it shows
  no tracing cost in that row.

The variants run interleaved (ROUNDS rounds of off, metrics, tracing) so that the machine's load drifts
over all three alike; the table gives the median req/s of the rounds and the CPU time (user + system,
from /proc) of every gunicorn process per request served, which depends far less on the shared
machine's load than req/s does. `python -m bench observability` → bench/results/observability.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.bench_records_http import cpu_seconds, free_port, http, start_gunicorn, stop, worker_pids, wrk
from bench.common import bench_app, bench_token, table, write_result

DURATION, WARMUP = 10, 2
ROUNDS = int(os.environ.get("BENCH_OBSERVABILITY_ROUNDS", "5"))  # interleaved rounds per variant
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

    received = 0

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


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


def _gunicorn_pids(master: int) -> list[int]:
    return [master, *worker_pids(master)]


def main() -> str:
    app = bench_app(METRICS_ENABLED=False)
    url = app.config["DATABASE_URL"]
    record_id = _record(app)
    token = bench_token(ORG)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    sink_url = f"http://127.0.0.1:{sink.server_address[1]}"
    servers: dict[str, tuple] = {}
    saved = dict(os.environ)
    try:
        for label, settings in VARIANTS.items():
            port = free_port()
            os.environ.update(settings)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            if "OTEL_TRACES_EXPORTER" in settings:
                os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink_url
            else:
                for name in [n for n in os.environ if n.startswith("OTEL_")]:
                    del os.environ[name]
            proc = start_gunicorn(url, port)
            servers[label] = (proc, f"http://127.0.0.1:{port}/api/v1/entities/{ENTITY}/records/{record_id}")
            http("GET", servers[label][1], token)  # the record answers
            os.environ.clear()
            os.environ.update(saved)
        rates: dict[str, list[float]] = {label: [] for label in VARIANTS}
        cpu: dict[str, list[float]] = {label: [] for label in VARIANTS}
        errors: dict[str, int] = {label: 0 for label in VARIANTS}
        for _round in range(ROUNDS):
            for label, (proc, target) in servers.items():
                wrk(target, 8, token, WARMUP)
                pids = _gunicorn_pids(proc.pid)
                before = sum(cpu_seconds(p) for p in pids)
                result = wrk(target, 8, token, DURATION)
                used = sum(cpu_seconds(p) for p in pids) - before
                rates[label].append(result["rate"])
                cpu[label].append(1000 * used / (result["rate"] * DURATION))
                errors[label] += result["errors"]
                print(label, result, flush=True)
    finally:
        for proc, _target in servers.values():
            stop(proc)
        sink.shutdown()
        os.environ.clear()
        os.environ.update(saved)
    base_rate = statistics.median(rates[next(iter(VARIANTS))])
    base_cpu = statistics.median(cpu[next(iter(VARIANTS))])
    rows = []
    for label in VARIANTS:
        rate, cpu_ms = statistics.median(rates[label]), statistics.median(cpu[label])
        rows.append([label, rate, f"{100 * (rate / base_rate - 1):+.1f} %", cpu_ms,
                     f"{100 * (cpu_ms / base_cpu - 1):+.1f} %", " / ".join(f"{r:.0f}" for r in rates[label]),
                     errors[label]])
    body = table(["variant", "req/s (median)", "vs off", "CPU ms per request (median)", "vs off",
                  f"req/s of the {ROUNDS} rounds", "non-2xx"], rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    notes = (f"OTLP exports received by the local sink during the run: {_Sink.received} (0 when this build "
             "does not trace).\n\n"
             f"Machine load average (1/5/15 min) at the end: {load}. gunicorn -c docker/gunicorn.conf.py "
             "(gthread, WEB_CONCURRENCY=2 workers) on 127.0.0.1, wrk 4.1 (Debian) `-t2 -c8 "
             f"-d{DURATION}s` after a {WARMUP} s warm-up, {ROUNDS} interleaved rounds per variant, one record "
             "of one org, same machine (2 cores shared by server, PostgreSQL, wrk and other work). CPU per "
             "request: user + system time of the master and workers from /proc over a round, divided by "
             "the requests served.")
    return write_result("observability", "Cost of metrics and tracing on a record GET (gunicorn + wrk)", body, notes)


if __name__ == "__main__":
    sys.exit(main() and 0)
