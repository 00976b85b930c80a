"""Embedding jobs are leased (app.embeddings.jobs): a row per job with a dispatch token carried in the
task id and a lease; the embedding lease reaper sends a job past its lease that no worker holds again
under the same token (the first of the two messages to arrive runs it), and a late or superseded
message does nothing. A 202 (or 201) that queued embedding work is a promise: a worker killed with
kill -9 mid-job no longer waits for Redis' visibility timeout (15 min), nor is a message lost with
Redis' memory lost for good."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid

from sqlalchemy import select, update

from tests.conftest import start_worker, stop_worker, wait_for
from tests.fake_embeddings_server import FakeEmbeddingsServer
from tests.functional.entities_support import BASE, create_definition
from tests.functional.test_reliability import _free_port

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}
ON = {"enabled": True, "fields": ["body"]}


def _settings(fake) -> dict:
    return {"EMBEDDINGS_BACKEND": "openai", "EMBEDDINGS_ENDPOINT": fake.base_url, "EMBEDDINGS_API_KEY": fake.api_key,
            "EMBEDDINGS_MODEL": "text-embedding-3-small"}


@contextlib.contextmanager
def _dead_broker_app(make_app, **overrides):
    """An app whose broker is down: every message stays an outbox row under its own prefix, and the test
    plays the worker. Yields (app, fake upstream, take_outbox)."""
    from sqlalchemy import delete

    from app.db import db
    from app.platform_models import OutboxMessage

    prefix = f"other-{uuid.uuid4().hex}:"
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        app = make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix,
                       **_settings(fake), **overrides)

        def take_outbox():
            """The app's outbox rows as (task id, task name, args), removed (they are "sent")."""
            with app.app_context(), db.engine.begin() as conn:
                rows = conn.execute(select(OutboxMessage.id, OutboxMessage.task_name, OutboxMessage.args,
                                           OutboxMessage.kwargs).where(OutboxMessage.key_prefix == prefix)
                                    .order_by(OutboxMessage.created_at)).all()
                conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
            assert all(r.kwargs == {} for r in rows)  # the token is in the task id: same arguments as before
            return [(r.id, r.task_name, r.args) for r in rows]

        yield app, fake, take_outbox


def _jobs(app, entity_id, kind=None):
    from app.db import db
    from app.embeddings.models import EmbeddingJob

    with app.app_context(), db.product_session("default") as session:
        query = select(EmbeddingJob).where(EmbeddingJob.entity_id == entity_id)
        if kind:
            query = query.where(EmbeddingJob.kind == kind)
        return list(session.scalars(query))


def _drop_walks(app, entity_id) -> None:
    """Forget the walk that enabling embeddings on a new definition queued (its message, if sent, is then
    a stale one and does nothing): these tests look at other jobs."""
    from sqlalchemy import delete

    from app.db import db
    from app.embeddings.models import EmbeddingJob

    with app.app_context(), db.product_session("default") as session:
        session.execute(delete(EmbeddingJob).where(EmbeddingJob.entity_id == entity_id,
                                                   EmbeddingJob.kind == "backfill"))


def _expire(app, job_id) -> None:
    from app.db import db
    from app.embeddings.models import EmbeddingJob
    from app.wire import utcnow

    with app.app_context(), db.product_session("default") as session:
        session.execute(update(EmbeddingJob).where(EmbeddingJob.id == job_id).values(lease_expires_at=utcnow()))


def _run(app, task_name, task_id, args):
    """Run a message as a worker would (its task id included) and return its result."""
    with app.app_context():
        task = app.extensions["celery"].tasks[task_name]
        result = task.apply(args=args, task_id=task_id)
        assert result.state == "SUCCESS", (result.state, result.result)
        return result.result


def _inputs(fake) -> list[str]:
    return [text for r in fake.requests for text in r.body["input"]]


def _embedded(app, org_id, entity_id) -> set[str]:
    from app.db import db
    from app.embeddings.models import EntityEmbedding

    with app.app_context(), db.product_session("default") as session:
        return set(session.scalars(select(EntityEmbedding.record_id).where(
            EntityEmbedding.org_id == org_id, EntityEmbedding.entity_id == entity_id)))


def test_records_job_is_leased_and_the_reaper_sends_a_lost_one_again_under_a_fresh_token(make_app, auth, org_id):
    from app.embeddings.jobs import LOCK_CLASS, requeue_stalled_jobs
    from app.tasks import job_lock, lease_of

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "leased", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        resp = client.post(f"{BASE}/leased/records", headers=headers, json={"fields": {"body": "alpha", "n": 1}})
        assert resp.status_code == 201, resp.get_json()
        record_id = resp.get_json()["id"]
        [job] = _jobs(app, entity_id)
        assert (job.kind, job.record_ids, job.dispatch_token) == ("records", [record_id], 0)
        [(first_id, name, args)] = take_outbox()  # the message is lost (taken, never run)
        assert name == "embeddings.records" and args == ["default", org_id, entity_id, [record_id]]
        assert lease_of(first_id) == (job.id, 0)

        with app.app_context():
            assert requeue_stalled_jobs() == 0  # within its lease: nothing happens
            _expire(app, job.id)
            with job_lock(LOCK_CLASS, job.id) as held:  # a worker holds the job: left alone
                assert held and requeue_stalled_jobs() == 0
            assert requeue_stalled_jobs() == 1  # past its lease, nobody holding it: sent again
            assert requeue_stalled_jobs() == 0  # ... and its lease renewed
        [(second_id, name, args2)] = take_outbox()
        assert lease_of(second_id) == (job.id, 0) and second_id != first_id and args2 == args
        assert _inputs(fake) == []

        assert _run(app, name, second_id, args2)["embedded"] == 1
        assert _inputs(fake) == ["body: alpha"] and _embedded(app, org_id, entity_id) == {record_id}
        assert _jobs(app, entity_id) == []  # done: the row is gone
        assert _run(app, name, first_id, args) == {"stale": True}  # the lost message turns up: nothing
        assert _run(app, name, second_id, args2) == {"stale": True}  # a duplicate delivery: nothing
        assert _inputs(fake) == ["body: alpha"]


def test_a_message_only_waiting_in_the_queue_still_runs_its_job_after_the_reaper_sent_it_again(make_app, auth,
                                                                                             org_id):
    """A backlog longer than the lease: the reaper sends every waiting job again (it cannot tell late from
    lost), and the message that was only waiting must stay valid; whichever of the two arrives first runs
    the job, the other does nothing. Under a fresh token the waiting message was voided and the job went
    to the back of the queue again, every lease period: once skipping the voided messages took a lease
    period (pending jobs x one lock and read), no message was ever current when it arrived, and the
    `embeddings` queue ran no job again while growing by one message per job and period."""
    from app.embeddings.jobs import requeue_stalled_jobs

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "queued", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        record_id = client.post(f"{BASE}/queued/records", headers=headers,
                                json={"fields": {"body": "beta", "n": 1}}).get_json()["id"]
        [job] = _jobs(app, entity_id)
        [(waiting_id, name, args)] = take_outbox()  # in the queue, behind a long backlog
        _expire(app, job.id)
        with app.app_context():
            assert requeue_stalled_jobs() == 1
        [(again_id, _, again)] = take_outbox()  # at the back of the queue

        assert _run(app, name, waiting_id, args)["embedded"] == 1  # its turn comes first: it runs the job
        assert _embedded(app, org_id, entity_id) == {record_id} and _jobs(app, entity_id) == []
        assert _run(app, name, again_id, again) == {"stale": True}
        assert _inputs(fake) == ["body: beta"]


def test_backfill_walk_is_one_leased_job_the_reaper_resumes_from_its_cursor(make_app, auth, org_id, monkeypatch):
    from app.embeddings import pipeline
    from app.embeddings.jobs import requeue_stalled_jobs
    from app.tasks import lease_of

    monkeypatch.setattr(pipeline, "RECORDS_PER_TASK", 2)
    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "walked", SCHEMA)
        for i in range(5):
            client.post(f"{BASE}/walked/records", headers=headers, json={"fields": {"body": f"w{i}", "n": i}})
        resp = client.put(f"{BASE}/definitions/walked", headers=headers, json={"embeddingsConfig": ON})
        assert resp.status_code == 200, resp.get_json()
        [(message_id, name, args)] = take_outbox()
        [job] = _jobs(app, entity_id)
        assert name == "embeddings.backfill" and job.kind == "backfill" and lease_of(message_id) == (job.id, 0)

        assert _run(app, name, message_id, args)["embedded"] == 2  # step 1
        [walk] = _jobs(app, entity_id)
        [(step2_id, _, step2)] = take_outbox()  # step 2's message is lost
        assert lease_of(step2_id) == (job.id, 1) and walk.dispatch_token == 1 and walk.after_id == step2[4]
        assert _run(app, name, message_id, args) == {"stale": True}  # step 1's message again: nothing

        _expire(app, job.id)
        with app.app_context():
            assert requeue_stalled_jobs() == 1
        [(again_id, _, again)] = take_outbox()
        assert lease_of(again_id) == (job.id, 1) and again == step2  # from the cursor, under the same token
        walked = 2 + _run(app, name, step2_id, step2)["embedded"]  # the late one turns up first: it runs
        assert _run(app, name, again_id, again) == {"stale": True}  # ... and the walk moved on past both
        [(step3_id, _, step3)] = take_outbox()
        step = (step3_id, step3)
        while step:
            walked += _run(app, name, *step)["embedded"]
            rows = take_outbox()
            step = (rows[0][0], rows[0][2]) if rows else None
        assert walked == 5 and _jobs(app, entity_id) == []
        assert sorted(_inputs(fake)) == [f"body: w{i}" for i in range(5)]  # every record embedded once


def test_messages_without_a_lease_still_run(make_app, auth, org_id, monkeypatch):
    """A message of the previous release (or an operator's `celery call`) has a plain task id: it runs,
    unleased, as before; an unleased backfill step hands the rest of its walk to a leased job."""
    from app.embeddings import pipeline
    from app.tasks import lease_of

    monkeypatch.setattr(pipeline, "RECORDS_PER_TASK", 2)
    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "plain", SCHEMA, embeddingsConfig=ON)
        ids = [client.post(f"{BASE}/plain/records", headers=headers,
                           json={"fields": {"body": f"p{i}", "n": i}}).get_json()["id"] for i in range(3)]
        take_outbox()
        _drop_walks(app, entity_id)
        plain = ["default", org_id, entity_id, ids[:1]]
        assert _run(app, "embeddings.records", str(uuid.uuid4()), plain)["embedded"] == 1
        result = _run(app, "embeddings.backfill", str(uuid.uuid4()), ["default", org_id, entity_id, "", ""])
        assert result["embedded"] == 2 and result["next"]
        [(next_id, name, args)] = take_outbox()
        [walk] = _jobs(app, entity_id, "backfill")
        assert lease_of(next_id) == (walk.id, 0) and args[4] == result["next"]
        assert _run(app, name, next_id, args)["next"] is None
        assert _embedded(app, org_id, entity_id) == set(ids)
        assert _jobs(app, entity_id, "backfill") == []


def test_embedding_job_of_a_worker_killed_mid_job_is_finished_once(make_app, database_url, redis_url, auth, org_id):
    """kill -9 of a real worker's process group while it waits on the embeddings upstream: the job's
    advisory lock ends with the worker's connection, its lease expires, and the next worker's reaper
    sends it again. The record gets its vector; the killed worker's message, should
    Redis deliver it again, does nothing."""
    from app.embeddings.tasks import embed_records
    from app.tasks import lease_message_id

    prefix = f"test-embed-lease-{uuid.uuid4().hex[:8]}:"
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        lease = {"OUTBOX_DISPATCH_INTERVAL_SECONDS": "1", "OUTBOX_DISPATCH_AFTER_SECONDS": "1",
                 "EMBEDDINGS_JOB_LEASE_SECONDS": "2", **_settings(fake)}
        app = make_app(CELERY_KEY_PREFIX=prefix, REDIS_URL=redis_url, EMBEDDINGS_JOB_LEASE_SECONDS=2, **_settings(fake))
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "killed", SCHEMA, embeddingsConfig=ON)
        _drop_walks(app, entity_id)
        fake.hold()
        resp = client.post(f"{BASE}/killed/records", headers=headers, json={"fields": {"body": "kill me", "n": 1}})
        assert resp.status_code == 201, resp.get_json()
        record_id = resp.get_json()["id"]
        [job] = _jobs(app, entity_id)
        worker = None
        try:
            worker = start_worker(database_url, redis_url, prefix=prefix, queues="embeddings", concurrency=1,
                                  log_name="worker-embed-lease-1.log", extra_env=lease)
            assert fake.arrived.wait(60)  # the worker is inside the job, waiting on the upstream
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
            fake.release()
            assert _embedded(app, org_id, entity_id) == set() and [j.id for j in _jobs(app, entity_id)] == [job.id]

            worker = start_worker(database_url, redis_url, prefix=prefix, queues="embeddings", concurrency=1,
                                  log_name="worker-embed-lease-2.log", extra_env=lease)
            wait_for(lambda: _embedded(app, org_id, entity_id) == {record_id} and not _jobs(app, entity_id),
                     timeout=90)
            calls = len(_inputs(fake))
            # the killed worker's message (token 0), as Redis would redeliver it after its visibility timeout
            late = lease_message_id(job.id, 0)
            with app.app_context():
                embed_records.apply_async(args=("default", org_id, entity_id, [record_id]), task_id=late)

            def outcome():  # results are not stored (task_ignore_result): the worker's log has it
                with open(worker.log_path) as log:
                    return next((line for line in log if f"[{late}] succeeded" in line), None)

            assert "{'stale': True}" in wait_for(outcome, timeout=60)
            assert len(_inputs(fake)) == calls  # nothing was embedded again
        finally:
            fake.release()
            if worker is not None:
                stop_worker(worker)
        got = client.get(f"{BASE}/killed/records/{record_id}", headers=headers).get_json()
        assert got["version"] == 1


def test_records_job_that_fails_for_good_drops_its_lease_instead_of_being_sent_again_forever(make_app, auth, org_id,
                                                                                           monkeypatch):
    """A records job whose task fails for good (here the worker's embedder cannot run: EmbedderConfigError,
    which a records task does not retry) lands in failed_tasks once, and its lease row goes with it. The
    row stayed: the reaper sent the job again every lease period, forever, each run failing the same way
    (a backfill step drops its row on that error; any other exception of either kind kept it too)."""
    from app.embeddings import EmbedderConfigError, pipeline
    from app.embeddings.jobs import requeue_stalled_jobs

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "poisoned", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        client.post(f"{BASE}/poisoned/records", headers=headers, json={"fields": {"body": "gamma", "n": 1}})
        [job] = _jobs(app, entity_id)
        [(message_id, name, args)] = take_outbox()

        def cannot_run(config):
            raise EmbedderConfigError("EMBEDDINGS_ENDPOINT is not set (the openai backend needs an API base URL)")

        monkeypatch.setattr(pipeline, "embedding_target", cannot_run)
        with app.app_context():
            result = app.extensions["celery"].tasks[name].apply(args=args, task_id=message_id)
        assert result.state == "FAILURE" and isinstance(result.result, EmbedderConfigError)
        assert _jobs(app, entity_id) == []  # the job is over (failed_tasks has it)
        _expire(app, job.id)
        with app.app_context():
            assert requeue_stalled_jobs() == 0
        assert take_outbox() == [] and _inputs(fake) == []


def test_a_task_id_naming_another_job_runs_nothing_and_leaves_that_job_alone(make_app, auth, org_id):
    """The task id is trusted for the job whose arguments the message carries, no other (email checks the
    job id the same way): a message with one job's arguments under another job's lease id (an operator's
    `--task-id`, a hand-built message) embedded its own records and then deleted the other job's row:
    that job's records were never embedded, and nothing would send them again."""
    from app.tasks import lease_of

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "crossed", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        for i in range(2):
            client.post(f"{BASE}/crossed/records", headers=headers, json={"fields": {"body": f"c{i}", "n": i}})
        (a_id, name, a_args), (b_id, _, b_args) = take_outbox()
        assert _run(app, name, b_id.replace(lease_of(b_id)[0], lease_of(a_id)[0]), b_args) == {"stale": True}
        other_org = ["default", str(uuid.uuid4()), entity_id, a_args[3]]
        assert _run(app, name, a_id, other_org) == {"stale": True}
        assert _inputs(fake) == [] and len(_jobs(app, entity_id)) == 2  # both jobs still to do
        assert _run(app, name, a_id, a_args)["embedded"] == 1
        assert _run(app, name, b_id, b_args)["embedded"] == 1
        assert sorted(_inputs(fake)) == ["body: c0", "body: c1"] and _jobs(app, entity_id) == []


def test_the_reaper_sends_each_product_s_jobs_for_that_product(make_app, org_id):
    """Jobs live in their product's schema (`entity_embedding_jobs` of product_<slug>): the reaper sends
    a job of product `other` as `other`'s, and that message runs it there (here: its definition is gone,
    so nothing to embed, and the row goes)."""
    from app.db import db
    from app.embeddings.jobs import lease_end, requeue_stalled_jobs
    from app.embeddings.models import EmbeddingJob
    from app.tasks import _key_prefix, lease_of
    from app.wire import new_id, utcnow

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        entity_id, job_id = str(uuid.uuid4()), new_id()
        with app.app_context():
            with db.product_session("other") as session:
                session.add(EmbeddingJob(id=job_id, kind="records", org_id=org_id, entity_id=entity_id,
                                         record_ids=["r1"], dispatch_token=3, lease_expires_at=lease_end(),
                                         key_prefix=_key_prefix(), created_at=utcnow()))
            with db.product_session("other") as session:
                session.execute(update(EmbeddingJob).where(EmbeddingJob.id == job_id)
                                .values(lease_expires_at=utcnow()))
            with db.product_session("default") as session:
                assert session.get(EmbeddingJob, job_id) is None
            assert requeue_stalled_jobs() == 1
        [(message_id, name, args)] = take_outbox()
        assert lease_of(message_id) == (job_id, 3) and args == ["other", org_id, entity_id, ["r1"]]
        assert _run(app, name, message_id, args)["skipped"] == 1
        with app.app_context(), db.product_session("other") as session:
            assert session.get(EmbeddingJob, job_id) is None


def test_eager_mode_writes_no_lease_rows(make_app, auth, org_id, monkeypatch):
    """Without a broker the tasks run in-process after the commit: no lease row is written (nothing would
    ever reap it) and the work is done, a backfill walk included."""
    from app.embeddings import pipeline

    monkeypatch.setattr(pipeline, "RECORDS_PER_TASK", 2)
    with FakeEmbeddingsServer(api_key="sk-test") as fake:
        app = make_app(REDIS_URL="", **_settings(fake))
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "eager", SCHEMA)
        ids = [client.post(f"{BASE}/eager/records", headers=headers,
                           json={"fields": {"body": f"e{i}", "n": i}}).get_json()["id"] for i in range(3)]
        resp = client.put(f"{BASE}/definitions/eager", headers=headers, json={"embeddingsConfig": ON})
        assert resp.status_code == 200, resp.get_json()
        ids.append(client.post(f"{BASE}/eager/records", headers=headers,
                               json={"fields": {"body": "e3", "n": 3}}).get_json()["id"])
        assert _embedded(app, org_id, entity_id) == set(ids) and _jobs(app, entity_id) == []


def test_a_retry_the_broker_could_not_take_leaves_the_job_to_the_reaper(make_app, auth, org_id, monkeypatch):
    """A transient upstream error while the broker is down: Celery cannot send the retry and rejects the
    message (Task.retry raises Reject(requeue=False)); nothing lands in failed_tasks. The job keeps its
    lease row, so the reaper sends it again once the lease is over, rather than it being lost."""
    from celery.exceptions import Reject

    from app.embeddings import tasks as embedding_tasks
    from app.embeddings.jobs import requeue_stalled_jobs

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "rejected", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        record_id = client.post(f"{BASE}/rejected/records", headers=headers,
                                json={"fields": {"body": "delta", "n": 1}}).get_json()["id"]
        [job] = _jobs(app, entity_id)
        [(message_id, name, args)] = take_outbox()

        def broker_down(task, exc, max_retries):  # what Task.retry does when it cannot send the retry
            raise Reject(exc, requeue=False)

        monkeypatch.setattr(embedding_tasks, "retry_or_give_up", broker_down)
        fake.fail_next(503, times=10)
        with app.app_context():
            result = app.extensions["celery"].tasks[name].apply(args=args, task_id=message_id)
        assert result.state != "SUCCESS"
        assert [j.id for j in _jobs(app, entity_id)] == [job.id]  # still to do
        monkeypatch.undo()
        fake._failures.clear()
        _expire(app, job.id)
        with app.app_context():
            assert requeue_stalled_jobs() == 1
        [(again_id, _, again)] = take_outbox()
        assert _run(app, name, again_id, again)["embedded"] == 1
        assert _embedded(app, org_id, entity_id) == {record_id} and _jobs(app, entity_id) == []


def test_a_product_whose_schema_is_not_migrated_does_not_stop_the_lease_reapers(make_app, auth, org_id):
    """create_product registers a product, then migrates its schema (seeding does it at runtime; a failed
    migration leaves it so): meanwhile its tables do not exist. The lease reapers went through every
    product in one loop, so that product's UndefinedTable stopped the embedding and email reapers for
    every product, each maintenance round, until its schema was there."""
    from sqlalchemy import delete, insert

    from app.db import db
    from app.email.bulk import requeue_stalled_jobs as requeue_stalled_email_jobs
    from app.embeddings.jobs import requeue_stalled_jobs
    from app.entities.bulk import requeue_orphaned_jobs
    from app.platform_models import Product
    from app.wire import utcnow

    with _dead_broker_app(make_app) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "unmigrated", SCHEMA, embeddingsConfig=ON)
        take_outbox()
        _drop_walks(app, entity_id)
        client.post(f"{BASE}/unmigrated/records", headers=headers, json={"fields": {"body": "eps", "n": 1}})
        [job] = _jobs(app, entity_id)
        take_outbox()
        _expire(app, job.id)
        slug = f"a_unmigrated_{uuid.uuid4().hex[:8]}"
        with app.app_context():
            with db.engine.begin() as conn:
                conn.execute(insert(Product.__table__).values(slug=slug, name=slug, schema_name=f"product_{slug}",
                                                              created_at=utcnow()))
            try:
                assert requeue_stalled_jobs() == 1
                assert requeue_stalled_email_jobs() >= 0
                assert requeue_orphaned_jobs() >= 0  # the entity bulk jobs' reaper goes through the same loop
            finally:
                with db.engine.begin() as conn:
                    conn.execute(delete(Product.__table__).where(Product.__table__.c.slug == slug))
        [(_, name, _args)] = take_outbox()
        assert name == "embeddings.records"


def test_reap_each_product_skips_only_a_missing_schema_and_raises_any_other_error(make_app):
    """The per-product loop of the lease reapers forgives a product whose tables are not there yet, and
    nothing else: a reaper's own SQL error must not become a warning logged every round."""
    import psycopg.errors
    import pytest
    from sqlalchemy.exc import ProgrammingError

    from app.tasks import reap_each_product

    app = make_app()
    calls = []

    def missing(product):
        calls.append(product)
        raise ProgrammingError("SELECT 1", {}, psycopg.errors.UndefinedTable("relation does not exist"))

    def broken(product):
        raise ProgrammingError("SELEC 1", {}, psycopg.errors.SyntaxError("syntax error"))

    with app.app_context():
        assert reap_each_product("test reaper", missing) == 0
        assert calls  # every product was tried
        assert reap_each_product("test reaper", lambda product: 2) == 2 * len(calls)
        with pytest.raises(ProgrammingError):
            reap_each_product("test reaper", broken)


def test_a_job_interrupted_on_every_run_is_dropped_into_failed_tasks_with_the_reason(make_app, auth, org_id):
    """Issue 22: an embedding job whose every run is cut short (the task time limit, a worker lost) is sent
    again only while it has runs left (JOB_MAX_ATTEMPTS); then the reaper drops it and records why in
    platform.failed_tasks, where an operator finds every task that failed for good. A message only
    waiting in the queue is not a run: the count moves when a worker claims the job."""
    from app.db import db
    from app.embeddings import jobs
    from app.embeddings.jobs import requeue_stalled_jobs
    from app.platform_models import FailedTask

    with _dead_broker_app(make_app, JOB_MAX_ATTEMPTS=2) as (app, fake, take_outbox):
        client, headers = app.test_client(), auth()
        entity_id = create_definition(client, headers, "doomed", SCHEMA, embeddingsConfig=ON)
        _drop_walks(app, entity_id)
        resp = client.post(f"{BASE}/doomed/records", headers=headers, json={"fields": {"body": "slow", "n": 1}})
        assert resp.status_code == 201, resp.get_json()
        [job] = _jobs(app, entity_id)
        take_outbox()

        def run_started_and_lost():  # a worker claims the job (a run starts), then dies with it
            with app.app_context(), db.product_session("default") as session:
                assert jobs.claim(session, job.id, 0, "records") is not None
            _expire(app, job.id)

        _expire(app, job.id)
        with app.app_context():
            assert requeue_stalled_jobs() == 1  # never started (only late): sent again, nothing counted
        assert [j.attempts for j in _jobs(app, entity_id)] == [0]
        run_started_and_lost()
        with app.app_context():
            assert requeue_stalled_jobs() == 1  # one run of two used
        run_started_and_lost()
        take_outbox()
        with app.app_context():
            assert requeue_stalled_jobs() == 0  # both used: dropped, not sent
        assert _jobs(app, entity_id) == [] and take_outbox() == []
        with app.app_context(), db.product_session("default") as session:
            failed = session.scalars(select(FailedTask).where(FailedTask.task_id == job.id)).all()
        assert [(f.task_name, f.args[2]) for f in failed] == [("embeddings.records", entity_id)]
        assert "2 interrupted run" in failed[0].error and "time limit" in failed[0].error
