"""Traces (app.observability.tracing): one trace runs from the HTTP request through the transactional
outbox into the Celery task and its SQL, whichever process sends the task.

The API runs in the test process with the SDK's in-memory exporter; the real worker (`celery -A workers
worker`, another process) is configured by the standard OTEL_* variables alone and exports OTLP/HTTP
(protobuf) to a stand-in collector (tests/otlp_sink.py) with the sampler the cost bench uses
(parentbased_traceidratio at 0.1: a task of a sampled request is sampled). The assertions follow the
real parent chain, span by span, from the task's SQL up to the request's server span."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import start_worker, stop_worker, wait_for
from tests.functional.entities_support import BASE, create_definition
from tests.functional.test_job_durability import PrivateRedis
from tests.otlp_sink import OtlpSink, Span

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
ASYNC = {"Prefer": "respond-async"}
TASK = "bulk.entity_records"


def _otel_env(sink: OtlpSink) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1", "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture()
def traced():
    """Tracing on in this process, spans kept in memory; off again afterwards."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from app.observability import tracing

    exporter = InMemorySpanExporter()
    assert tracing.configure("platform-gateway-test", exporter=exporter)
    yield exporter
    tracing.stop()


def _memory_spans(exporter) -> list[Span]:
    return [Span(trace_id=format(s.context.trace_id, "032x"), span_id=format(s.context.span_id, "016x"),
                 parent_id=format(s.parent.span_id, "016x") if s.parent else None, name=s.name,
                 kind=s.kind.name, service="api", attributes=dict(s.attributes or {}))
            for s in exporter.get_finished_spans()]


def _request_span(exporter, method: str, route_end: str) -> Span:
    found = [s for s in _memory_spans(exporter) if s.kind == "SERVER" and s.name.startswith(method)
             and s.name.endswith(route_end)]
    assert len(found) == 1, [s.name for s in _memory_spans(exporter)]
    return found[0]


def _bulk_async(client, headers, start: int) -> str:
    resp = client.post(f"{BASE}/notes/records/bulk/create", headers={**headers, **ASYNC}, json={
        "records": [{"name": f"r{start + i}", "fields": {"body": f"record {start + i}", "n": i}} for i in range(3)]})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["jobId"]


def _job_succeeded(client, headers, job_id) -> bool:
    resp = client.get(f"/api/v1/jobs/{job_id}", headers=headers)
    return resp.status_code == 200 and resp.get_json()["status"] == "succeeded"


def _ancestry(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """`span`, its parent, the parent's parent, … as far as the spans known go."""
    chain = [span]
    while chain[-1].parent_id and chain[-1].parent_id in by_id:
        chain.append(by_id[chain[-1].parent_id])
    return chain


def _task_run(sink: OtlpSink, trace_id: str) -> Span | None:
    runs = [s for s in sink.snapshot() if s.name == f"run/{TASK}" and s.trace_id == trace_id]
    return runs[0] if runs else None


def _sql_under(span: Span, spans: list[Span]) -> list[Span]:
    by_id = {s.span_id: s for s in spans}
    return [s for s in spans if s.kind == "CLIENT" and s.attributes.get("db.system") == "postgresql"
            and span in _ancestry(s, by_id)[1:]]


def test_a_bulk_jobs_trace_runs_from_the_request_into_the_task(make_app, database_url, redis_url, auth, traced):
    """Redis up: the request sends the task itself right after its commit (the outbox row's context, then
    Celery's publish span); the worker's task run and its SQL are descendants of the request's span."""
    prefix = f"test-trace-{uuid.uuid4().hex[:8]}:"
    app = make_app(CELERY_KEY_PREFIX=prefix)
    client, headers = app.test_client(), auth()
    with OtlpSink() as sink:
        worker = start_worker(database_url, redis_url, prefix=prefix, queues="bulk", log_name="worker-trace.log",
                              extra_env=_otel_env(sink))
        try:
            create_definition(client, headers, "notes", SCHEMA)
            job_id = _bulk_async(client, headers, 0)
            wait_for(lambda: _job_succeeded(client, headers, job_id), timeout=60, what="bulk job done")
            request = _request_span(traced, "POST", "/records/bulk/create")
            run = wait_for(lambda: _task_run(sink, request.trace_id), timeout=30, what="the task's span exported")
            wait_for(lambda: _sql_under(run, sink.snapshot()), timeout=30, what="the task's SQL spans exported")
        finally:
            stop_worker(worker)
        spans = _memory_spans(traced) + sink.snapshot()

    by_id = {s.span_id: s for s in spans}
    chain = _ancestry(run, by_id)
    assert [(s.name, s.kind) for s in chain] == [
        (f"run/{TASK}", "CONSUMER"),               # the worker
        (f"apply_async/{TASK}", "PRODUCER"),       # the request's after-commit send
        (f"outbox {TASK}", "PRODUCER"),            # the outbox row, written in the request's transaction
        (request.name, "SERVER"),                  # the request
    ]
    assert chain[-1] == request and chain[0].service == "platform-gateway-worker"
    assert chain[2].attributes["celery.task_name"] == TASK
    # the task's statements, under the task's run span: request → outbox → task → SQL, one trace
    statements = _sql_under(run, spans)
    assert statements and {s.trace_id for s in statements} == {request.trace_id}
    assert any("entity_records" in str(s.attributes.get("db.statement", "")) for s in statements)
    # the request's own SQL is under its span too
    assert _sql_under(request, spans)


def test_an_outbox_task_sent_later_by_a_worker_keeps_the_requests_trace(make_app, database_url, auth, traced):
    """Redis down when the request commits: the task waits in the outbox with the request's trace
    context; the worker's dispatcher (its main process, which traces its publishes only) sends it once Redis is
    back, and the task's spans still descend from the request's span."""
    from sqlalchemy import select

    from app.db import db
    from app.platform_models import OutboxMessage

    redis = PrivateRedis()
    redis.start()
    try:
        app = make_app(REDIS_URL=redis.url)
        client, headers = app.test_client(), auth()
        create_definition(client, headers, "notes", SCHEMA)
        redis.stop()
        job_id = _bulk_async(client, headers, 0)
        request = _request_span(traced, "POST", "/records/bulk/create")
        with app.app_context(), db.engine.connect() as conn:
            row = conn.execute(select(OutboxMessage.trace_context).where(
                OutboxMessage.task_name == TASK, OutboxMessage.args.op("->>")(0) == job_id)).one()
        version, trace_id, outbox_span_id, flags = row.trace_context["traceparent"].split("-")
        assert (version, trace_id) == ("00", request.trace_id) and int(flags, 16) & 1  # the sampled flag
        outbox = {s.span_id: s for s in _memory_spans(traced)}[outbox_span_id]
        assert outbox.name == f"outbox {TASK}" and outbox.parent_id == request.span_id
        # the request's own attempt to send it failed: its publish span ends, in error, under the outbox span
        publish = [s for s in traced.get_finished_spans() if s.name == f"apply_async/{TASK}"]
        assert len(publish) == 1 and format(publish[0].parent.span_id, "016x") == outbox_span_id
        assert publish[0].status.status_code.name == "ERROR"

        redis.start()
        with OtlpSink() as sink:
            worker = start_worker(database_url, redis.url, prefix=app.config["CELERY_KEY_PREFIX"], queues="bulk",
                                  log_name="worker-trace-outbox.log",
                                  extra_env={**_otel_env(sink), "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1",
                                             "OUTBOX_DISPATCH_AFTER_SECONDS": "1"})
            try:
                wait_for(lambda: _job_succeeded(client, headers, job_id), timeout=60, what="bulk job done")
                run = wait_for(lambda: _task_run(sink, request.trace_id), timeout=30, what="the task's span")
                wait_for(lambda: _sql_under(run, sink.snapshot()), timeout=30, what="the task's SQL spans")
            finally:
                stop_worker(worker)
            spans = _memory_spans(traced) + sink.snapshot()
    finally:
        redis.close()

    by_id = {s.span_id: s for s in spans}
    chain = _ancestry(run, by_id)
    # the dispatcher (the worker's main process, which traces its publishes only) sends it under the outbox
    # row's context: its publish span sits between the outbox span and the task's run
    assert [(s.name, s.kind) for s in chain] == [(f"run/{TASK}", "CONSUMER"), (f"apply_async/{TASK}", "PRODUCER"),
                                                 (f"outbox {TASK}", "PRODUCER"), (request.name, "SERVER")]
    assert chain[1].service == "platform-gateway-worker" and chain[2].span_id == outbox_span_id
    assert chain[-1] == request
    # the main process makes no SQL spans (its maintenance loop's statements are not traced)
    assert not [s for s in spans if s.kind == "CLIENT" and s.parent_id is None and s.service != "api"
                and "task_outbox" in str(s.attributes.get("db.statement", ""))]
    assert _sql_under(run, spans)


def test_a_callers_traceparent_parents_the_request_span_and_excluded_urls_are_not_traced(make_app, auth, traced,
                                                                                          monkeypatch):
    client = make_app().test_client()
    headers = auth()
    trace_id, caller_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    resp = client.get("/api/v1/me", headers={**headers, "traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert resp.status_code == 200
    span = _request_span(traced, "GET", "/me")
    assert (span.trace_id, span.parent_id) == (trace_id, caller_span)  # the caller's trace continues
    traced.clear()
    assert client.get("/api/v1/me", headers=headers).status_code == 200
    span = _request_span(traced, "GET", "/me")
    assert span.parent_id is None and span.trace_id != trace_id  # no traceparent: a trace of its own
    # OTEL_PYTHON_FLASK_EXCLUDED_URLS (regular expressions on the URL) leave those requests untraced
    monkeypatch.setenv("OTEL_PYTHON_FLASK_EXCLUDED_URLS", "/health")
    excluding = make_app().test_client()
    traced.clear()
    assert excluding.get("/health").status_code == 200
    assert excluding.get("/api/v1/me", headers=headers).status_code == 200
    assert [s.name for s in _memory_spans(traced) if s.kind == "SERVER"] == ["GET /api/v1/me"]


@pytest.fixture()
def sample_ratio(traced):
    """sample_ratio(r): this process's provider samples like OTEL_TRACES_SAMPLER=parentbased_traceidratio
    at r (the provider is made once per process, with the sampler of the first test that made it), for
    apps built afterwards; restored at the end."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from app.observability import tracing

    provider = tracing._provider
    saved = provider.sampler, {scope: tracer.sampler for scope, tracer in provider._tracers.items()}

    def choose(ratio: float):
        sampler = ParentBased(TraceIdRatioBased(ratio))
        provider.sampler = sampler
        for tracer in provider._tracers.values():
            tracer.sampler = sampler
        return sampler

    yield choose
    provider.sampler = saved[0]
    for scope, tracer in provider._tracers.items():
        tracer.sampler = saved[1].get(scope, saved[0])


def test_a_request_the_sampler_leaves_out_exports_nothing_and_its_task_is_left_out_too(make_app, auth, traced,
                                                                                        sample_ratio):
    """At 0 %: no span of the request (server, SQL, outbox, Celery publish) is exported, yet its trace
    context still goes into the outbox row it writes, without the sampled flag, so the task's spans are
    left out as well."""
    from sqlalchemy import select

    from app.db import db
    from app.platform_models import OutboxMessage

    sample_ratio(0.0)
    app = make_app(REDIS_URL="redis://127.0.0.1:9/0")  # nothing listens: the row stays in the outbox
    client, headers = app.test_client(), auth()
    create_definition(client, headers, "notes", SCHEMA)
    job_id = _bulk_async(client, headers, 0)
    assert client.get("/api/v1/me", headers=headers).status_code == 200
    assert traced.get_finished_spans() == ()
    with app.app_context(), db.engine.connect() as conn:
        row = conn.execute(select(OutboxMessage.trace_context).where(
            OutboxMessage.task_name == TASK, OutboxMessage.args.op("->>")(0) == job_id)).one()
    version, trace_id, span_id, flags = row.trace_context["traceparent"].split("-")
    assert version == "00" and int(trace_id, 16) and int(span_id, 16)  # a valid context…
    assert not int(flags, 16) & 1  # …that is not sampled


def _a_note_traced_in_full(make_app, auth, sample_ratio):
    """An app traced at 100 % with one `notes` record: (app, client, headers, the record's id)."""
    sample_ratio(1.0)
    app = make_app()
    client, headers = app.test_client(), auth()
    create_definition(client, headers, "notes", SCHEMA)
    resp = client.post(f"{BASE}/notes/records", headers=headers, json={"name": "n", "fields": {"body": "b", "n": 1}})
    assert resp.status_code == 201, resp.get_json()
    return app, client, headers, resp.get_json()["id"]


def test_a_sampled_request_exports_its_span_and_every_sql_span_under_it(make_app, auth, traced, sample_ratio):
    """At 100 % (the root decision taken before the SDK makes the span, with the same trace id): the
    server span and one CLIENT span per SQL statement, children of it, with the database attributes;
    a statement that fails ends its span in error with the exception recorded."""
    app, client, headers, record_id = _a_note_traced_in_full(make_app, auth, sample_ratio)
    traced.clear()
    assert client.get(f"{BASE}/notes/records/{record_id}", headers=headers).status_code == 200
    spans = _memory_spans(traced)
    server = _request_span(traced, "GET", "/records/<string:recordId>")
    sql = [s for s in spans if s.kind == "CLIENT"]
    assert sql and {s.parent_id for s in sql} == {server.span_id} and {s.trace_id for s in sql} == {server.trace_id}
    assert len(spans) == len(sql) + 1
    assert {k: server.attributes.get(k) for k in ("http.request.method", "http.route", "http.response.status_code",
                                                 "url.scheme")} == {
        "http.request.method": "GET", "http.route": "/api/v1/entities/<string:entityName>/records/<string:recordId>",
        "http.response.status_code": 200, "url.scheme": "http"}
    for span in sql:
        assert span.attributes["db.system"] == "postgresql" and span.attributes["db.statement"]
        assert span.name and span.name in span.attributes["db.statement"]

    from opentelemetry import trace
    from sqlalchemy import text
    from sqlalchemy.exc import ProgrammingError

    from app.db import db

    traced.clear()
    tracer = trace.get_tracer("test")
    with app.app_context(), tracer.start_as_current_span("parent"), db.engine.connect() as conn:
        with pytest.raises(ProgrammingError):
            conn.execute(text("SELECT no_such_column FROM no_such_table"))
    failed = [s for s in traced.get_finished_spans() if s.kind.name == "CLIENT"]
    assert len(failed) == 1 and failed[0].status.status_code.name == "ERROR"
    assert [e.name for e in failed[0].events] == ["exception"]


def test_the_root_decision_taken_before_the_sdk_matches_the_samplers():
    """`_RootSampling` draws the trace id and decides as the trace-id-ratio sampler would; a kept trace
    is then made by the SDK with that same id (so its sampler keeps it too)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from app.observability.tracing import _RootSampling

    sampler = TraceIdRatioBased(0.5)
    tracer = TracerProvider(sampler=ParentBased(sampler)).get_tracer("test")
    root = _RootSampling(tracer)
    assert root.fast
    kept = dropped = 0
    for _ in range(300):
        span = root.dropped()
        if span is None:
            drawn = root._drawn.local.trace_id
            made = tracer.start_span("kept")
            context = made.get_span_context()
            assert context.trace_id == drawn and context.trace_flags.sampled and made.is_recording()
            kept += 1
        else:
            context = span.get_span_context()
            assert context.is_valid and not context.trace_flags.sampled and not span.is_recording()
            assert context.trace_id & TraceIdRatioBased.TRACE_ID_LIMIT >= sampler.bound
            dropped += 1
    assert kept and dropped
    assert tracer.start_span("next").get_span_context().trace_id != drawn  # the drawn id is used once


def test_the_outbox_dispatcher_publishes_under_the_rows_context(make_app, redis_url, auth, traced):
    """A task that waited in the outbox (the broker was down when the request committed) is sent later by
    the dispatcher (`run_maintenance`, a worker's main process): its Celery publish span is a child of the
    row's outbox span, and the message's headers carry the publish span's context, which the task's run
    span continues: request → outbox → publish → task, one trace."""
    import json

    import redis as redis_client

    from app.tasks import dispatch_outbox

    prefix = f"test-trace-dispatch-{uuid.uuid4().hex[:8]}:"
    down = make_app(REDIS_URL="redis://127.0.0.1:9/0", CELERY_KEY_PREFIX=prefix)  # nothing listens there
    client, headers = down.test_client(), auth()
    create_definition(client, headers, "notes", SCHEMA)
    job_id = _bulk_async(client, headers, 0)
    request = _request_span(traced, "POST", "/records/bulk/create")
    outbox = [s for s in _memory_spans(traced) if s.name == f"outbox {TASK}" and s.parent_id == request.span_id]
    assert len(outbox) == 1
    traced.clear()

    up = make_app(REDIS_URL=redis_url, CELERY_KEY_PREFIX=prefix)
    broker = redis_client.Redis.from_url(redis_url)
    try:
        with up.app_context():
            assert dispatch_outbox(min_age_seconds=0) >= 1
        published = [s for s in _memory_spans(traced) if s.name == f"apply_async/{TASK}"]
        assert len(published) == 1
        publish = published[0]
        assert (publish.kind, publish.trace_id, publish.parent_id) == ("PRODUCER", request.trace_id,
                                                                       outbox[0].span_id)
        assert publish.attributes["celery.task_name"] == TASK
        messages = [json.loads(raw) for key in broker.keys(f"{prefix}*") if broker.type(key) == b"list"
                    for raw in broker.lrange(key, 0, -1)]
        sent = [m for m in messages if m["headers"].get("id", "").startswith(job_id) or
                m["headers"].get("task") == TASK]
        assert sent, messages
        _version, trace_id, parent_id, flags = sent[0]["headers"]["traceparent"].split("-")
        assert (trace_id, parent_id) == (request.trace_id, publish.span_id) and int(flags, 16) & 1
    finally:
        for key in broker.keys(f"{prefix}*"):
            broker.delete(key)
        broker.close()


def test_a_cli_command_that_changes_state_is_a_trace_of_its_own(make_app, traced):
    """`flask entities sync-indexes` (a maintenance command) runs under a root span named by its command
    path, its SQL under it; a read-only command (`flask products list`) makes no span of its own."""
    app = make_app()
    runner = app.test_cli_runner()
    result = runner.invoke(args=["entities", "sync-indexes", "--org", f"no-such-org-{uuid.uuid4().hex[:6]}"])
    assert result.exit_code == 0, result.output
    spans = _memory_spans(traced)
    roots = [s for s in spans if s.parent_id is None]
    assert [(s.name, s.kind) for s in roots] == [("flask entities sync-indexes", "INTERNAL")]
    command = roots[0]
    assert command.attributes["process.exit.code"] == 0
    sql = _sql_under(command, spans)
    assert sql and {s.trace_id for s in sql} == {command.trace_id}

    traced.clear()
    result = runner.invoke(args=["products", "create", "!!!"])
    assert result.exit_code != 0
    failed = [s for s in traced.get_finished_spans() if s.parent is None]
    assert [s.name for s in failed] == ["flask products create"]
    assert failed[0].status.status_code.name == "ERROR" and failed[0].attributes["process.exit.code"] == 2

    traced.clear()
    assert runner.invoke(args=["products", "list"]).exit_code == 0
    assert not [s for s in traced.get_finished_spans() if s.name.startswith("flask ")]


def test_the_lean_otlp_encoder_sends_what_the_sdks_encoder_sends():
    """`_lean_encoder` (installed in the OTLP exporter) serialises a batch exactly as the SDK's encoder:
    spans of two resources (one of them as two equal objects) and two scopes, every attribute type
    (and one the protobuf cannot hold), events, links, a remote parent, error status, trace state; and
    again with its cache of encoded attributes warm."""
    from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        set_span_in_context,
    )
    from opentelemetry.trace.span import TraceState

    from app.observability.tracing import _lean_encoder

    memory = InMemorySpanExporter()
    for resource in (Resource.create({"service.name": "a", "n": 1}), Resource.create({"service.name": "a", "n": 1}),
                     Resource.create({"service.name": "b"})):
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        for scope in ("one", "two"):
            tracer = provider.get_tracer(scope, "1.0")
            remote = SpanContext(0x1234, 0x5678, True, TraceFlags(1), TraceState([("k", "v")]))
            with tracer.start_as_current_span("root", context=set_span_in_context(NonRecordingSpan(remote)),
                                              kind=SpanKind.SERVER,
                                              attributes={"s": "x", "b": True, "i": 7, "f": 1.5, "big": 2 ** 70,
                                                          "seq": ("a", "b"), "ints": [1, 2], "by": b"\x00"},
                                              links=[Link(remote, {"l": 1})]) as span:
                span.add_event("e", {"x": "y"})
                span.set_status(Status(StatusCode.ERROR, "bad"))
                with tracer.start_as_current_span("child", kind=SpanKind.CLIENT, attributes={"s": "x"}):
                    pass
    spans = memory.get_finished_spans()
    assert len(spans) == 12
    lean = _lean_encoder()
    expected = encode_spans(spans).SerializeToString()
    assert lean(spans).SerializeToString() == expected
    assert lean(spans).SerializeToString() == expected  # the cache warm
    assert lean([]).SerializeToString() == encode_spans([]).SerializeToString()
    # installed only when it agrees with the SDK's encoder on a probe span
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from app.observability.tracing import _checked_lean_encoder

    assert _checked_lean_encoder(encode_spans) is not None
    assert _checked_lean_encoder(lambda spans: ExportTraceServiceRequest()) is None


def test_the_span_starter_makes_the_span_the_sdk_makes():
    """`_SpanStarter` (spans whose sampling decision is known: a child of a sampled span, a kept root)
    makes the SDK's span with what `Tracer.start_span` gives it; it is not used when the sampler is
    not one it reproduces."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.span import TraceState

    from app.observability.tracing import _SpanStarter

    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(1.0)))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "2.0")
    starter = _SpanStarter.make(tracer)
    assert starter is not None

    def fields(span):
        return (span.name, span.kind, span.parent, span.context.trace_id, span.context.trace_flags,
                span.context.trace_state, span.context.is_remote, span.resource, span.instrumentation_scope,
                dict(span.attributes), span.status.status_code, span.is_recording())

    for parent in (SpanContext(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("k", "v")])),
                   SpanContext(0xABC, 0xDEF, False, TraceFlags(3))):
        context = trace.set_span_in_context(NonRecordingSpan(parent))
        made = starter.child("q", SpanKind.CLIENT, context, parent)
        sdk = tracer.start_span("q", context=context, kind=SpanKind.CLIENT)
        assert fields(made) == fields(sdk) and made.context.span_id != sdk.context.span_id
        made.end()
        sdk.end()
    assert len(memory.get_finished_spans()) == 4
    root = starter.root("GET /x", SpanKind.SERVER, 0x1234, True)
    sdk = tracer.start_span("GET /x", kind=SpanKind.SERVER)
    assert fields(root)[:3] == fields(sdk)[:3] and fields(root)[4:] == fields(sdk)[4:]
    assert root.context.trace_id == 0x1234
    assert _SpanStarter.make(TracerProvider(sampler=ALWAYS_ON).get_tracer("x")) is None
    tracer.sampler = ParentBased(TraceIdRatioBased(0.5))  # swapped: back to the SDK's start_span
    assert starter.root("r", SpanKind.SERVER, 1, True) is None


def test_a_repeated_read_run_with_its_values_written_in_records_its_statement_with_placeholders(
        make_app, auth, traced, sample_ratio):
    """A read repeated with the same values runs as its SQL with the values written in (a plan kept per
    connection); its span still records the statement as sent with placeholders: no value of a request
    reaches a trace."""
    from app import db as db_module

    app, client, headers, record_id = _a_note_traced_in_full(make_app, auth, sample_ratio)
    traced.clear()
    for _ in range(db_module.PLAN_AFTER + 2):
        assert client.get(f"{BASE}/notes/records/{record_id}", headers=headers).status_code == 200
    assert any(record_id in literal for literal in db_module._READS.values())  # the read ran with its values in
    statements = [str(s.attributes.get("db.statement", "")) for s in _memory_spans(traced) if s.kind == "CLIENT"]
    assert statements and not any(record_id in statement for statement in statements)
