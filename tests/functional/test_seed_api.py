"""POST /internal/seed: access, validation, the 15 artifacts usable at once, idempotency, products."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from tests.conftest import ROOT
from tests.functional.conftest import INTERNAL
from tests.support import assert_error, bearer, token

SEED = "/internal/seed"


def body(domain: str, product: str = "default", email: str = "admin@example.com") -> dict:
    return {"org": {"title": "Acme Inc", "mainDomain": domain, "product": product},
            "admin": {"email": email, "firstName": "Ada", "lastName": "Admin"}}


def domain() -> str:
    return f"acme-{uuid.uuid4().hex[:10]}.example.com"


HDR = {"X-Internal-Token": INTERNAL}


def test_seed_creates_org_admin_and_15_usable_artifacts(seed_client):
    d = domain()
    resp = seed_client.post(SEED, json=body(d), headers=HDR)
    assert resp.status_code == 201, resp.get_json()
    report = resp.get_json()
    assert report["orgId"] == d and report["created"] is True
    assert report["admin"]["email"] == "admin@example.com" and report["admin"]["role"] == "admin"
    arts = report["artifacts"]
    assert len(arts) == 15 and all(a["status"] == "created" and a["artifactVersion"] == 1 for a in arts)
    kinds = sorted({a["kind"] for a in arts})
    assert kinds == ["agent", "database", "entity", "skill", "storage"]

    # the admin uses them through the API at once
    admin = bearer(token(org=d, user=report["admin"]["id"], role="admin", scopes=["read", "write"]))
    defs = seed_client.get("/api/v1/entities/definitions", headers=admin).get_json()["definitions"]
    assert {x["name"] for x in defs} == {"contacts", "companies", "deals", "tasks", "notes"}
    assert all(x["artifactVersion"] == 1 and x["defaultViewId"] for x in defs)
    views = seed_client.get("/api/v1/entities/definitions/deals/views", headers=admin)
    assert views.status_code == 200
    rec = seed_client.post("/api/v1/entities/deals/records", headers=admin,
                           json={"name": "Big one", "fields": {"stage": "new", "amount": 10}})
    assert rec.status_code == 201, rec.get_json()
    agents = seed_client.get("/api/v1/agents", headers=admin).get_json()["agents"]
    assert {a["name"] for a in agents} == {"assistant", "support", "sales", "researcher"}
    assistant = next(a for a in agents if a["name"] == "assistant")
    assert assistant["isDefault"] is True and assistant["artifactVersion"] == 1
    assert [s["skillName"] for s in assistant["skills"]] == ["summarize", "web-search"]
    assert assistant["skills"][1]["tools"][0]["toolId"] == "system.web_search"
    skills = seed_client.get("/api/v1/skills", headers=admin).get_json()["skills"]
    assert len(skills) == 4
    storage = next(a for a in arts if a["kind"] == "storage")
    blob = seed_client.get(f"/blobs/{storage['objectId']}README.txt")
    assert blob.status_code == 200 and d.encode() in blob.data


def test_second_call_creates_nothing_and_says_so(seed_client):
    d = domain()
    first = seed_client.post(SEED, json=body(d), headers=HDR).get_json()
    again = seed_client.post(SEED, json=body(d), headers=HDR)
    assert again.status_code == 200
    report = again.get_json()
    assert report["created"] is False and report["admin"]["created"] is False
    assert report["summary"] == {"total": 15, "created": 0, "existing": 15, "conflict": 0}
    assert [(a["id"], a["objectId"]) for a in report["artifacts"]] == [
        (a["id"], a["objectId"]) for a in first["artifacts"]]


def test_another_product_provisions_that_product(seed_client):
    d = domain()
    seed_client.post(SEED, json=body(d), headers=HDR)
    resp = seed_client.post(SEED, json=body(d, product="other"), headers=HDR)
    assert resp.status_code == 201
    report = resp.get_json()
    assert report["product"] == "other" and report["summary"]["created"] == 15
    other = bearer(token(org=d, role="admin", product="other"))
    assert len(seed_client.get("/api/v1/agents", headers=other).get_json()["agents"]) == 4


def test_new_product_is_created_and_migrated(seed_client):
    product = f"p{uuid.uuid4().hex[:8]}"
    d = domain()
    resp = seed_client.post(SEED, json=body(d, product=product), headers=HDR)
    assert resp.status_code == 201, resp.get_json()
    agents = seed_client.get("/api/v1/agents", headers=bearer(token(org=d, role="admin", product=product)))
    assert agents.status_code == 200 and len(agents.get_json()["agents"]) == 4


@pytest.mark.parametrize("headers,status", [
    ({}, 401),
    ({"X-Internal-Token": "wrong"}, 401),
    ({"X-Internal-Token": ""}, 401),
])
def test_internal_token_required(seed_client, headers, status):
    resp = seed_client.post(SEED, json=body(domain()), headers=headers)
    assert resp.status_code == status
    assert resp.get_json()["error"]["code"] == "UNAUTHORIZED"


def test_bad_body_is_checked_only_after_auth(seed_client):
    resp = seed_client.post(SEED, json={"org": 1})
    assert resp.status_code == 401


def test_roles(seed_client, make_token):
    user = bearer(make_token(scopes=["*"]))
    assert seed_client.post(SEED, json=body(domain()), headers=user).status_code == 403
    for role in ("admin", "super_admin"):
        resp = seed_client.post(SEED, json=body(domain()), headers=bearer(make_token(role=role)))
        assert resp.status_code == 201, resp.get_json()
    forged = bearer(token(org="x", role="super_admin", secret="another-secret-" + "z" * 40))
    assert seed_client.post(SEED, json=body(domain()), headers=forged).status_code == 401


def test_internal_routes_authenticate_like_every_route(seed_client, make_token):
    """/internal goes through the one authentication (app.auth): credentials are checked before any
    other rule (a NUL in the path is 400 only for a caller who may call the route, as on /api/v1), and
    who may call is unchanged: the internal token, or the role admin/super_admin itself."""
    status = f"{SEED}/a%00b"
    assert_error(seed_client.get(status), 401, "UNAUTHORIZED")
    assert_error(seed_client.get(status, headers={"X-Internal-Token": "wrong"}), 401, "UNAUTHORIZED")
    assert_error(seed_client.get(status, headers=bearer(make_token(scopes=["*"]))), 403, "FORBIDDEN")
    assert_error(seed_client.get(status, headers=HDR), 400, "VALIDATION_ERROR")
    assert_error(seed_client.get(status, headers=bearer(make_token(role="admin"))), 400, "VALIDATION_ERROR")
    # the token's product selects nothing here: an admin of a product not provisioned yet may seed it
    d = domain()
    nowhere = bearer(make_token(role="super_admin", product="not-provisioned-yet"))
    resp = seed_client.post(SEED, json=body(d), headers=nowhere)
    assert resp.status_code == 201, resp.get_json()
    resp = seed_client.get(f"{SEED}/{d}", headers=nowhere)
    assert resp.status_code == 200 and resp.get_json()["summary"]["missing"] == 0, resp.get_json()
    # the internal token is a credential on /internal only
    assert_error(seed_client.get("/api/v1/me", headers=HDR), 401, "UNAUTHORIZED")


def test_header_path_closed_without_configured_token(client):
    resp = client.post(SEED, json=body(domain()), headers={"X-Internal-Token": ""})
    assert resp.status_code == 401
    resp = client.post(SEED, json=body(domain()), headers={"X-Internal-Token": "anything"})
    assert resp.status_code == 401


@pytest.mark.parametrize("payload,field", [
    ({"admin": body("a.com")["admin"]}, "org"),
    ({"org": body("a.com")["org"]}, "admin"),
    ({**body("a.com"), "org": {**body("a.com")["org"], "mainDomain": "not a domain"}}, "mainDomain"),
    ({**body("a.com"), "org": {**body("a.com")["org"], "product": "Bad Product!"}}, "product"),
    ({**body("a.com"), "org": {**body("a.com")["org"], "title": ""}}, "title"),
    ({**body("a.com"), "admin": {**body("a.com")["admin"], "email": "nope"}}, "email"),
    ({**body("a.com"), "admin": {"email": "a@b.com"}}, "firstName"),
    ({**body("a.com"), "extra": 1}, "extra"),
])
def test_bad_bodies_name_the_field(seed_client, payload, field):
    resp = seed_client.post(SEED, json=payload, headers=HDR)
    assert resp.status_code == 400
    err = resp.get_json()["error"]
    assert err["code"] == "VALIDATION_ERROR" and field in json.dumps(err["details"])


def test_non_json_body(seed_client):
    resp = seed_client.post(SEED, data="[1,", headers={**HDR, "Content-Type": "application/json"})
    assert resp.status_code == 400
    resp = seed_client.post(SEED, json=[1, 2], headers=HDR)
    assert resp.status_code == 400


def test_flask_seed_org_cli(seed_app):
    d = domain()
    runner = seed_app.test_cli_runner()
    args = ["seed", "org", "--title", "Cli Org", "--domain", d, "--admin-email", "ops@example.com",
            "--first-name", "Op", "--last-name", "Erator"]
    out = runner.invoke(args=args)
    assert out.exit_code == 0, out.output
    assert "15 created" in out.output and "agent.assistant" in out.output
    again = runner.invoke(args=args)
    assert "0 created, 15 existing" in again.output
    bad = runner.invoke(args=[*args[:5], "bad domain", *args[6:]])
    assert bad.exit_code != 0 and "mainDomain" in bad.output


def test_celery_cli_call_with_a_real_worker(celery_worker, database_url, redis_url, seed_app):
    """`celery -A workers call seed.org --kwargs '{...}'` is picked up by a worker on the seed queue."""
    from app.platform_models import Organization, OrgArtifact
    from tests.conftest import BIN, CELERY_KEY_PREFIX, TEST_SECRET, TEST_VAR_DIR, wait_for

    d = domain()
    env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, CELERY_KEY_PREFIX=CELERY_KEY_PREFIX, LOG_LEVEL="WARNING")
    kwargs = json.dumps({"org": body(d)["org"], "admin": body(d)["admin"]})
    out = subprocess.run([os.path.join(BIN, "celery"), "-A", "workers", "call", "seed.org", "--kwargs", kwargs],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    from sqlalchemy import func, select

    from app.db import db

    def provisioned():
        with seed_app.app_context():
            return db.session.scalar(select(func.count()).select_from(OrgArtifact).where(
                OrgArtifact.org_id == d)) == 15 and db.session.get(Organization, d) is not None

    wait_for(provisioned, timeout=60)


def test_respond_async_runs_on_a_worker_started_as_operators_start_it(celery_worker, redis_url, seed_client):
    """`Prefer: respond-async` with a broker: 202, then the seed.org task runs on a real worker started
    with the `celery` console script (its lazy `migrations` import failed there before the project was
    an installed package) and the status shows all 15 artifacts."""
    from tests.conftest import wait_for

    d = domain()
    resp = seed_client.post(SEED, json=body(d), headers={**HDR, "Prefer": "respond-async"})
    assert resp.status_code == 202, resp.get_json()
    status_url = resp.get_json()["statusUrl"]

    def seeded():
        status = seed_client.get(status_url, headers=HDR)
        return status.status_code == 200 and status.get_json()["summary"].get("existing") == 15

    wait_for(seeded, timeout=60)


def test_respond_async_queues_seed_org_and_status_shows_the_result(seed_client):
    """`Prefer: respond-async` → 202 with the queued seed.org task; GET /internal/seed/{orgId} shows
    what the org holds (inline here: without a broker the task runs at once)."""
    from app.extensions import celery_app

    d = domain()
    status_url = f"/internal/seed/{d}?product=default"
    assert seed_client.get(status_url, headers=HDR).status_code == 404
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        resp = seed_client.post(SEED, json=body(d), headers={**HDR, "Prefer": "respond-async"})
    finally:
        celery_app.conf.task_always_eager = eager
    assert resp.status_code == 202, resp.get_json()
    queued = resp.get_json()
    assert queued["orgId"] == d and queued["statusUrl"] == status_url and queued["taskId"]
    assert queued == {"taskId": queued["taskId"], "orgId": d, "product": "default", "status": "queued",
                      "statusUrl": status_url}
    assert (resp.headers["Location"], resp.headers["Preference-Applied"]) == (status_url, "respond-async")
    status = seed_client.get(status_url, headers=HDR)
    assert status.status_code == 200
    assert status.get_json()["summary"] == {"total": 15, "existing": 15, "missing": 0}
    other = seed_client.get(f"/internal/seed/{d}?product=other", headers=HDR).get_json()
    assert other["summary"]["missing"] == 15
    assert seed_client.get(status_url).status_code == 401
    assert seed_client.get(f"/internal/seed/{d}?product=Bad!", headers=HDR).status_code == 400
    assert seed_client.get("/internal/seed/a%00b", headers=HDR).status_code == 400
