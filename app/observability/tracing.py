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
reading `ENABLED`. When it is on, a request the sampler leaves out costs little: the root decision is
taken before the SDK is asked for a span (`_RootSampling`), and its SQL runs with no span made
(`_lean_cursor_tracer`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from flask import request

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


def configure(service: str, *, exporter=None, publisher_only: bool = False) -> bool:
    """Set tracing up in this process when OTEL_TRACES_EXPORTER asks for it (or with `exporter`, a span
    exporter given by a test, e.g. InMemorySpanExporter, whose spans are exported as they end).
    `service` is the service name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one.
    `publisher_only`: instrument Celery alone (a prefork worker's main process: its outbox dispatch makes
    publish spans, while its SQL, and the broker's Redis polling of its consumer, make none); a process
    forked from it later (a pool process) that calls `configure` again instruments the rest.
    Idempotent in a process. Returns whether tracing is on."""
    global ENABLED, _configured_pid, _provider, _BoundedAttributes
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
    from opentelemetry.attributes import BoundedAttributes

    _BoundedAttributes = BoundedAttributes
    _instrument(provider, publisher_only)
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

    exporter = OTLPSpanExporter()  # endpoint, headers, timeout, compression, certificates: OTEL_EXPORTER_OTLP_*
    if not _otlp_exporters and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_export_connections)
    _otlp_exporters.append(exporter)
    return exporter


_otlp_exporters: list = []  # the OTLP exporters this process made (a forked child inherits them)


def _forget_export_connections() -> None:
    """In a process forked from one that exports (a pool process the prefork worker's main process starts
    after it set tracing up): drop the inherited keep-alive connections to the collector, which the parent
    goes on using; the child's first export opens its own. (The SDK's batch processor re-makes its
    thread and empties its queue in the child itself.)"""
    for exporter in _otlp_exporters:
        session = getattr(getattr(getattr(exporter, "_client", None), "_transport", None), "_session", None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()


def _instrument(provider, publisher_only: bool = False) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentors = [CeleryInstrumentor()]
    if not publisher_only:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.instrumentation.requests import RequestsInstrumentor

        _lean_sql_spans()
        instrumentors += [PsycopgInstrumentor(), RedisInstrumentor(), RequestsInstrumentor()]
    for instrumentor in instrumentors:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider, skip_dep_check=True)
            _instrumentors.append(instrumentor)


_LeanCursorTracer = None


def _lean_sql_spans() -> None:
    """The psycopg instrumentation, with a cheaper per-statement path (`_LeanCursorTracer`): installed in
    its module before it instruments, so every cursor class it makes uses it."""
    global _LeanCursorTracer
    from opentelemetry.instrumentation import psycopg as instrumented

    if _LeanCursorTracer is None:
        _LeanCursorTracer = _lean_cursor_tracer(instrumented.CursorTracer)
    instrumented.CursorTracer = _LeanCursorTracer


def _lean_cursor_tracer(base):
    """A subclass of the psycopg instrumentation's CursorTracer that makes the same CLIENT span per
    statement (same name, same attributes, same error status and event) for less work:

    - a statement under a span the sampler left out, or with instrumentation suppressed (a request the
      sampler left out: `ServerSpans`), runs with no span at all, where the SDK would make and discard a
      non-recording one (a parent-based sampler drops every child of a dropped parent);
    - the attributes that do not change for a connection (database system and name, server address and
      port, user) are built once per connection, not per statement, and stored as they are
      (`_plain_attributes`);
    - the span is made current without the SDK's context-manager layers.

    Whatever it does not cover (sql comments, captured parameters, the new database semantic conventions
    with their duration metrics, a sampler that is not parent-based) goes through the instrumentation's
    own path unchanged."""
    from opentelemetry import context, trace
    from opentelemetry.instrumentation._semconv import _report_new, _set_db_name, _set_db_statement, _set_db_system
    from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY_PLAIN
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation import _SPAN_KEY

    suppress, suppress_plain = context._SUPPRESS_INSTRUMENTATION_KEY, _SUPPRESS_INSTRUMENTATION_KEY_PLAIN
    get_current, attach, detach, Context = context.get_current, context.attach, context.detach, context.Context
    client, sdk_span = SpanKind.CLIENT, trace.Span

    class LeanCursorTracer(base):
        _plain = None  # the per-connection settings, decided at the first statement (see _decide)

        def _decide(self):
            integration = self._db_api_integration
            tracer = integration._tracer
            sampler = getattr(tracer, "sampler", None)
            mode = integration._sem_conv_opt_in_mode_db
            lean = (not self._commenter_enabled and not integration.capture_parameters and not _report_new(mode)
                    and isinstance(sampler, ParentBased) and sampler._local_parent_not_sampled is ALWAYS_OFF
                    and sampler._remote_parent_not_sampled is ALWAYS_OFF)
            constant: dict = {}
            _set_db_system(constant, integration.database_system, mode)
            _set_db_name(constant, integration.database, mode)
            probe: dict = {}
            _set_db_statement(probe, "?", mode)
            connection = dict(integration.span_attributes)
            plain = (str, int, float, bool)  # what `_plain_attributes` may store as it is
            lean = lean and all(isinstance(key, str) and key and type(value) in plain
                                for key, value in {**constant, **connection}.items())
            self._plain = (lean, tracer, constant, tuple(probe), connection)
            return self._plain

        def traced_execution(self, cursor, query_method, *args, **kwargs):
            current = get_current()
            if current.get(suppress) or current.get(suppress_plain):
                return query_method(*args, **kwargs)
            lean, tracer, constant, statement_keys, connection = self._plain or self._decide()
            if not lean:
                return super().traced_execution(cursor, query_method, *args, **kwargs)
            parent = current.get(_SPAN_KEY)
            if parent is not None:
                found = parent.get_span_context()
                if found.is_valid and not found.trace_flags.sampled:  # the sampler drops it: no span
                    return query_method(*args, **kwargs)
            name = self.get_operation_name(cursor, args) or (
                self._db_api_integration.database or self._db_api_integration.name)
            attributes = dict(constant)
            statement = self.get_statement(cursor, args)
            for key in statement_keys:
                attributes[key] = statement
            attributes.update(connection)
            span = tracer.start_span(name, context=current, kind=client)
            if span.is_recording():
                _plain_attributes(span, attributes)
            values = dict(current)
            values[_SPAN_KEY] = span
            token = attach(Context(values))
            try:
                return query_method(*args, **kwargs)
            except Exception as exc:  # as the SDK's start_as_current_span records it
                if isinstance(span, sdk_span) and span.is_recording():
                    span.record_exception(exc)
                    span.set_status(Status(status_code=StatusCode.ERROR, description=f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                detach(token)
                span.end()

    return LeanCursorTracer


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
        self._get_current, self._context = context.get_current, context.Context
        self._span_key = trace.propagation._SPAN_KEY
        self._root = _RootSampling(self.tracer)
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
        if parent is None and self._root.fast:
            current = self._get_current()
            if current.get(self._span_key) is None:  # a root span: the sampler's decision is taken here
                span = self._root.dropped()
                if span is not None:  # left out: a context with no span made, instrumentation suppressed
                    values = dict(current)
                    values[self._span_key] = span
                    values[self._suppress] = True
                    _REQUEST_SPAN.set((span, self._attach(self._context(values)), False))
                    return
                # kept: the SDK makes the span below, with the trace id drawn for the decision
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
            _plain_attributes(span, attributes)
        else:
            current = self._set_value(self._suppress, True, current)
        _REQUEST_SPAN.set((span, self._attach(current), recording))

    def respond(self, response):
        found = _REQUEST_SPAN.get()
        if found is not None and found[2]:
            span = found[0]
            _plain_attributes(span, {"http.response.status_code": response.status_code})
            if response.status_code >= 500:
                span.set_status(self._error)
        return response

    def end(self, exc=None) -> None:
        found = _REQUEST_SPAN.get()
        if found is None:
            return
        _REQUEST_SPAN.set(None)
        span, token, recording = found
        if recording:  # (a span the sampler left out records nothing: ending it does nothing)
            if exc is not None:
                span.record_exception(exc)
                span.set_status(self._status(self._error.status_code, type(exc).__name__))
            span.end()
        self._detach(token)


# (span, context token, recording) of the request this thread serves, from `ServerSpans.start` to its `end`
_REQUEST_SPAN: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("otel_server_span", default=None)


class _RootSampling:
    """The sampler's decision for a root span, taken before the SDK is asked to make one.

    The SDK's `start_span` for a span the sampler leaves out draws ids, asks the sampler, builds the
    sampling result, trace flags and span context, and returns a non-recording span: most of what an
    unsampled request costs. For a root span (no caller's `traceparent`, no current span) the decision
    of the standard samplers depends on the trace id alone: `traceidratio` (alone or as the root of
    `parentbased_*`) keeps an id whose low 64 bits fall under its bound, `always_on` / `always_off`
    keep all or none. Here the trace id is drawn first; a dropped request gets the non-recording span
    the SDK would have made (same trace id, a span id, the trace flags without `sampled`, so the trace
    context still propagates: an outbox row of that request carries it, and its task is left out too);
    a kept one is made by the SDK, which draws the same trace id (`_DrawnTraceIds`) and takes the same
    decision. Any other sampler: no fast path, the SDK decides as before."""

    def __init__(self, tracer) -> None:
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        self.fast = False
        sampler = getattr(tracer, "sampler", None)
        ids = getattr(tracer, "id_generator", None)
        if sampler is None or ids is None:
            return
        if isinstance(ids, _DrawnTraceIds):  # the tracer is the provider's, shared by every app of the process
            ids = ids._ids
        root = sampler._root if isinstance(sampler, ParentBased) else sampler
        if isinstance(root, TraceIdRatioBased):
            self._bound, self._mask = root.bound, TraceIdRatioBased.TRACE_ID_LIMIT
        elif root is ALWAYS_ON:
            self._bound, self._mask = 1 << 64, 0
        elif root is ALWAYS_OFF:
            self._bound, self._mask = 0, 0
        else:
            return
        self._ids = ids
        self._drawn = _DrawnTraceIds(ids)
        tracer.id_generator = self._drawn  # this tracer's only: the server spans'
        flags = TraceFlags.DEFAULT | (TraceFlags.RANDOM_TRACE_ID if ids.is_trace_id_random() else 0)
        self._flags = TraceFlags(flags)
        self._span, self._span_context = NonRecordingSpan, SpanContext
        self.fast = True

    def dropped(self):
        """A non-recording root span when the sampler leaves the new trace out; None when it keeps it
        (the trace id is then the next one the SDK draws in this thread)."""
        trace_id = self._ids.generate_trace_id()
        if trace_id & self._mask < self._bound:
            self._drawn.local.trace_id = trace_id
            return None
        return self._span(self._span_context(trace_id, self._ids.generate_span_id(), False, self._flags))


class _DrawnTraceIds:
    """The id generator of the server spans' tracer: the trace id `_RootSampling` drew for its decision
    when it set one in this thread (once), otherwise a new one."""

    def __init__(self, ids) -> None:
        self._ids = ids
        self.local = threading.local()

    def generate_trace_id(self) -> int:
        drawn = getattr(self.local, "trace_id", None)
        if drawn is None:
            return self._ids.generate_trace_id()
        self.local.trace_id = None
        return drawn

    def generate_span_id(self) -> int:
        return self._ids.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self._ids.is_trace_id_random()


def _plain_attributes(span, attributes: dict) -> None:
    """Add `attributes` (non-empty string keys; str, int, float or bool values) to a recording SDK span.

    The SDK's `set_attributes` checks and copies every value (sequences become tuples, strings are cut to
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT) under two locks: about a fifth of what a kept request's spans cost.
    The values given here need neither, so when no length limit is set and the attribute count limit
    leaves room (the SDK's checks would change nothing), they are stored as they are; any other case,
    or an SDK whose span keeps its attributes differently, goes through `set_attributes`. Only for spans
    this module makes or the SQL spans (`_lean_cursor_tracer`), before they end and before another thread
    can see them."""
    bounded = getattr(span, "_attributes", None)
    stored = getattr(bounded, "_dict", None)
    if (type(bounded) is _BoundedAttributes and type(stored) is dict and bounded.max_value_len is None
            and not bounded._immutable and (bounded.maxlen is None or len(stored) + len(attributes) <= bounded.maxlen)
            and getattr(span, "_end_time", True) is None):
        stored.update(attributes)
    else:
        span.set_attributes(attributes)


_BoundedAttributes = None  # opentelemetry.attributes.BoundedAttributes, set by `configure`


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
    child of the current span (the request's, or the task's that chains another); under a span the sampler
    left out, that span's own context (not sampled). None when tracing is off."""
    if not ENABLED:
        return None
    from opentelemetry import propagate, trace

    parent = trace.get_current_span().get_span_context()
    if parent.is_valid and not parent.trace_flags.sampled:
        # a request or task the sampler left out: its own context, unsampled, is what the row carries (the
        # outbox span would be dropped; its task is left out as well)
        own: dict[str, str] = {}
        propagate.inject(own)
        return own or None
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


@contextlib.contextmanager
def command_span(name: str) -> Iterator[None]:
    """Run the block (a CLI command: app.cli) under a new root span `name` when tracing is on here; its
    SQL, Redis and Celery publish spans are its descendants, and a task it sends continues its trace."""
    if not ENABLED:
        yield
        return
    from opentelemetry import context, trace

    tracer = trace.get_tracer(__name__, tracer_provider=_provider)
    span = tracer.start_span(name, context=context.Context(), kind=trace.SpanKind.INTERNAL,
                             attributes={"process.pid": os.getpid()})
    token = context.attach(trace.set_span_in_context(span, context.Context()))
    code = 0
    try:
        yield
    except SystemExit as exc:  # click's exit codes: 0 is success
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except BaseException as exc:
        code = getattr(exc, "exit_code", 1)  # click's Exit (its code), ClickException (1), UsageError (2)
        if code and span.is_recording():
            span.record_exception(exc)
        raise
    finally:
        context.detach(token)
        if span.is_recording():
            span.set_attribute("process.exit.code", code)
            if code:
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"exit code {code}"))
        span.end()


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
