"""No accepted job is lost or stuck (issue 12): the transactional outbox across a Redis outage, and
the lease on running jobs when a worker is killed with kill -9.

Each test runs its own Redis (a private `redis-server` on a free port) or its own key prefix, and its
own worker process, so stopping Redis or killing a worker never touches the shared test services."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import uuid

import pytest
import redis as redis_lib

from tests.conftest import TEST_VAR_DIR, dies_with_parent, start_worker, stop_worker, wait_for
from tests.fake_embeddings_server import FakeEmbeddingsServer
from tests.functional.entities_support import BASE, create_definition
from tests.functional.test_reliability import _free_port

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
ASYNC = {"Prefer": "respond-async"}


class PrivateRedis:
    """A redis-server of this test only (append-only file, as a production Redis keeps its queues)."""

    def __init__(self) -> None:
        if not shutil.which("redis-server"):
            pytest.skip("redis-server is not installed")
        self.port, self.dir = _free_port(), tempfile.mkdtemp(prefix="redis-", dir=TEST_VAR_DIR)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "yes", "--appendfsync", "always"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=dies_with_parent)
        client = redis_lib.Redis.from_url(self.url, socket_connect_timeout=0.5)
        wait_for(lambda: _pings(client), timeout=20, interval=0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # redis writes its AOF and exits
            self.proc.wait(20)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis_lib.RedisError:
        return False


@pytest.fixture()
def private_redis():
    server = PrivateRedis()
    server.start()
    yield server
    server.close()


def _job_status(client, headers, job_id) -> str:
    resp = client.get(f"/api/v1/jobs/{job_id}", headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["status"]


def _bulk_async(client, headers, entity, start: int, count: int = 3) -> str:
    resp = client.post(f"{BASE}/{entity}/records/bulk/create", headers={**headers, **ASYNC}, json={
        "records": [{"name": f"r{start + i}", "fields": {"body": f"bulk record {start + i}", "n": start + i}}
                    for i in range(count)]})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["jobId"]


def _outbox_count(app, job_ids=None) -> int:
    """Outbox rows (all, or those of bulk jobs with these ids)."""
    from sqlalchemy import func, select

    from app.db import db
    from app.platform_models import OutboxMessage

    with app.app_context(), db.engine.connect() as conn:
        query = select(func.count()).select_from(OutboxMessage)
        if job_ids is not None:
            query = query.where(OutboxMessage.task_name == "bulk.entity_records",
                                OutboxMessage.args.op("->>")(0).in_(job_ids))
        return conn.scalar(query)


def _embedded_ids(app, org_id) -> set[str]:
    from sqlalchemy import select

    from app.db import db
    from app.embeddings.models import EntityEmbedding

    with app.app_context(), db.product_session("default") as session:
        return set(session.scalars(select(EntityEmbedding.record_id).where(EntityEmbedding.org_id == org_id)))


def _worker_idle() -> bool:
    """Every worker on the current broker answers and has no task running or reserved."""
    from app.extensions import celery_app

    inspect = celery_app.control.inspect(timeout=1.0)
    active, reserved = inspect.active() or {}, inspect.reserved() or {}
    return bool(active) and not any(active.values()) and not any(reserved.values())


def _records(client, headers, entity) -> list[dict]:
    resp = client.post(f"{BASE}/{entity}/records/query", json={"query": {"pageSize": 500}}, headers=headers)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["records"]


def test_jobs_accepted_while_redis_is_down_all_run_when_it_returns(make_app, database_url, private_redis, auth,
                                                                     org_id):
    prefix = f"test-outbox-{uuid.uuid4().hex[:8]}:"
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        settings = {"EMBEDDINGS_BACKEND": "openai", "EMBEDDINGS_ENDPOINT": fake.base_url,
                    "EMBEDDINGS_API_KEY": fake.api_key, "EMBEDDINGS_MODEL": "text-embedding-3-small"}
        app = make_app(REDIS_URL=private_redis.url, CELERY_KEY_PREFIX=prefix, **settings)
        client, headers = app.test_client(), auth()
        worker = start_worker(database_url, private_redis.url, prefix=prefix, queues="bulk,embeddings,default",
                              log_name="worker-outbox.log",
                              extra_env={**settings, "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1",
                                         "OUTBOX_DISPATCH_AFTER_SECONDS": "1"})
        try:
            create_definition(client, headers, "notes", SCHEMA, embeddingsConfig={"enabled": True, "fields": ["body"]})
            # while Redis is up, jobs run as they always did and leave nothing in the outbox
            before = [_bulk_async(client, headers, "notes", 0)]
            wait_for(lambda: all(_job_status(client, headers, j) == "succeeded" for j in before), timeout=60)
            # ... and their embedding tasks: nothing is in flight when Redis stops (a worker that loses
            # Redis with a task unacknowledged exits in kombu's restore path; its supervisor restarts it)
            first = {r["id"] for r in _records(client, headers, "notes")}
            wait_for(lambda: _embedded_ids(app, org_id) >= first, timeout=60)
            # vectors stored is not task done (it then drops its lease row and is acknowledged): wait
            # until the worker holds nothing
            wait_for(_worker_idle, timeout=60)

            private_redis.stop()
            during = []
            for round_ in range(4):  # every request still answers: 202 for jobs, 201 for records
                during.append(_bulk_async(client, headers, "notes", 100 * (round_ + 1)))
                resp = client.post(f"{BASE}/notes/records", headers=headers,
                                   json={"name": f"single{round_}", "fields": {"body": f"single {round_}", "n": 1}})
                assert resp.status_code == 201, resp.get_json()
            assert all(_job_status(client, headers, j) == "pending" for j in during)
            assert _outbox_count(app, during) == len(during)  # the jobs wait in the outbox ...
            assert _outbox_count(app) >= 2 * len(during)      # ... with the embedding tasks of the records

            private_redis.start()
            wait_for(lambda: all(_job_status(client, headers, j) == "succeeded" for j in before + during),
                     timeout=90)
            records = _records(client, headers, "notes")
            assert len(records) == 3 * (1 + len(during)) + len(during)
            wanted = {r["id"] for r in records}
            wait_for(lambda: _embedded_ids(app, org_id) >= wanted, timeout=90)
            assert _outbox_count(app, during) == 0
        finally:
            stop_worker(worker)


def test_job_of_a_killed_worker_is_rerun_exactly_once(make_app, database_url, redis_url, auth):
    """kill -9 of the worker's whole process group mid-job: the job's lease (the row lock its worker
    holds) ends with the worker's connection, and the next worker's reaper re-runs the job once."""
    from sqlalchemy import create_engine, text

    prefix = f"test-lease-{uuid.uuid4().hex[:8]}:"
    app = make_app(CELERY_KEY_PREFIX=prefix)
    client, headers = app.test_client(), auth()
    lease = {"OUTBOX_DISPATCH_INTERVAL_SECONDS": "1", "OUTBOX_DISPATCH_AFTER_SECONDS": "1", "JOB_LEASE_SECONDS": "2"}
    create_definition(client, headers, "counters", SCHEMA)
    record = client.post(f"{BASE}/counters/records", headers=headers, json={"fields": {"body": "x", "n": 1}}).get_json()
    assert record["version"] == 1

    engine = create_engine(database_url)
    blocker = engine.connect()
    worker = None
    try:
        # hold the record, so the job stops mid-run (job row locked, its UPDATE waiting)
        blocker.execute(text("SELECT id FROM product_default.entity_records WHERE id = :id FOR UPDATE"),
                        {"id": record["id"]})
        me = blocker.execute(text("SELECT pg_backend_pid()")).scalar()
        resp = client.post(f"{BASE}/counters/records/bulk/update", headers={**headers, **ASYNC},
                           json={"records": [{"id": record["id"], "fields": {"n": 2}}]})
        assert resp.status_code == 202, resp.get_json()
        job_id = resp.get_json()["jobId"]
        worker = start_worker(database_url, redis_url, prefix=prefix, queues="bulk", concurrency=1,
                              log_name="worker-lease-1.log", extra_env=lease)
        with engine.connect() as watcher:
            wait_for(lambda: watcher.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE :me = ANY(pg_blocking_pids(pid))"), {"me": me}).scalar(),
                timeout=60)
        assert _job_status(client, headers, job_id) == "running"
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        blocker.rollback()  # the dead worker's transaction ends; it never commits
        assert _job_status(client, headers, job_id) == "running"  # orphaned: nobody will finish it ...

        worker = start_worker(database_url, redis_url, prefix=prefix, queues="bulk", concurrency=1,
                              log_name="worker-lease-2.log", extra_env=lease)
        wait_for(lambda: _job_status(client, headers, job_id) == "succeeded", timeout=90)  # ... until a reaper runs
        got = client.get(f"{BASE}/counters/records/{record['id']}", headers=headers).get_json()
        assert got["fields"]["n"] == 2 and got["version"] == 2  # written exactly once
        job = client.get(f"/api/v1/jobs/{job_id}", headers=headers).get_json()
        assert job["result"]["count"] == 1, job
    finally:
        blocker.close()
        if worker is not None:
            stop_worker(worker)
        engine.dispose()


def test_dispatcher_sends_only_its_own_deployments_rows(make_app, app, auth):
    """Deployments sharing a database (CELERY_KEY_PREFIX) never send each other's outbox rows."""
    from app.tasks import dispatch_outbox

    dead = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=f"other-{uuid.uuid4().hex}:")
    client, headers = dead.test_client(), auth()
    create_definition(client, headers, "notes", SCHEMA)
    job = _bulk_async(client, headers, "notes", 0)
    assert _outbox_count(dead, [job]) == 1
    with app.app_context():  # the session app: another prefix, and a live broker when REDIS_URL is set
        dispatch_outbox(min_age_seconds=0)
    assert _outbox_count(dead, [job]) == 1
    with dead.app_context():  # its own deployment tries, the broker is down: the row stays, attempts counted
        assert dispatch_outbox(min_age_seconds=0) == 0
    assert _outbox_count(dead, [job]) == 1


def test_index_and_embedding_tasks_go_through_the_outbox(make_app, auth):
    """The tasks issue 14's index maintenance and the embedding hooks send are outbox rows of the request's
    transaction too: with the broker down they wait in platform.task_outbox instead of being lost."""
    from sqlalchemy import delete, select

    from app.db import db
    from app.platform_models import OutboxMessage

    prefix = f"other-{uuid.uuid4().hex}:"
    dead = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix)
    client, headers = dead.test_client(), auth()
    definition_id = create_definition(client, headers, "indexed", SCHEMA)
    resp = client.put(f"{BASE}/definitions/indexed", headers=headers,
                      json={"embeddingsConfig": {"enabled": True, "fields": ["body"]}})
    assert resp.status_code == 200, resp.get_json()
    assert client.delete(f"{BASE}/definitions/indexed", headers=headers).status_code in (200, 204)
    with dead.app_context(), db.engine.begin() as conn:
        rows = conn.execute(select(OutboxMessage.task_name, OutboxMessage.args)
                            .where(OutboxMessage.key_prefix == prefix)).all()
        conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
    assert ("bulk.entity_indexes", ["default", definition_id]) in [(r.task_name, r.args) for r in rows]
    assert any(r.task_name == "embeddings.backfill" and definition_id in r.args for r in rows)


def test_async_seed_goes_through_the_outbox(make_app):
    """A 202 from POST /internal/seed (Prefer: respond-async) is an outbox row committed with the request:
    with the broker down the seed.org task waits in platform.task_outbox, under the task id the 202 named."""
    from sqlalchemy import delete, select

    from app.db import db
    from app.platform_models import OutboxMessage

    prefix = f"other-{uuid.uuid4().hex}:"
    dead = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                    INTERNAL_API_TOKEN="internal-" + "t" * 32)
    domain = f"outbox-{uuid.uuid4().hex[:8]}.example"
    body = {"org": {"title": "Outbox Org", "mainDomain": domain, "product": "default"},
            "admin": {"email": f"admin@{domain}", "firstName": "Ada", "lastName": "Admin"}}
    resp = dead.test_client().post("/internal/seed", json=body, headers={
        "X-Internal-Token": "internal-" + "t" * 32, "Prefer": "respond-async"})
    assert resp.status_code == 202, resp.get_json()
    task_id = resp.get_json()["taskId"]
    with dead.app_context(), db.engine.begin() as conn:
        rows = conn.execute(select(OutboxMessage.id, OutboxMessage.task_name, OutboxMessage.kwargs)
                            .where(OutboxMessage.key_prefix == prefix)).all()
        conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
    assert [(r.id, r.task_name, r.kwargs["org"]["mainDomain"]) for r in rows] == [(task_id, "seed.org", domain)]


@contextlib.contextmanager
def _walk(make_app, auth, entity: str, records: int):
    """An app whose broker is down (its tasks stay outbox rows under its own prefix), a fake embeddings
    upstream, and a definition `entity` with `records` records to embed: (app, definition id,
    take_outbox), where take_outbox() removes and returns the app's outbox rows as (task name, args)."""
    from sqlalchemy import delete, select

    from app.db import db
    from app.platform_models import OutboxMessage

    prefix = f"other-{uuid.uuid4().hex}:"
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        dead = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                        EMBEDDINGS_BACKEND="openai", EMBEDDINGS_ENDPOINT=fake.base_url, EMBEDDINGS_API_KEY=fake.api_key,
                        EMBEDDINGS_MODEL="text-embedding-3-small")
        client, headers = dead.test_client(), auth()
        definition_id = create_definition(client, headers, entity, SCHEMA,
                                          embeddingsConfig={"enabled": True, "fields": ["body"]})
        for i in range(records):
            resp = client.post(f"{BASE}/{entity}/records", headers=headers, json={"fields": {"body": f"r {i}", "n": i}})
            assert resp.status_code == 201, resp.get_json()

        def take_outbox():
            with dead.app_context(), db.engine.begin() as conn:
                rows = conn.execute(select(OutboxMessage.task_name, OutboxMessage.args)
                                    .where(OutboxMessage.key_prefix == prefix)).all()
                conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
            return [(r.task_name, r.args) for r in rows]

        yield dead, definition_id, take_outbox


def test_backfill_sends_its_next_step_through_the_outbox(make_app, auth, org_id, monkeypatch):
    """embeddings.backfill re-queues itself for the next RECORDS_PER_TASK records as an outbox row
    (was apply_async: with the broker down between two steps the rest of the walk was lost)."""
    from app.embeddings import pipeline
    from app.embeddings.tasks import backfill

    with _walk(make_app, auth, "walked", 5) as (dead, definition_id, take_outbox):
        take_outbox()  # the records' own embedding tasks: not run, so the walk has all five to do
        monkeypatch.setattr(pipeline, "RECORDS_PER_TASK", 2)
        with dead.app_context():
            first = backfill("default", org_id, definition_id, "", "")
        assert first["embedded"] == 2 and first["next"], first
        (step,) = take_outbox()
        assert step[0] == "embeddings.backfill" and step[1][:3] == ["default", org_id, definition_id]
        assert step[1][4] == first["next"]
        walked = first["embedded"]
        while step:
            with dead.app_context():
                result = backfill(*step[1])
            walked += result["embedded"]
            rows = take_outbox()
            step = rows[0] if rows else None
            assert (step is None) == (result["next"] is None)
        assert walked == 5


def test_backfill_step_whose_outbox_write_fails_is_retried_not_dropped(make_app, auth, org_id, monkeypatch):
    """The database fails as a backfill step writes its next step's outbox row (the step itself has
    committed): the task is retried (the step runs again, skipping current vectors, and writes the row)
    rather than failing with the rest of the walk never queued."""
    from sqlalchemy.exc import OperationalError

    from app.embeddings import jobs, pipeline
    from app.embeddings.tasks import backfill

    with _walk(make_app, auth, "walked2", 3) as (dead, definition_id, take_outbox):
        take_outbox()
        monkeypatch.setattr(pipeline, "RECORDS_PER_TASK", 2)
        real, failures = jobs.next_step, []

        def flaky(session, *args, **kwargs):  # the walk's next step: its lease row and outbox row
            if not failures:
                failures.append(args)
                raise OperationalError("INSERT INTO platform.task_outbox", {}, Exception("connection closed"))
            return real(session, *args, **kwargs)

        monkeypatch.setattr(jobs, "next_step", flaky)
        with dead.app_context():
            result = backfill.apply(args=("default", org_id, definition_id, "", ""))
        assert failures, "the outbox write was never attempted"
        assert result.state == "SUCCESS", (result.state, result.result)
        steps = [args for name, args in take_outbox() if name == "embeddings.backfill"]
        while steps:  # the rest of the walk, as the worker would run it
            with dead.app_context():
                backfill(*steps.pop(0))
            steps += [args for name, args in take_outbox() if name == "embeddings.backfill"]
        with dead.app_context():  # the walk covered every record: a new walk finds nothing to embed
            assert backfill("default", org_id, definition_id, "", "")["embedded"] == 0


def _outbox_rows(app, prefix, task_name) -> int:
    from sqlalchemy import func, select

    from app.db import db
    from app.platform_models import OutboxMessage

    with app.app_context(), db.engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(OutboxMessage).where(
            OutboxMessage.key_prefix == prefix, OutboxMessage.task_name == task_name))


def test_backfill_step_sent_while_redis_is_down_runs_when_it_returns(make_app, database_url, private_redis, auth,
                                                                     org_id):
    """Issue 22: `embeddings.backfill` sends its next step through the outbox, written in the transaction
    that stores the step's progress (the walk's cursor and token). A real worker runs the first step of a
    walk; Redis stops while the step waits on the embeddings upstream, so the step's successor cannot be
    sent when it commits: it waits in platform.task_outbox, and once Redis is back a worker's maintenance
    round sends it and the walk embeds every record. (Sent with apply_async, the rest of the walk was
    lost with the failed send.)"""
    from app.embeddings.pipeline import RECORDS_PER_TASK

    prefix = f"test-walk-{uuid.uuid4().hex[:8]}:"
    count = RECORDS_PER_TASK + 7  # two steps
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        settings = {"EMBEDDINGS_BACKEND": "openai", "EMBEDDINGS_ENDPOINT": fake.base_url,
                    "EMBEDDINGS_API_KEY": fake.api_key, "EMBEDDINGS_MODEL": "text-embedding-3-small"}
        env = {**settings, "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1", "OUTBOX_DISPATCH_AFTER_SECONDS": "1"}
        app = make_app(REDIS_URL=private_redis.url, CELERY_KEY_PREFIX=prefix, **settings)
        client, headers = app.test_client(), auth()
        create_definition(client, headers, "walked", SCHEMA)  # embeddings off: the records are written bare
        resp = client.post(f"{BASE}/walked/records/bulk/create", headers=headers, json={
            "records": [{"name": f"r{i}", "fields": {"body": f"walked {i}", "n": i}} for i in range(count)]})
        assert resp.status_code in (200, 201), resp.get_json()
        worker = start_worker(database_url, private_redis.url, prefix=prefix, queues="embeddings", concurrency=1,
                              log_name="worker-walk-1.log", extra_env=env)
        try:
            fake.hold()
            resp = client.put(f"{BASE}/definitions/walked", headers=headers,
                              json={"embeddingsConfig": {"enabled": True, "fields": ["body"]}})
            assert resp.status_code == 200, resp.get_json()  # the walk is queued (and sent: Redis is up)
            assert fake.arrived.wait(60)  # the worker runs the first step, waiting on the upstream
            private_redis.stop()
            fake.release()
            # the step commits its vectors, and its successor in the same transaction; the send fails
            wait_for(lambda: _outbox_rows(app, prefix, "embeddings.backfill") == 1, timeout=60)
            assert len(_embedded_ids(app, org_id)) == RECORDS_PER_TASK

            private_redis.start()
            if worker.poll() is not None:  # a worker that lost Redis mid-task may exit (docs/operations.md)
                worker = start_worker(database_url, private_redis.url, prefix=prefix, queues="embeddings",
                                      concurrency=1, log_name="worker-walk-2.log", extra_env=env)
            wait_for(lambda: len(_embedded_ids(app, org_id)) == count, timeout=120)
            assert _outbox_rows(app, prefix, "embeddings.backfill") == 0
        finally:
            fake.release()
            stop_worker(worker)
