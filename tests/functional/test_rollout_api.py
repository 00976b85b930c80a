"""Artifact registry and rollout: publish, replace unedited copies, keep and report edited ones,
resume after a stop, progress via the admin routes, the CLI and a real worker."""

from __future__ import annotations

import copy
import json
import re
import uuid

import pytest

from tests.functional.test_seed_api import HDR, body, domain
from tests.support import assert_error, bearer, token

ADMIN_ARTIFACTS = "/api/v1/admin/artifacts"


@pytest.fixture()
def eager():
    """Run sent tasks inline for this test (the route tests read the finished rollout at once)."""
    from app.extensions import celery_app

    saved = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = saved


@pytest.fixture()
def registry(seed_app):
    """Restore platform.artifacts after the test, so other tests seed the release's version 1."""
    from sqlalchemy import delete, insert, select

    from app.db import db
    from app.platform_models import Artifact

    with seed_app.app_context():
        cols = Artifact.__table__.columns
        saved = [dict(r._mapping) for r in db.session.execute(select(*cols))]
    yield
    with seed_app.app_context():
        db.session.execute(delete(Artifact))
        if saved:
            db.session.execute(insert(Artifact), saved)
        db.session.commit()


def super_admin():
    return bearer(token(org="platform-ops", role="super_admin", scopes=[]))


def seed(client, d):
    resp = client.post("/internal/seed", json=body(d), headers=HDR)
    assert resp.status_code in (200, 201), resp.get_json()
    return resp.get_json()


def current(client, artifact_id):
    arts = client.get(ADMIN_ARTIFACTS, headers=super_admin()).get_json()["artifacts"]
    return next(a for a in arts if a["id"] == artifact_id)


def org_admin(d):
    return bearer(token(org=d, role="admin", user="org-admin"))


def test_registry_lists_the_15(seed_client):
    resp = seed_client.get(ADMIN_ARTIFACTS, headers=super_admin())
    assert resp.status_code == 200
    ids = [a["id"] for a in resp.get_json()["artifacts"]]
    assert len(ids) >= 15 and "agent.assistant" in ids and "database.product-schema" in ids


def test_registry_read_writes_nothing_once_the_builtins_are_stored(seed_app, seed_client, registry):
    """sync_builtin_artifacts runs on every registry read; it writes only when the release's built-ins
    differ from the stored rows: a read issues no INSERT/UPDATE and leaves updated_at alone. A
    built-in whose row is behind (or missing) is written back on the next read."""
    from sqlalchemy import delete, event, select, update

    from app.db import db
    from app.ops.seeding import sync_builtin_artifacts
    from app.platform_models import Artifact

    assert seed_client.get(ADMIN_ARTIFACTS, headers=super_admin()).status_code == 200  # stored now
    with seed_app.app_context():
        before = dict(db.session.execute(select(Artifact.id, Artifact.updated_at)).all())
        engine = db.engine
    statements = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement.lstrip().split(None, 1)[0].upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        for _ in range(2):
            assert seed_client.get(ADMIN_ARTIFACTS, headers=super_admin()).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert "SELECT" in statements and not {"INSERT", "UPDATE", "DELETE"} & set(statements), statements
    with seed_app.app_context():
        assert dict(db.session.execute(select(Artifact.id, Artifact.updated_at)).all()) == before
        # a built-in behind the release (a row an older release wrote) and one missing: written again
        db.session.execute(update(Artifact).where(Artifact.id == "agent.assistant").values(
            artifact_version=0, payload={"old": True}))
        db.session.execute(delete(Artifact).where(Artifact.id == "database.product-schema"))
        db.session.commit()
        assert sync_builtin_artifacts(db.session) is True
        db.session.commit()
        assert sync_builtin_artifacts(db.session) is False
        rows = dict(db.session.execute(select(Artifact.id, Artifact.artifact_version)).all())
    assert rows["agent.assistant"] >= 1 and "database.product-schema" in rows


def test_registry_sync_sees_a_change_python_equality_hides(seed_app, seed_client):
    """The release's definition and the stored row are compared as JSON, not with Python's `==`
    (which holds `1 == True` and `0 == False`): a stored `"enabled": 1` at the release's version is a
    different document (the SQL guard, `IS DISTINCT FROM` on jsonb, agrees) and is written back."""
    from sqlalchemy import select, update

    from app.db import db
    from app.ops.artifacts import BUILTIN
    from app.ops.seeding import sync_builtin_artifacts
    from app.platform_models import Artifact

    assert seed_client.get(ADMIN_ARTIFACTS, headers=super_admin()).status_code == 200  # stored now
    release = next(a for a in BUILTIN if a["kind"] == "skill" and a["name"] == "summarize")
    assert release["definition"]["enabled"] is True
    with seed_app.app_context():
        db.session.execute(update(Artifact).where(Artifact.id == "skill.summarize").values(
            payload={**release["definition"], "enabled": 1}))
        db.session.commit()
        assert sync_builtin_artifacts(db.session) is True
        db.session.commit()
        stored = db.session.scalar(select(Artifact.payload).where(Artifact.id == "skill.summarize"))
        assert stored["enabled"] is True
        assert sync_builtin_artifacts(db.session) is False


def test_admin_routes_need_admin_role(seed_client, auth):
    assert seed_client.get(ADMIN_ARTIFACTS, headers=auth("read", "write", "admin")).status_code == 403
    assert seed_client.post(ADMIN_ARTIFACTS, json={}, headers=auth("write")).status_code == 403
    assert seed_client.get(ADMIN_ARTIFACTS).status_code == 401


def test_rollout_replaces_unedited_and_keeps_edited_copies(seed_client, registry, eager):
    plain, edited, renamed = domain(), domain(), domain()
    for d in (plain, edited, renamed):
        seed(seed_client, d)
    # org 2 edits its assistant agent; org 3 edits its contacts definition (another artifact)
    agent_id = seed_client.get("/api/v1/agents/by-name?name=assistant", headers=org_admin(edited)).get_json()[
        "agent"]["id"]
    put = seed_client.put(f"/api/v1/agents/{agent_id}", json={"title": "Our own assistant"},
                          headers=org_admin(edited))
    assert put.status_code == 200, put.get_json()

    art = current(seed_client, "agent.assistant")
    new = copy.deepcopy(art["definition"])
    new["title"] = "Assistant (improved)"
    new["systemPrompt"] = "You are the improved assistant."
    version = art["artifactVersion"] + 1
    resp = seed_client.post(ADMIN_ARTIFACTS, json={"kind": "agent", "name": "assistant",
                                                   "artifactVersion": version, "definition": new},
                            headers=super_admin())
    assert resp.status_code == 202, resp.get_json()
    rollout = resp.get_json()["rollout"]
    assert rollout["artifactVersion"] == version

    # eager (no Redis): the rollout already ran
    detail = seed_client.get(f"{ADMIN_ARTIFACTS}/rollouts/{rollout['id']}?limit=1000", headers=super_admin())
    assert detail.status_code == 200
    data = detail.get_json()
    assert data["rollout"]["status"] == "done"
    outcomes = {o["orgId"]: o for o in data["outcomes"]}
    assert outcomes[plain]["outcome"] == "updated" and outcomes[renamed]["outcome"] == "updated"
    assert outcomes[edited]["outcome"] == "forked" and "edited" in outcomes[edited]["detail"]
    assert data["rollout"]["processed"] == len(data["outcomes"])

    got = seed_client.get("/api/v1/agents/by-name?name=assistant", headers=org_admin(plain)).get_json()["agent"]
    assert got["title"] == "Assistant (improved)" and got["artifactVersion"] == version
    assert got["id"] == next(a for a in seed(seed_client, plain)["artifacts"] if a["id"] == "agent.assistant")[
        "objectId"]
    kept = seed_client.get("/api/v1/agents/by-name?name=assistant", headers=org_admin(edited)).get_json()["agent"]
    assert kept["title"] == "Our own assistant" and kept["artifactVersion"] == version - 1
    report = seed(seed_client, edited)
    line = next(a for a in report["artifacts"] if a["id"] == "agent.assistant")
    assert line["forkedFromVersion"] == version - 1 and line["artifactVersion"] == version - 1

    # a newly seeded org gets the new version directly
    fresh = domain()
    report = seed(seed_client, fresh)
    assert next(a for a in report["artifacts"] if a["id"] == "agent.assistant")["artifactVersion"] == version

    # same version again: 409; filter by outcome
    again = seed_client.post(ADMIN_ARTIFACTS, json={"kind": "agent", "name": "assistant",
                                                    "artifactVersion": version, "definition": new},
                             headers=super_admin())
    assert again.status_code == 409
    forked = seed_client.get(f"{ADMIN_ARTIFACTS}/rollouts/{rollout['id']}?outcome=forked&limit=1000",
                             headers=super_admin()).get_json()["outcomes"]
    assert edited in {o["orgId"] for o in forked} and plain not in {o["orgId"] for o in forked}


def test_entity_rollout_marks_forked_definition(seed_client, registry, eager):
    plain, edited = domain(), domain()
    seed(seed_client, plain)
    seed(seed_client, edited)
    upd = seed_client.put("/api/v1/entities/definitions/notes", json={"description": "ours"},
                          headers=org_admin(edited))
    assert upd.status_code == 200, upd.get_json()
    art = current(seed_client, "entity.notes")
    new = copy.deepcopy(art["definition"])
    new["schema"]["properties"]["topic"] = {"type": "string", "fieldType": "string"}
    new["views"].append({"name": "Pinned", "type": "table", "columns": ["name", "topic"]})
    resp = seed_client.post(ADMIN_ARTIFACTS, json={"kind": "entity", "name": "notes",
                                                   "artifactVersion": art["artifactVersion"] + 1, "definition": new},
                            headers=super_admin())
    assert resp.status_code == 202, resp.get_json()
    d1 = seed_client.get("/api/v1/entities/definitions/notes", headers=org_admin(plain)).get_json()["definition"]
    assert "topic" in d1["schema"]["properties"] and d1["artifactVersion"] == art["artifactVersion"] + 1
    views = seed_client.get("/api/v1/entities/definitions/notes/views", headers=org_admin(plain)).get_json()
    assert "Pinned" in json.dumps(views)
    d2 = seed_client.get("/api/v1/entities/definitions/notes", headers=org_admin(edited)).get_json()["definition"]
    assert "topic" not in d2["schema"]["properties"]
    assert d2["forkedFromVersion"] == art["artifactVersion"] and d2["description"] == "ours"


@pytest.mark.parametrize("doc,field", [
    ({"kind": "gadget", "name": "x", "artifactVersion": 2, "definition": {}}, "kind"),
    ({"kind": "agent", "name": "assistant", "artifactVersion": "2", "definition": {}}, "artifactVersion"),
    ({"kind": "agent", "name": "assistant", "artifactVersion": 99, "definition": []}, "definition"),
    ({"kind": "agent", "name": "assistant", "artifactVersion": 99, "definition": {"type": "chat"}},
     "definition.name"),
    ({"kind": "agent", "name": "assistant", "artifactVersion": 99,
      "definition": {"type": "chat", "name": "assistant", "title": "t", "provider": "p", "model": "m",
                     "skills": [{"skillName": "nope", "enabled": True, "order": 0}]}}, "definition.skills"),
    ({"kind": "entity", "name": "notes", "artifactVersion": 99,
      "definition": {"name": "notes", "schema": {"type": "object", "properties": {"Bad Name": {}}}}},
     "definition.schema"),
    ({"kind": "skill", "name": "summarize", "artifactVersion": 99, "definition": {"name": "summarize"}},
     "definition.title"),
    ({"kind": "agent", "name": "assistant", "artifactVersion": 99, "definition": {}, "extra": 1}, "extra"),
])
def test_publish_rejects_bad_documents(seed_client, doc, field):
    resp = seed_client.post(ADMIN_ARTIFACTS, json=doc, headers=super_admin())
    assert resp.status_code == 400, resp.get_json()
    err = resp.get_json()["error"]
    assert err["code"] == "VALIDATION_ERROR" and field in json.dumps(err["details"]), err


def test_publish_non_json(seed_client):
    """The body goes through the API's one mechanism (`@blp.arguments`): malformed JSON is 400
    INVALID_INPUT, another Content-Type 415, a bad query parameter 400 naming it."""
    doc = {"kind": "skill", "name": "summarize", "artifactVersion": 999, "definition": {}}
    for text in ("{", '{"kind": "skill", "name": "summarize", "artifactVersion": NaN, "definition": {}}'):
        resp = seed_client.post(ADMIN_ARTIFACTS, data=text,
                                headers={**super_admin(), "Content-Type": "application/json"})
        assert_error(resp, 400, "INVALID_INPUT")
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        resp = seed_client.post(ADMIN_ARTIFACTS, data=json.dumps(doc), headers={**super_admin(),
                                                                                 "Content-Type": content_type})
        assert_error(resp, 415, "INVALID_INPUT")
    resp = seed_client.post(ADMIN_ARTIFACTS, data=json.dumps(doc), headers=super_admin())  # no Content-Type
    assert_error(resp, 415, "INVALID_INPUT")
    resp = seed_client.post(ADMIN_ARTIFACTS, headers=super_admin())  # no body: the fields are missing
    assert set(assert_error(resp, 400, "VALIDATION_ERROR")["error"]["details"]["fields"]) == {
        "kind", "name", "artifactVersion", "definition"}
    resp = seed_client.post(f"{ADMIN_ARTIFACTS}?rollout=maybe", json=doc, headers=super_admin())
    assert "rollout" in assert_error(resp, 400, "VALIDATION_ERROR")["error"]["details"]["fields"]
    resp = seed_client.post(ADMIN_ARTIFACTS, json=[1, 2], headers=super_admin())
    assert_error(resp, 400, "VALIDATION_ERROR")
    assert current(seed_client, "skill.summarize")["artifactVersion"] < 999  # nothing was published


def test_rollout_resumes_from_its_cursor(seed_app, seed_client, registry):
    """A rollout stopped after one batch (as a lost worker would leave it) continues where it was,
    and no org is processed twice."""
    from app.db import db
    from app.ops.rollout import publish, run_rollout

    for _ in range(3):
        seed(seed_client, domain())
    art = current(seed_client, "skill.summarize")
    new = dict(art["definition"], title="Summarize v-next")
    with seed_app.app_context():
        _, rollout = publish({"kind": "skill", "name": "summarize", "artifactVersion": art["artifactVersion"] + 1,
                              "definition": new}, rollout=False)
        from app.ops.rollout import start_rollout
        from app.platform_models import Artifact

        rollout = start_rollout(db.session, db.session.get(Artifact, "skill.summarize"))
        db.session.info.pop("_pending_tasks", None)  # the test drives the rollout by hand
        db.session.commit()
        rid, total = rollout.id, rollout.total
        assert run_rollout(rid, batch_size=2, max_batches=1) == "running"
    with seed_app.app_context():
        from app.platform_models import Rollout

        stopped = db.session.get(Rollout, rid)
        assert sum(stopped.counts.values()) == 2 and stopped.cursor_org
        # a second runner (duplicate delivery, resume of a live rollout) stops at once and changes nothing
        from sqlalchemy import text

        from app.ops.rollout import ROLLOUT_LOCK

        with db.engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:c, hashtext(:k))"), {"c": ROLLOUT_LOCK, "k": rid})
            assert run_rollout(rid, batch_size=50) == "busy"
            holder.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"), {"c": ROLLOUT_LOCK, "k": rid})
        db.session.expire_all()
        assert sum(db.session.get(Rollout, rid).counts.values()) == 2
    with seed_app.app_context():
        assert run_rollout(rid, batch_size=50) == "done"
    with seed_app.app_context():
        from sqlalchemy import func, select

        from app.platform_models import RolloutOutcome

        done = db.session.get(Rollout, rid)
        outcomes = db.session.scalar(select(func.count()).select_from(RolloutOutcome).where(
            RolloutOutcome.rollout_id == rid))
        assert sum(done.counts.values()) == outcomes == total


def test_the_next_batch_waits_for_its_predecessors_unlock(seed_app, seed_client, registry, monkeypatch):
    """rollstall: the chained message goes out when the previous batch commits, while that runner still
    holds the rollout's lock. A leased message of the current token that finds the lock taken waits for
    it (its predecessor lets go a few statements later) instead of answering `busy`, which dropped the
    rollout until the lease reaper. Held past the wait it is still `busy`, and changes nothing."""
    import threading
    import time
    from types import SimpleNamespace

    from sqlalchemy import text

    from app import tasks as app_tasks
    from app.db import db
    from app.ops import rollout as rollout_mod
    from app.platform_models import Artifact, Rollout

    seed(seed_client, domain())
    art = current(seed_client, "skill.summarize")
    with seed_app.app_context():
        rollout_mod.publish({"kind": "skill", "name": "summarize", "artifactVersion": art["artifactVersion"] + 1,
                             "definition": dict(art["definition"], title="Summarize rollstall")}, rollout=False)
        rollout = rollout_mod.start_rollout(db.session, db.session.get(Artifact, "skill.summarize"))
        db.session.info.pop("_pending_tasks", None)  # the test drives the rollout by hand
        db.session.commit()
        rid, token = rollout.id, rollout.dispatch_token or 0
    lock = {"c": rollout_mod.ROLLOUT_LOCK, "k": rid}

    monkeypatch.setattr(rollout_mod, "LOCK_WAIT_SECONDS", 0.3, raising=False)
    with seed_app.app_context(), db.engine.connect() as holder:  # a runner that does not let go
        holder.execute(text("SELECT pg_advisory_lock(:c, hashtext(:k))"), lock)
        assert rollout_mod.run_rollout(rid, batch_size=2, max_batches=1, token=token) == "busy"
        holder.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"), lock)
        holder.commit()
        db.session.expire_all()
        assert sum(db.session.get(Rollout, rid).counts.values()) == 0 and db.session.get(Rollout, rid).attempts == 0

    monkeypatch.setattr(rollout_mod, "LOCK_WAIT_SECONDS", 30.0, raising=False)
    tried = threading.Event()

    def sleep(seconds):  # job_lock's pause between two tries: the runner found the lock taken
        tried.set()
        time.sleep(seconds)

    monkeypatch.setattr(app_tasks, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    with seed_app.app_context(), db.engine.connect() as holder:  # the predecessor, letting go just after
        holder.execute(text("SELECT pg_advisory_lock(:c, hashtext(:k))"), lock)
        holder.commit()

        def unlock_once_tried():
            tried.wait(10)
            holder.execute(text("SELECT pg_advisory_unlock(:c, hashtext(:k))"), lock)
            holder.commit()

        releaser = threading.Thread(target=unlock_once_tried)
        releaser.start()
        try:
            status = rollout_mod.run_rollout(rid, batch_size=50, token=token)
        finally:
            tried.set()
            releaser.join(10)
        assert status == "done"
    with seed_app.app_context():
        done = db.session.get(Rollout, rid)
        assert done.status == "done" and sum(done.counts.values()) == done.total


def test_cli_publish_and_status(seed_app, seed_client, registry, tmp_path, eager):
    seed(seed_client, domain())
    art = current(seed_client, "skill.web-search")
    path = tmp_path / "web-search.json"
    path.write_text(json.dumps({"kind": "skill", "name": "web-search", "artifactVersion": art["artifactVersion"] + 1,
                                "definition": dict(art["definition"], title="Web search 2")}))
    runner = seed_app.test_cli_runner()
    out = runner.invoke(args=["artifacts", "publish", str(path)])
    assert out.exit_code == 0, out.output
    rollout_id = out.output.split("rollout ")[1].split()[0]
    status = runner.invoke(args=["artifacts", "status", rollout_id])
    assert status.exit_code == 0 and "done" in status.output and "updated" in status.output
    listing = runner.invoke(args=["artifacts", "status"])
    assert rollout_id in listing.output
    again = runner.invoke(args=["artifacts", "publish", str(path)])
    assert again.exit_code != 0 and "version" in again.output
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert runner.invoke(args=["artifacts", "publish", str(bad)]).exit_code != 0
    assert "skill.web-search" in runner.invoke(args=["artifacts", "list"]).output


def test_rollout_on_a_real_worker(celery_worker, seed_app, registry):
    """With Redis, publishing queues seed.rollout; the worker walks the orgs in batches."""
    from app.db import db
    from app.ops.rollout import publish
    from app.platform_models import Rollout
    from tests.conftest import wait_for

    client = seed_app.test_client()
    orgs = [domain() for _ in range(3)]
    for d in orgs:
        seed(client, d)
    art = current(client, "agent.researcher")
    new = dict(art["definition"], title=f"Researcher {uuid.uuid4().hex[:6]}")
    with seed_app.app_context():
        _, rollout = publish({"kind": "agent", "name": "researcher", "artifactVersion": art["artifactVersion"] + 1,
                              "definition": new})
        rid = rollout.id

    def finished():
        with seed_app.app_context():
            r = db.session.get(Rollout, rid)
            return r.status == "done" and r

    done = wait_for(finished, timeout=120)
    assert done.counts["updated"] >= 3
    # rollstall: every batch was run by the message its predecessor chained, none dropped as `busy` and
    # recovered by the lease reaper (which re-sends under the same token): one message per token, in order
    line = re.compile(rf"Task seed\.rollout\[{re.escape(rid)}~(\d+)~\w+\] succeeded in \S+: '(\w+)'")

    def answers():
        with open(celery_worker.log_path) as f:
            got = [(int(m[1]), m[2]) for m in line.finditer(f.read())]
        return any(a == "done" for _, a in got) and got

    got = wait_for(answers, timeout=30, what="the rollout's task log")
    assert sorted(t for t, _ in got) == list(range(len(got))), got  # log lines in the order the tasks ended
    assert {a for _, a in got} <= {"running", "done"}, got
    got = client.get("/api/v1/agents/by-name?name=researcher", headers=org_admin(orgs[0])).get_json()["agent"]
    assert got["title"] == new["title"]


def test_one_org_failing_does_not_stop_the_rollout(seed_app, seed_client, registry, monkeypatch):
    from app.db import db
    from app.ops import rollout as registry_mod
    from app.platform_models import Artifact, Rollout, RolloutOutcome

    bad, good = domain(), domain()
    seed(seed_client, bad)
    seed(seed_client, good)
    real = registry_mod.REPLACERS["skill"]

    def flaky(session, tenant, artifact, row):
        if row.org_id == bad:
            raise RuntimeError("disk on fire")
        return real(session, tenant, artifact, row)

    monkeypatch.setitem(registry_mod.REPLACERS, "skill", flaky)
    art = current(seed_client, "skill.email-drafting")
    with seed_app.app_context():
        registry_mod.publish({"kind": "skill", "name": "email-drafting",
                              "artifactVersion": art["artifactVersion"] + 1,
                              "definition": dict(art["definition"], title="Drafting 2")}, rollout=False)
        rollout = registry_mod.start_rollout(db.session, db.session.get(Artifact, "skill.email-drafting"))
        db.session.info.pop("_pending_tasks", None)
        db.session.commit()
        rid = rollout.id
        assert registry_mod.run_rollout(rid) == "done"
    with seed_app.app_context():
        outcomes = {o.org_id: o for o in db.session.query(RolloutOutcome).filter_by(rollout_id=rid)}
        assert outcomes[bad].outcome == "failed" and "disk on fire" in outcomes[bad].detail
        assert outcomes[good].outcome == "updated"
        assert db.session.get(Rollout, rid).counts["failed"] >= 1
    # the failed org still has its old copy, unchanged and not marked forked
    report = seed(seed_client, bad)
    line = next(a for a in report["artifacts"] if a["id"] == "skill.email-drafting")
    assert line["artifactVersion"] == art["artifactVersion"] and "forkedFromVersion" not in line
