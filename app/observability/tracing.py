"""OpenTelemetry traces: off unless OTEL_TRACES_EXPORTER names an exporter.

Configured by the standard variables only, read by the OpenTelemetry SDK itself: OTEL_TRACES_EXPORTER
(`otlp`, `console`, or both comma-separated; unset or `none`: tracing off), OTEL_SERVICE_NAME /
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, OTEL_EXPORTER_OTLP_* (the
OTLP/HTTP exporter with protobuf: `http/protobuf`), OTEL_BSP_* (the batch span processor),
OTEL_PROPAGATORS, OTEL_PYTHON_FLASK_EXCLUDED_URLS / OTEL_PYTHON_EXCLUDED_URLS. Beneath the environment
they are also read from the settings file ENV_FILE (app.config), like every other setting.

Each process sets tracing up once, after it was forked (a batch span processor's thread does not
survive a fork): gunicorn's `post_fork` hook (docker/gunicorn.conf.py) in each API process, Celery's
`worker_process_init` in each pool process (workers/__init__.py). `configure` installs the tracer
provider and instruments Celery (publish and run spans, the W3C trace context in the message headers),
psycopg (a span per SQL statement), Redis and requests (outgoing HTTP); create_app gives its Flask app
a server span per request (`instrument_app`, `ServerSpans`) when tracing is on in the process that
builds it.

A task written to the transactional outbox (app.tasks) carries the trace context of the request or task
that wrote it: `outbox_context` records an `outbox <task>` span, child of the current span, and its W3C
context is stored in the outbox row. Whoever sends the row later (the after-commit hook of the same
request, or a worker's `dispatch_outbox` seconds or hours later) sends it under that context
(`resumed`), so the task's spans have the request's span as an ancestor: request → outbox → publish →
task run → SQL, one trace.

When tracing is off nothing of the SDK is imported, and the only cost on a request or an enqueue is
reading `ENABLED`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from flask import g, request

log = logging.getLogger(__name__)

# True once this process has set tracing up (`configure`); every hook tests it first.
ENABLED = False
_configured_pid: int | None = None
_provider = None  # the SDK TracerProvider of this process
_instrumentors: list = []

EXPORTERS = ("otlp", "console")
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")


class TracingConfigError(RuntimeError):
    """An OTEL_* variable this service cannot honour; start-up stops with the message."""


def otel_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OTEL_* variables: the environment over the settings file ENV_FILE (app.config)."""
    from app.config import SETTINGS, env_file_values

    environ = os.environ if environ is None else environ
    try:
        from_file = env_file_values(environ.get("ENV_FILE", SETTINGS["ENV_FILE"][0]))
    except RuntimeError:  # a missing ENV_FILE is reported by load_config, which every process runs
        from_file = {}
    merged = {name: value for name, value in from_file.items() if name.startswith("OTEL_")}
    merged.update({name: value for name, value in environ.items() if name.startswith("OTEL_")})
    return merged


def exporter_names(otel: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names; [] when tracing is off (unset, empty or `none`)."""
    names = [name.strip().lower() for name in otel.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    if not names or names == ["none"]:
        return []
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown or "none" in names:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={otel['OTEL_TRACES_EXPORTER']!r}: this service exports traces with "
            f"{' or '.join(EXPORTERS)} (comma-separated for both), or `none` (tracing off)")
    return names


def check_settings(otel: Mapping[str, str]) -> None:
    """Refuse, with a clear message, the OTEL_* values the SDK would only warn about and replace."""
    sampler = otel.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER={sampler!r}: one of {', '.join(SAMPLERS)}")
    if sampler.endswith("traceidratio"):
        raw = otel.get("OTEL_TRACES_SAMPLER_ARG", "")
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: the share of traces kept, a number "
                                     f"from 0 to 1 (0.1 keeps one in ten)")
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = otel.get(name, "").strip().lower()
        if protocol and protocol != "http/protobuf":
            raise TracingConfigError(f"{name}={protocol!r}: this service exports OTLP over HTTP with protobuf "
                                     f"(`http/protobuf`); point it at the collector's HTTP port (4318)")
        if protocol:
            break


def configure(service: str, *, exporter=None) -> bool:
    """Set tracing up in this process when OTEL_TRACES_EXPORTER asks for it (or with `exporter`, a span
    exporter given by a test, e.g. InMemorySpanExporter, whose spans are exported as they end).
    `service` is the service name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one.
    Idempotent in a process. Returns whether tracing is on."""
    global ENABLED, _configured_pid, _provider
    if ENABLED and _configured_pid == os.getpid() and exporter is None:
        return True
    otel = otel_environment()
    names = exporter_names(otel)
    if not names and exporter is None:
        return False
    check_settings(otel)
    for name, value in otel.items():  # the SDK reads os.environ: the file's values beneath it
        os.environ.setdefault(name, value)

    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the SDK's: set once per process
        named = "OTEL_SERVICE_NAME" in otel or "service.name=" in otel.get("OTEL_RESOURCE_ATTRIBUTES", "")
        provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: service}))
        trace.set_tracer_provider(provider)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif _configured_pid is None:  # a process that inherited a provider keeps its processors (re-made by the SDK)
        for name in names:
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    _provider = provider
    _instrument(provider)
    _configured_pid = os.getpid()
    ENABLED = True
    log.info("tracing on: %s, sampler %s", ", ".join(names) or "test exporter",
             os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"))
    return True


def _exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression, certificates: OTEL_EXPORTER_OTLP_*


def _instrument(provider) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    for instrumentor in (CeleryInstrumentor(), PsycopgInstrumentor(), RedisInstrumentor(), RequestsInstrumentor()):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider, skip_dep_check=True)
            _instrumentors.append(instrumentor)


def instrument_app(app) -> None:
    """Trace `app`'s requests when tracing is on: a server span per request (see `ServerSpans`)."""
    if not ENABLED:
        return
    ServerSpans(app)


class ServerSpans:
    """A SERVER span per request, named `METHOD route-template` (`GET /api/v1/entities/<string:entityName>/
    records/<string:recordId>`: no ids in the name), child of the caller's W3C `traceparent` when it sends
    one, current for the whole request (every request hook included, authentication's 401 too: create_app
    installs it before any other hook). Attributes (HTTP semantic conventions): http.request.method,
    url.path, url.scheme, http.route, server.address, client.address, user_agent.original,
    http.response.status_code; a 5xx sets the span's status to error. OTEL_PYTHON_FLASK_EXCLUDED_URLS /
    OTEL_PYTHON_EXCLUDED_URLS (regular expressions on the URL) leave requests untraced.

    Not the Flask instrumentation package: it builds every attribute and its HTTP metrics before the
    sampler has decided, about 0.3 ms of CPU per request on this service whether the request is kept or
    not (measured: docs/decisions.md). Here the sampler decides first, and a request it leaves out costs
    a span id and a context switch. Such a request also suppresses the other instrumentations (its SQL,
    Redis and HTTP calls would make spans nobody keeps); a task it writes to the outbox still carries
    its unsampled context, so the task is left out too."""

    _KEY = "_otel_server_span"

    def __init__(self, app) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import Status, StatusCode
        from opentelemetry.util.http import get_excluded_urls

        self.tracer = trace.get_tracer("app.observability.tracing", tracer_provider=_provider)
        excluded = get_excluded_urls("FLASK")
        # None when no URL is excluded: `request.url` (built from the environ) is not computed per request
        self.excluded = excluded if excluded._excluded_urls else None
        # the WSGI names of the headers the propagators read (traceparent, tracestate, baggage): a request
        # that carries none of them has no remote parent, and extraction is skipped
        fields = propagate.get_global_textmap().fields
        self._carried = tuple("HTTP_" + name.upper().replace("-", "_") for name in fields)
        # bound once: these run on every request
        self._extract, self._attach, self._detach = propagate.extract, context.attach, context.detach
        self._in_context, self._set_value = trace.set_span_in_context, context.set_value
        self._suppress, self._server = context._SUPPRESS_INSTRUMENTATION_KEY, trace.SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        self._status = Status
        app.before_request(self.start)
        app.after_request(self.respond)
        app.teardown_request(self.end)

    def start(self) -> None:
        req = request._get_current_object()  # one proxy lookup: this runs on every request
        if self.excluded is not None and self.excluded.url_disabled(req.url):
            return
        environ = req.environ
        parent = None  # the current context: a request thread's is empty
        for name in self._carried:
            if name in environ:
                parent = self._extract(req.headers)
                break
        rule = req.url_rule
        route = rule.rule if rule is not None else None
        method = req.method
        span = self.tracer.start_span(f"{method} {route}" if route else method, context=parent, kind=self._server)
        current = self._in_context(span, parent)
        recording = span.is_recording()
        if recording:
            attributes = {"http.request.method": method, "url.path": req.path, "url.scheme": req.scheme,
                          "server.address": req.host, "client.address": environ.get("REMOTE_ADDR", ""),
                          "user_agent.original": environ.get("HTTP_USER_AGENT", "")}
            if route:
                attributes["http.route"] = route
            span.set_attributes(attributes)
        else:
            current = self._set_value(self._suppress, True, current)
        setattr(g, self._KEY, (span, self._attach(current), recording))

    def respond(self, response):
        found = g.get(self._KEY)
        if found is not None and found[2]:
            span = found[0]
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(self._error)
        return response

    def end(self, exc=None) -> None:
        found = g.pop(self._KEY, None)
        if found is None:
            return
        span, token, recording = found
        if recording:  # (a span the sampler left out records nothing: ending it does nothing)
            if exc is not None:
                span.record_exception(exc)
                span.set_status(self._status(self._error.status_code, type(exc).__name__))
            span.end()
        self._detach(token)


def shutdown() -> None:
    """Export what is buffered (a process that exits: gunicorn's worker_exit, a Celery pool process's
    shutdown; those exit without running atexit handlers)."""
    if _provider is not None and _configured_pid == os.getpid():
        try:
            _provider.force_flush(5000)
        except Exception:  # an unreachable collector must not stop the process from exiting
            log.warning("tracing: could not export the last spans", exc_info=True)


def stop() -> None:
    """Uninstrument this process and turn tracing off (tests that set it up for themselves)."""
    global ENABLED
    shutdown()
    while _instrumentors:
        _instrumentors.pop().uninstrument()
    ENABLED = False


# --- the trace context of an outbox row ------------------------------------------------------------------

def outbox_context(task_name: str, message_id: str) -> dict[str, str] | None:
    """The W3C trace context a task written to the outbox carries: the context of an `outbox <task>` span,
    child of the current span (the request's, or the task's that chains another). None when tracing is
    off."""
    if not ENABLED:
        return None
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(__name__, tracer_provider=_provider)
    with tracer.start_as_current_span(f"outbox {task_name}", kind=trace.SpanKind.PRODUCER,
                                      attributes={"messaging.system": "celery",
                                                  "messaging.message.id": message_id,
                                                  "celery.task_name": task_name}):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def resumed(carrier: Mapping[str, Any] | None) -> Iterator[None]:
    """Run the block in the trace context `carrier` (an outbox row's) when tracing is on here, so the
    Celery publish span of the message sent inside is its child."""
    if not ENABLED or not carrier:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        context.detach(token)


def publish_failed(task, message_id: str, exc: BaseException) -> None:
    """End the Celery publish span of a message the broker did not take (Redis down): Celery sends no
    `after_task_publish` then, and the span would stay open and current for the rest of the request."""
    if not ENABLED:
        return
    from opentelemetry.instrumentation.celery import utils

    found = utils.retrieve_context(task, message_id, is_publish=True)
    if found is None:
        return
    _span, activation, _token = found
    activation.__exit__(type(exc), exc, exc.__traceback__)  # records the error, ends the span, detaches it
    utils.detach_context(task, message_id, is_publish=True)


def message_headers(carrier: Mapping[str, Any] | None) -> dict[str, str] | None:
    """Headers of the Celery message of an outbox row: its trace context, so a task sent by a process
    that does not trace (a worker's main process, which re-sends the outbox) still continues the trace.
    A tracing publisher replaces them with its publish span's context, a child of the same."""
    if not carrier:
        return None
    return {str(k): str(v) for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span as hex, for log lines; None when tracing is off or no
    span is current."""
    if not ENABLED:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
