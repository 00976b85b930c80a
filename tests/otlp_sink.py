"""A stand-in OpenTelemetry collector: an HTTP server on a free local port that takes OTLP/HTTP protobuf
trace exports (POST /v1/traces, what the SDK's OTLP exporter sends with OTEL_EXPORTER_OTLP_PROTOCOL=
http/protobuf) and keeps the spans, so a test reads back what other processes exported."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str  # SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL
    service: str
    attributes: dict = field(default_factory=dict, hash=False, compare=False)


_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind in ("string_value", "int_value", "bool_value", "double_value") else None


class OtlpSink:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                export = ExportTraceServiceRequest.FromString(body)
                sink._keep(export)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _keep(self, export) -> None:
        spans = []
        for resource_spans in export.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"),
                           "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(Span(trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                                      parent_id=span.parent_span_id.hex() or None, name=span.name,
                                      kind=_KINDS.get(span.kind, str(span.kind)), service=service,
                                      attributes={a.key: _value(a.value) for a in span.attributes}))
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
