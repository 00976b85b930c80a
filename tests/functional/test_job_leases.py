"""Issue 22, "jobs without a lease": every accepted job kind has a lease, a reaper that sends it again
through the outbox, and a bound (JOB_MAX_ATTEMPTS) after which a job that never finishes (its task is
killed by the time limit, or its worker lost, on every run) is failed with the reason where its status
is read, instead of being sent again forever.

Bulk entity jobs and rollouts here (the reaper driven by hand, the broker down so every message stays an
outbox row); bulk email with a real worker and a real time limit in test_email_bulk_api.py; embedding
jobs in test_embedding_leases.py; the backfill walk across a Redis outage in test_job_durability.py."""

from __future__ import annotations

import uuid

from tests.functional.entities_support import BASE, create_definition
from tests.functional.test_reliability import _free_port
from tests.functional.test_rollout_api import registry  # noqa: F401  (fixture: restores platform.artifacts)

SCHEMA = {"type": "object", "properties": {"body": {"type": "text"}, "n": {"type": "int"}}}


def _dead_broker_app(make_app, **overrides):
    """An app whose broker is down: what it sends stays in platform.task_outbox under its own prefix."""
    prefix = f"lease-{uuid.uuid4().hex[:8]}:"
    return make_app(REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", CELERY_KEY_PREFIX=prefix, **overrides), prefix


def _take_outbox(app, prefix) -> list[tuple[str, str, list]]:
    """Remove and return the app's outbox rows as (task id, task name, args)."""
    from sqlalchemy import delete, select

    from app.db import db
    from app.platform_models import OutboxMessage

    with app.app_context(), db.engine.begin() as conn:
        rows = conn.execute(select(OutboxMessage.id, OutboxMessage.task_name, OutboxMessage.args)
                            .where(OutboxMessage.key_prefix == prefix).order_by(OutboxMessage.created_at)).all()
        conn.execute(delete(OutboxMessage).where(OutboxMessage.key_prefix == prefix))
    return [(r.id, r.task_name, r.args) for r in rows]


def test_bulk_job_interrupted_on_every_run_is_failed_with_the_reason(make_app, auth):
    """A running bulk job whose worker is gone is re-queued while it has runs left; once JOB_MAX_ATTEMPTS
    runs were each interrupted (the task time limit kills the same job every time), the reaper fails it
    and GET /jobs/{id} says why. (Before: it was set back to `pending` and re-run forever.)"""
    from sqlalchemy import text

    from app.db import db
    from app.entities import bulk

    app, prefix = _dead_broker_app(make_app, JOB_MAX_ATTEMPTS=2, JOB_LEASE_SECONDS=60)
    client, headers = app.test_client(), auth()
    create_definition(client, headers, "leased", SCHEMA)
    resp = client.post(f"{BASE}/leased/records/bulk/create", headers={**headers, "Prefer": "respond-async"},
                       json={"records": [{"name": "a", "fields": {"body": "a", "n": 1}}]})
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["jobId"]
    assert [name for _, name, _ in _take_outbox(app, prefix)] == ["bulk.entity_records"]

    def run_started_and_lost():  # a worker claims the job, then is killed: its row lock is gone
        with app.app_context():
            assert bulk.claim_job(job_id, "default")
        with app.app_context(), db.product_session("default") as session:
            session.execute(text("UPDATE product_default.entity_bulk_jobs SET started_at = now() - interval "
                                 "'1 hour' WHERE id = :id"), {"id": job_id})

    run_started_and_lost()
    with app.app_context():
        assert bulk.requeue_orphaned_jobs() == 1  # one run used: sent again
    assert client.get(f"/api/v1/jobs/{job_id}", headers=headers).get_json()["status"] == "pending"
    assert [(name, args) for _, name, args in _take_outbox(app, prefix)] == [("bulk.entity_records",
                                                                              [job_id, "default"])]
    run_started_and_lost()
    with app.app_context():
        assert bulk.requeue_orphaned_jobs() == 0  # both runs used: failed, not sent
    assert _take_outbox(app, prefix) == []
    job = client.get(f"/api/v1/jobs/{job_id}", headers=headers).get_json()
    assert job["status"] == "failed" and job["error"]["code"] == "SYSTEM_ERROR", job
    assert "2 interrupted run" in job["error"]["message"] and "time limit" in job["error"]["message"]
    assert job["finishedAt"]
    # nothing was written, and a late message of the job does nothing
    with app.app_context():
        assert bulk.claim_job(job_id, "default") is False
    records = client.post(f"{BASE}/leased/records/query", json={"query": {}}, headers=headers).get_json()
    assert records["records"] == []


def _publish(app, version_bump: int = 1):
    """Publish a new version of skill.summarize from `app` (a rollout starts); returns the rollout id."""
    from app.ops.rollout import list_artifacts, publish

    with app.app_context():
        art = next(a for a in list_artifacts() if a.id == "skill.summarize")
        definition = dict(art.payload, title=f"Summarize {uuid.uuid4().hex[:6]}")
        _, rollout = publish({"kind": "skill", "name": "summarize",
                              "artifactVersion": art.artifact_version + version_bump, "definition": definition})
        return rollout.id


def _rollout(app, rid) -> dict:
    from app.db import db
    from app.platform_models import Rollout

    with app.app_context():
        r = db.session.get(Rollout, rid)
        return {"status": r.status, "token": r.dispatch_token, "attempts": r.attempts, "error": r.error,
                "leased": r.lease_expires_at is not None, "prefix": r.key_prefix}


def _expire(app, rid, **values) -> None:
    from sqlalchemy import text

    from app.db import db

    sets = ", ".join(["lease_expires_at = now() - interval '1 hour'"] + [f"{k} = :{k}" for k in values])
    with app.app_context(), db.engine.begin() as conn:
        conn.execute(text(f"UPDATE platform.rollouts SET {sets} WHERE id = :id"), {"id": rid, **values})


def test_rollout_is_a_leased_job_the_reaper_sends_again_then_fails_with_the_reason(make_app, registry):  # noqa: F811
    """seed.rollout had no lease: a batch killed by the task time limit left the rollout `running` for
    good (the message is acknowledged on a time-out, so Redis never redelivers it). Now its message
    carries the rollout's dispatch token in its task id and the rollout a lease: the rollout lease reaper
    sends a rollout past its lease that no worker holds again, and after JOB_MAX_ATTEMPTS interrupted
    runs marks it failed with the reason (GET …/rollouts/{id}); resume starts a new chain."""
    from app.ops.rollout import requeue_stalled_rollouts, resume
    from app.tasks import lease_of

    app, prefix = _dead_broker_app(make_app, JOB_MAX_ATTEMPTS=2)
    rid = _publish(app)
    state = _rollout(app, rid)
    assert state["status"] == "pending" and state["leased"] and state["prefix"] == prefix and state["token"] == 0
    (sent,) = _take_outbox(app, prefix)
    assert sent[1] == "seed.rollout" and sent[2] == [rid] and lease_of(sent[0]) == (rid, 0)

    with app.app_context():
        assert requeue_stalled_rollouts() == 0  # within its lease: left alone
    _expire(app, rid, status="running", attempts=1)  # a run started, then its worker was lost
    with app.app_context():
        assert requeue_stalled_rollouts() == 1
    (again,) = _take_outbox(app, prefix)
    assert lease_of(again[0]) == (rid, 0) and again[2] == [rid]  # same token: a late first message stays valid

    _expire(app, rid, attempts=2)  # the second run was lost too
    with app.app_context():
        assert requeue_stalled_rollouts() == 0
    assert _take_outbox(app, prefix) == []
    state = _rollout(app, rid)
    assert state["status"] == "failed" and "2 interrupted run" in state["error"] and not state["leased"]
    with app.app_context():
        from app.ops.rollout import get_rollout, rollout_to_wire

        assert rollout_to_wire(get_rollout(rid))["error"] == state["error"]  # what the admin route shows

    with app.app_context():
        resume(rid)  # a new chain: a new token, the runs counted anew
    state = _rollout(app, rid)
    assert (state["status"], state["token"], state["attempts"], state["error"]) == ("pending", 1, 0, None)
    (resumed,) = _take_outbox(app, prefix)
    assert lease_of(resumed[0]) == (rid, 1)


def test_a_rollout_message_of_an_older_token_does_nothing(make_app, registry):  # noqa: F811
    """A late duplicate of a batch's message (its token moved on) changes nothing."""
    from app.ops.tasks import rollout_task
    from app.tasks import lease_message_id

    app, prefix = _dead_broker_app(make_app)
    rid = _publish(app)
    _take_outbox(app, prefix)
    with app.app_context():
        from app.ops.rollout import resume

        resume(rid)  # token 1
    _take_outbox(app, prefix)
    with app.app_context():
        assert rollout_task.apply(args=(rid,), task_id=lease_message_id(rid, 0)).result == "stale"
    state = _rollout(app, rid)
    assert (state["status"], state["token"], state["attempts"]) == ("pending", 1, 0)


def test_cli_commands_that_queue_work_write_it_to_the_outbox(make_app, auth, org_id):
    """`flask embeddings backfill` and `flask seed org --queue` sent their task with apply_async: with
    Redis down the command failed (or the walk was unleased). Now the walk is a leased job and both
    messages are outbox rows of the command's transaction, sent once Redis takes them."""
    from app.tasks import lease_of

    app, prefix = _dead_broker_app(make_app)
    client, headers = app.test_client(), auth()
    entity_id = create_definition(client, headers, "clied", SCHEMA, embeddingsConfig={"enabled": True,
                                                                                    "fields": ["body"]})
    _take_outbox(app, prefix)
    result = app.test_cli_runner().invoke(args=["embeddings", "backfill", "--org", org_id])
    assert result.exit_code == 0, result.output
    [(task_id, name, args)] = _take_outbox(app, prefix)
    assert name == "embeddings.backfill" and args[:3] == ["default", org_id, entity_id] and lease_of(task_id)

    domain = f"cli-{uuid.uuid4().hex[:8]}.example"
    result = app.test_cli_runner().invoke(args=[
        "seed", "org", "--title", "Cli", "--domain", domain, "--admin-email", f"a@{domain}", "--first-name", "A",
        "--last-name", "B", "--queue"])
    assert result.exit_code == 0, result.output
    [(task_id, name, _)] = _take_outbox(app, prefix)
    assert name == "seed.org" and f"queued seed.org task {task_id}" in result.output


def test_async_seed_is_a_leased_job_the_reaper_sends_again_then_fails_with_the_reason(make_app):
    """seed.org had no lease: a 202 whose message was lost with Redis' memory, or whose run was killed by
    the time limit (Celery acknowledges it), was never seeded and nothing said so. Now each accepted
    async seed is a `seed_jobs` row with the lease shape: the reaper sends it again, a late duplicate
    does nothing, and the org's status answer shows the request (`lastRequest`), `failed` with the
    reason once JOB_MAX_ATTEMPTS runs were lost."""
    from sqlalchemy import select, text

    from app.db import db
    from app.ops.seed_jobs import requeue_stalled_seed_jobs
    from app.ops.tasks import seed_org_task
    from app.platform_models import OutboxMessage
    from app.tasks import lease_of

    secret = "internal-" + "s" * 32
    app, prefix = _dead_broker_app(make_app, INTERNAL_API_TOKEN=secret, JOB_MAX_ATTEMPTS=1)
    client, hdr = app.test_client(), {"X-Internal-Token": secret}
    domain = f"leased-{uuid.uuid4().hex[:8]}.example"
    body = {"org": {"title": "Leased", "mainDomain": domain, "product": "default"},
            "admin": {"email": f"admin@{domain}", "firstName": "Ada", "lastName": "Admin"}}

    def accept() -> tuple[str, str]:
        resp = client.post("/internal/seed", json=body, headers={**hdr, "Prefer": "respond-async"})
        assert resp.status_code == 202, resp.get_json()
        return resp.get_json()["taskId"], resp.get_json()["statusUrl"]

    def kwargs_of(task_id) -> dict:
        with app.app_context(), db.engine.connect() as conn:
            return conn.scalar(select(OutboxMessage.kwargs).where(OutboxMessage.id == task_id))

    def last_request(url) -> dict:
        resp = client.get(url, headers=hdr)
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()["lastRequest"]

    def expire(job_id, **values):
        sets = ", ".join(["lease_expires_at = now() - interval '1 hour'"] + [f"{k} = :{k}" for k in values])
        with app.app_context(), db.engine.begin() as conn:
            conn.execute(text(f"UPDATE platform.seed_jobs SET {sets} WHERE id = :id"), {"id": job_id, **values})

    task_id, url = accept()
    job_id, token = lease_of(task_id)
    kwargs = kwargs_of(task_id)
    assert [(t, name) for t, name, _ in _take_outbox(app, prefix)] == [(task_id, "seed.org")]
    assert last_request(url)["status"] == "queued"
    with app.app_context():
        assert requeue_stalled_seed_jobs() == 0  # within its lease
    expire(job_id)  # the message was lost with Redis' memory
    with app.app_context():
        assert requeue_stalled_seed_jobs() == 1
    [(again, name, _)] = _take_outbox(app, prefix)
    assert name == "seed.org" and lease_of(again) == (job_id, token) and again != task_id
    with app.app_context():  # a worker runs the re-sent message
        report = seed_org_task.apply(kwargs=kwargs, task_id=again).result
    assert report["orgId"] == domain and report["created"] is True
    state = last_request(url)
    assert (state["id"], state["status"], state["attempts"], state["error"]) == (job_id, "done", 1, None)
    with app.app_context():  # the lost message turns up: nothing happens
        assert seed_org_task.apply(kwargs=kwargs, task_id=task_id).result == {"stale": True}

    task_id, _ = accept()  # a second request whose one run (JOB_MAX_ATTEMPTS=1) is lost
    _take_outbox(app, prefix)
    expire(lease_of(task_id)[0], status="running", attempts=1)
    with app.app_context():
        assert requeue_stalled_seed_jobs() == 0
    assert _take_outbox(app, prefix) == []
    state = last_request(url)
    assert state["status"] == "failed" and "1 interrupted run" in state["error"] and state["finishedAt"]
