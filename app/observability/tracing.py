"""OpenTelemetry traces: off unless OTEL_TRACES_EXPORTER names an exporter.

Configured by the standard variables only, read by the OpenTelemetry SDK itself: OTEL_TRACES_EXPORTER
(`otlp`, `console`, or both comma-separated; unset or `none`: tracing off), OTEL_SERVICE_NAME /
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, OTEL_EXPORTER_OTLP_* (the
OTLP/HTTP exporter with protobuf: `http/protobuf`), OTEL_BSP_* (the batch span processor),
OTEL_PROPAGATORS, OTEL_PYTHON_FLASK_EXCLUDED_URLS / OTEL_PYTHON_EXCLUDED_URLS. Beneath the environment
they are also read from the settings file ENV_FILE (app.config), like every other setting.

Each process sets tracing up once, after it was forked (a batch span processor's thread does not
survive a fork): gunicorn's `post_fork` hook (docker/gunicorn.conf.py) in each API process, Celery's
`worker_process_init` in each pool process (workers/__init__.py); a prefork worker's main process traces
its Celery publishes only (`publisher_only`: the outbox dispatcher's sends), and a `flask` command that
changes state sets it up itself and runs under a root span (`command_span`, app.cli). `configure` installs the tracer
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
import functools
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

# SQL a statement span records in place of the text sent: app.db runs a repeated read as its SQL with the
# values written in (a plan kept per connection); its span records the statement with placeholders, as
# every other read's span does, so that no value reaches a trace. Filled and cleared by app.db.
STATEMENT_SOURCES: dict[str, str] = {}

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
    import sys

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    module = sys.modules[OTLPSpanExporter.__module__]
    if callable(getattr(module, "encode_spans", None)) and getattr(module.encode_spans, "__module__", "") != __name__:
        lean = _checked_lean_encoder(module.encode_spans)
        if lean is not None:
            module.encode_spans = lean  # what its `export` calls: the same request for less work
    exporter = OTLPSpanExporter()  # endpoint, headers, timeout, compression, certificates: OTEL_EXPORTER_OTLP_*
    if not _otlp_exporters and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_export_connections)
    _otlp_exporters.append(exporter)
    return exporter


_otlp_exporters: list = []  # the OTLP exporters this process made (a forked child inherits them)


def _checked_lean_encoder(sdk_encode):
    """`_lean_encoder()` when it encodes a probe span (parent, attributes, event, link, error status) to
    the same bytes as the SDK's `sdk_encode`; None (the SDK's encoder stays) when it does not or fails,
    e.g. after an SDK upgrade that moved what it reads."""
    try:
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util import BoundedList
        from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

        lean = _lean_encoder()
        parent = SpanContext(1, 3, True, TraceFlags(1))
        probe = [ReadableSpan(
            name="probe", context=SpanContext(1, 2, False, TraceFlags(1)), parent=parent,
            resource=Resource.create({"service.name": "probe"}), kind=SpanKind.SERVER,
            attributes=BoundedAttributes(8, {"s": "v", "n": 1, "f": 0.5, "b": True, "t": ("x",)}, immutable=False),
            events=BoundedList.from_seq(8, [Event("e", {"k": "v"}, timestamp=5)]),
            links=BoundedList.from_seq(8, [Link(parent, {"l": 1})]),
            status=Status(StatusCode.ERROR, "bad"), start_time=1, end_time=9)]
        if lean(probe).SerializeToString() == sdk_encode(probe).SerializeToString():
            return lean
        log.warning("tracing: the OTLP encoder of this SDK differs from the lean one; the SDK's is used")
    except Exception:
        log.warning("tracing: the lean OTLP encoder does not fit this SDK; the SDK's is used", exc_info=True)
    return None


def _lean_encoder():
    """`encode_spans` of the OTLP exporter: the same protobuf request, byte for byte, for about half the
    work (installed in the exporter's module by `_exporter`). Encoding the spans of a kept request cost
    more than making them. Here:

    - spans are grouped by resource and by instrumentation scope as the SDK's encoder groups them (by
      equality), with one hash per distinct resource or scope object of the batch instead of one per
      span (a Resource hashes by serialising its attributes to JSON), each encoded once per batch;
    - the fields of a span the SDK made (`ReadableSpan`, what a span processor receives) are read
      directly, not through properties that copy its attributes, events and links;
    - a field left at its default (no parent, empty trace state, no events, no links, nothing dropped)
      is not passed at all (proto3 does not serialise defaults: the same bytes);
    - an attribute whose value is a str, bool, int or float is encoded without the type walk, and the
      encoded pairs are kept (up to 4 096, forgotten all at once when full) for the next spans: most
      attributes repeat from span to span (method, route, scheme, host, database system, name, user,
      server address and port, statement); so does an unset status.

    Anything else (sequences, mappings, bytes, None; a span of another class) goes through the SDK's
    own functions. A test compares its serialised output with the SDK encoder's."""
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.exporter.otlp.proto.common._internal import (
        _encode_instrumentation_scope,
        _encode_key_value,
    )
    from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder as sdk
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, SpanFlags
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util import BoundedList

    kinds = sdk._SPAN_KIND_MAP
    encode_events, encode_links, encode_status = sdk._encode_events, sdk._encode_links, sdk._encode_status
    encode_trace_state = sdk._encode_trace_state
    local_flags = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
    remote_flags = local_flags | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
    encoded: dict = {}
    statuses: dict = {}
    limit = 4096
    plain = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}

    def attributes_of(attributes) -> list:
        if not attributes:
            return []
        out = []
        items = attributes._dict.items() if type(attributes) is BoundedAttributes else attributes.items()
        for key, value in items:
            kind = plain.get(type(value))
            if kind is None or type(key) is not str:
                try:
                    out.append(_encode_key_value(key, value))
                except Exception:  # as the SDK's encoder: the attribute is left out, the span is sent
                    log.exception("tracing: could not encode attribute %s", key)
                continue
            entry = (key, kind, value)
            found = encoded.get(entry)
            if found is None:
                if len(encoded) >= limit:
                    encoded.clear()
                try:
                    found = encoded[entry] = KeyValue(key=key, value=AnyValue(**{kind: value}))
                except Exception:  # an int beyond 64 bits: left out, as the SDK's encoder does
                    log.exception("tracing: could not encode attribute %s", key)
                    continue
            out.append(found)
        return out

    def status_of(status):
        if status is None:
            return None
        if status.description is not None:
            return encode_status(status)
        found = statuses.get(status.status_code)
        if found is None:
            found = statuses[status.status_code] = encode_status(status)
        return found

    def one_span(span) -> PbSpan:
        if type(span) is ReadableSpan:
            context, parent, attributes = span._context, span._parent, span._attributes
            events, links = span._events, span._links
            fields = {"name": span._name, "kind": kinds[span._kind], "start_time_unix_nano": span._start_time,
                      "end_time_unix_nano": span._end_time, "status": status_of(span._status)}
            dropped = (attributes.dropped if type(attributes) is BoundedAttributes else 0,
                       events.dropped if type(events) is BoundedList else 0,
                       links.dropped if type(links) is BoundedList else 0)
        else:
            context, parent, attributes = span.get_span_context(), span.parent, span.attributes
            events, links = span.events, span.links
            fields = {"name": span.name, "kind": kinds[span.kind], "start_time_unix_nano": span.start_time,
                      "end_time_unix_nano": span.end_time, "status": encode_status(span.status)}
            dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)
        fields["trace_id"] = context.trace_id.to_bytes(16, "big")
        fields["span_id"] = context.span_id.to_bytes(8, "big")
        if context.trace_state:
            fields["trace_state"] = encode_trace_state(context.trace_state)
        if parent:
            fields["parent_span_id"] = parent.span_id.to_bytes(8, "big")
            fields["flags"] = remote_flags if parent.is_remote else local_flags
        else:
            fields["flags"] = local_flags
        if attributes:
            fields["attributes"] = attributes_of(attributes)
        if events:
            fields["events"] = encode_events(tuple(events))
        if links:
            fields["links"] = encode_links(tuple(links))
        if dropped[0]:
            fields["dropped_attributes_count"] = dropped[0]
        if dropped[1]:
            fields["dropped_events_count"] = dropped[1]
        if dropped[2]:
            fields["dropped_links_count"] = dropped[2]
        return PbSpan(**fields)

    def encode_spans(sdk_spans):
        groups: dict = {}  # Resource -> {scope -> [span]}, equal keys merged as the SDK's encoder does
        seen: dict = {}  # (id(resource), id(scope)) -> the list its spans go to: one hash per distinct object
        for span in sdk_spans:
            if type(span) is ReadableSpan:
                resource, scope = span._resource, span._instrumentation_scope
            else:
                resource, scope = span.resource, span.instrumentation_scope
            scope = scope or None
            found = seen.get((id(resource), id(scope)))
            if found is None:
                found = seen[(id(resource), id(scope))] = groups.setdefault(resource, {}).setdefault(scope, [])
            found.append(one_span(span))
        return ExportTraceServiceRequest(resource_spans=[
            ResourceSpans(resource=Resource(attributes=attributes_of(resource.attributes)),
                          scope_spans=[ScopeSpans(scope=_encode_instrumentation_scope(scope), spans=spans,
                                                  schema_url=scope.schema_url if scope else None)
                                       for scope, spans in scopes.items()],
                          schema_url=resource.schema_url)
            for resource, scopes in groups.items()])

    return encode_spans

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


def _context_var():
    """The ContextVar that holds OpenTelemetry's current context when the runtime context is the SDK's
    default (contextvars): reading it, setting it and resetting it directly is what `get_current`,
    `attach` and `detach` do, without their two Python calls each. None for any other runtime context
    (then the API's functions are used)."""
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    if type(runtime) is ContextVarsRuntimeContext:
        return runtime._current_context
    return None


class _SpanStarter:
    """The SDK's `Tracer.start_span`, for the two cases where the sampler's answer is known before it is
    asked, without asking it: a child of a sampled span under a parent-based sampler that keeps such
    children (`always_on` for sampled parents, the default of every `parentbased_*`), and a root span
    whose trace id `_RootSampling` already found kept. The span is the SDK's own (`_Span`), made with
    the same arguments `start_span` gives it (trace flags, trace state, parent, resource, scope, limits,
    span processor, the tracer's span metrics) and started the same way; what is skipped is the
    lookup of the parent in the context, the sampler's calls and its result objects.

    `make(tracer)` returns None when the tracer or its sampler is not what this reproduces; a sampler
    swapped later (tests) sends every span back through `start_span`."""

    @classmethod
    def make(cls, tracer):
        from opentelemetry.sdk.trace import Tracer, _Span
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased

        sampler = getattr(tracer, "sampler", None)
        needed = ("id_generator", "resource", "span_processor", "instrumentation_info", "_span_limits",
                  "_instrumentation_scope", "_tracer_metrics", "_tracer_config")
        if (type(tracer) is not Tracer or not isinstance(sampler, ParentBased)
                or sampler._local_parent_sampled is not ALWAYS_ON or sampler._remote_parent_sampled is not ALWAYS_ON
                or not all(hasattr(tracer, name) for name in needed)):
            return None
        return cls(tracer, sampler, _Span, Decision.RECORD_AND_SAMPLE)

    def __init__(self, tracer, sampler, span_class, decision) -> None:
        from opentelemetry.trace import SpanContext, TraceFlags

        self._tracer, self._sampler, self._span_class, self._decision = tracer, sampler, span_class, decision
        self._context = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._sampled_random = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)

    def _start(self, name, kind, context, trace_id, parent, flags, trace_state):
        tracer = self._tracer
        span = self._span_class(
            name=name,
            context=self._context(trace_id, tracer.id_generator.generate_span_id(), False, flags, trace_state),
            parent=parent, sampler=self._sampler, resource=tracer.resource, attributes=None,
            span_processor=tracer.span_processor, kind=kind, links=(),
            instrumentation_info=tracer.instrumentation_info, record_exception=True, set_status_on_exception=True,
            limits=tracer._span_limits, instrumentation_scope=tracer._instrumentation_scope,
            record_end_metrics=tracer._tracer_metrics.start_span(parent, self._decision))
        span.start(start_time=None, parent_context=context)
        return span

    def child(self, name, kind, context, parent):
        """A span under `parent` (the valid, sampled span context of the current span in `context`)."""
        tracer = self._tracer
        if tracer.sampler is not self._sampler or not tracer._tracer_config.is_enabled:
            return tracer.start_span(name, context=context, kind=kind)
        flags = self._sampled_random if parent.trace_flags.random_trace_id else self._sampled
        return self._start(name, kind, context, parent.trace_id, parent, flags, parent.trace_state)

    def root(self, name, kind, trace_id, random_id: bool):
        """A root span of the kept trace `trace_id` (drawn by the tracer's id generator)."""
        tracer = self._tracer
        if tracer.sampler is not self._sampler or not tracer._tracer_config.is_enabled:
            return None
        return self._start(name, kind, None, trace_id, None, self._sampled_random if random_id else self._sampled,
                           None)


_LeanCursorTracer = None


def _lean_sql_spans() -> None:
    """The psycopg instrumentation, with a cheaper per-statement path (`_LeanCursorTracer`): installed in
    its module before it instruments, so every cursor class it makes uses it."""
    global _LeanCursorTracer
    from opentelemetry.instrumentation import psycopg as instrumented

    if _LeanCursorTracer is None:
        _LeanCursorTracer = _lean_cursor_tracer(instrumented.CursorTracer)
    instrumented.CursorTracer = _LeanCursorTracer
    factory = getattr(instrumented, "_new_cursor_factory", None)
    if callable(factory) and not getattr(factory, "_lean", False):
        instrumented._new_cursor_factory = _suppressed_statements_untouched(factory)


def _suppressed_statements_untouched(factory):
    """The instrumentation's cursor class factory (one class per connection), whose `execute` runs a
    statement with instrumentation suppressed (a request the sampler left out) straight on the base
    cursor's `execute`: what the traced path does for it (`_lean_cursor_tracer`), without the layer of
    the tracer's call, the `super()` object and its bound method."""
    from opentelemetry import context
    from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY_PLAIN

    var = _context_var()
    suppress, suppress_plain = context._SUPPRESS_INSTRUMENTATION_KEY, _SUPPRESS_INSTRUMENTATION_KEY_PLAIN

    @functools.wraps(factory)
    def lean_factory(*args, **kwargs):
        cls = factory(*args, **kwargs)
        traced = cls.__dict__.get("execute")
        if var is None or traced is None or len(cls.__mro__) < 2:
            return cls
        base_execute = cls.__mro__[1].execute
        get_current = var.get

        def execute(self, *args, **kwargs):
            current = get_current()
            if current.get(suppress) or current.get(suppress_plain):
                return base_execute(self, *args, **kwargs)
            return traced(self, *args, **kwargs)

        cls.execute = execute
        return cls

    lean_factory._lean = True
    return lean_factory


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
    var = _context_var()
    if var is not None:  # the same, without two Python calls each
        get_current, attach, detach = var.get, var.set, var.reset
    client, sdk_span = SpanKind.CLIENT, trace.Span

    class LeanCursorTracer(base):
        _plain = None  # the per-connection settings, decided at the first statement (see _decide)
        _starter = None  # its _SpanStarter, when the tracer allows one

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
            self._starter = _SpanStarter.make(tracer) if lean else None
            self._plain = (lean, tracer, constant, tuple(probe), connection)
            return self._plain

        def get_statement(self, cursor, args):
            statement = super().get_statement(cursor, args)
            return STATEMENT_SOURCES.get(statement, statement)

        def traced_execution(self, cursor, query_method, *args, **kwargs):
            current = get_current()
            if current.get(suppress) or current.get(suppress_plain):
                return query_method(*args, **kwargs)
            lean, tracer, constant, statement_keys, connection = self._plain or self._decide()
            if not lean:
                return super().traced_execution(cursor, query_method, *args, **kwargs)
            parent = current.get(_SPAN_KEY)
            found = None
            if parent is not None:
                found = parent.get_span_context()
                if not found.is_valid:
                    found = None
                elif not found.trace_flags.sampled:  # the sampler drops it: no span
                    return query_method(*args, **kwargs)
            name = self.get_operation_name(cursor, args) or (
                self._db_api_integration.database or self._db_api_integration.name)
            attributes = dict(constant)
            statement = self.get_statement(cursor, args)
            for key in statement_keys:
                attributes[key] = statement
            attributes.update(connection)
            starter = self._starter
            if found is not None and starter is not None:  # a sampled parent: kept, without the sampler
                span = starter.child(name, client, current, found)
            else:
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
        var = _context_var()
        if var is not None:  # the same, without two Python calls each
            self._get_current, self._attach, self._detach = var.get, var.set, var.reset
        self._span_key = trace.propagation._SPAN_KEY
        try:  # Flask's own context variable of the request context (what `request` looks up)
            from flask.globals import _cv_request

            self._request_context = functools.partial(_cv_request.get, None)
        except ImportError:
            self._request_context = lambda: None
        self._root = _RootSampling(self.tracer)
        self._starter = _SpanStarter.make(self.tracer) if self._root.fast else None
        app.before_request(self.start)
        # the response's status is read for a recording span only: `respond` is registered per request
        # (after_this_request) by `start`, so a request the sampler leaves out runs two hooks, not three
        from flask import after_this_request

        self._after_this_request = after_this_request
        app.teardown_request(self.end)

    def start(self) -> None:
        found = self._request_context()  # the request, read from Flask's context variable: every request
        req = found.request if found is not None else request._get_current_object()
        if self.excluded is not None and self.excluded.url_disabled(req.url):
            return
        environ = req.environ
        parent = None  # the current context: a request thread's is empty
        for name in self._carried:
            if name in environ:
                parent = self._extract(req.headers)
                break
        kept = None  # the trace id of a root span the sampler keeps (drawn by `_RootSampling`)
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
                # kept: the span is made below, with the trace id drawn for the decision
                kept = self._starter is not None
        rule = req.url_rule
        route = rule.rule if rule is not None else None
        method = req.method
        name = f"{method} {route}" if route else method
        span = None
        if kept:
            root = self._root
            span = self._starter.root(name, self._server, root._drawn.generate_trace_id(), root.random_ids)
        if span is None:
            span = self.tracer.start_span(name, context=parent, kind=self._server)
        current = self._in_context(span, parent)
        recording = span.is_recording()
        if recording:
            attributes = {"http.request.method": method, "url.path": req.path, "url.scheme": req.scheme,
                          "server.address": req.host, "client.address": environ.get("REMOTE_ADDR", ""),
                          "user_agent.original": environ.get("HTTP_USER_AGENT", "")}
            if route:
                attributes["http.route"] = route
            _plain_attributes(span, attributes)
            self._after_this_request(self.respond)
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
        try:
            self._detach(token)
        except ValueError:  # a token of another context (as OpenTelemetry's `detach`: logged, not raised)
            log.exception("tracing: could not restore the context of the request")


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
        self.random_ids = ids.is_trace_id_random()
        flags = TraceFlags.DEFAULT | (TraceFlags.RANDOM_TRACE_ID if self.random_ids else 0)
        self._flags = TraceFlags(flags)
        self._span, self._span_context = NonRecordingSpan, SpanContext
        # the SDK's default id generator draws `random.getrandbits` (128 bits, 64 bits; never 0): drawn
        # here directly, and the span context built as SpanContext.__new__ builds it (a tuple of six)
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace.span import DEFAULT_TRACE_STATE

        self._bits = None
        probe = SpanContext(1, 1, False, self._flags)
        if (type(ids) is RandomIdGenerator and len(probe) == 6
                and vars(NonRecordingSpan(probe)) == {"_context": probe}):
            self._new = object.__new__
            import random

            self._bits, self._state = random.getrandbits, DEFAULT_TRACE_STATE
        self.fast = True

    def dropped(self):
        """A non-recording root span when the sampler leaves the new trace out; None when it keeps it
        (the trace id is then the next one the SDK draws in this thread)."""
        bits = self._bits
        if bits is None:
            trace_id = self._ids.generate_trace_id()
        else:
            trace_id = bits(128) or self._ids.generate_trace_id()
        if trace_id & self._mask < self._bound:
            self._drawn.local.trace_id = trace_id
            return None
        if bits is None:
            return self._span(self._span_context(trace_id, self._ids.generate_span_id(), False, self._flags))
        span_id = bits(64) or self._ids.generate_span_id()  # both ids valid: is_valid is True
        span = self._new(self._span)  # NonRecordingSpan.__init__ sets its context, nothing else
        span._context = tuple.__new__(self._span_context, (trace_id, span_id, False, self._flags, self._state, True))
        return span


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
    that does not trace (tracing off there, on in the worker) still continues the trace.
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
