"""Test helpers shared by all test modules."""

from __future__ import annotations

from flask import Flask
from marshmallow import Schema, ValidationError

from app.auth import mint_token
from app.extensions import Blueprint, celery_app
from app.fields import FastLoad

TEST_SECRET = "test-secret-" + "x" * 40
ISSUER, AUDIENCE = "platform-gateway", "platform-api"


def token(*, org: str, scopes=("read", "write"), user: str = "user-1", role=None, product=None,
          email: str | None = "user@example.com", ttl: int = 600, secret: str = TEST_SECRET, **_ignored) -> str:
    return mint_token(secret=secret, issuer=ISSUER, audience=AUDIENCE, org=org, user=user,
                      scopes=scopes, role=role, product=product, email=email, ttl=ttl)


def bearer(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


@celery_app.task(name="tests.which_app", ignore_result=False)
def which_app() -> str:
    """Test-only task: which app's context does a task run in?"""
    from flask import current_app

    return current_app.config["PUBLIC_BASE_URL"]


SESSION_READS: list[int] = []


@celery_app.task(name="tests.read_session", ignore_result=True)
def read_session(value: int) -> None:
    """Test-only task: reads through its context's session (db.session), notes `value` in SESSION_READS."""
    from sqlalchemy import text

    from app.db import db

    SESSION_READS.append(db.session.execute(text("SELECT CAST(:v AS integer)"), {"v": value}).scalar_one())


@celery_app.task(name="tests.send_read_session", ignore_result=True)
def send_read_session(value: int) -> None:
    """Test-only task: sends `read_session(value)` once its own unit of work (db.session) commits."""
    from sqlalchemy import text

    from app.db import db
    from app.tasks import enqueue_after_commit

    db.session.execute(text("SELECT 1"))
    enqueue_after_commit(db.session, read_session, value)


def register_test_routes(app: Flask) -> None:
    """Routes that exist only in tests: a scope-guarded one, an admin one, a crashing one."""

    @Blueprint.requires("read:agents")
    def scoped():
        return {"ok": True}

    @Blueprint.requires(roles=("admin", "super_admin"))
    def admin_only():
        return {"ok": True}

    def boom():
        raise RuntimeError("secret internal detail")

    app.add_url_rule("/api/v1/_test/scoped", "test_scoped", scoped)
    app.add_url_rule("/api/v1/_test/admin", "test_admin", admin_only)
    app.add_url_rule("/api/v1/_test/boom", "test_boom", boom)
    app.add_url_rule("/api/v1/_test/echo", "test_echo", _echo, methods=["POST"])
    app.add_url_rule("/api/v1/_test/headers", "test_headers", _headers)
    app.add_url_rule("/api/v1/_test/cast", "test_bad_cast", _bad_cast)


def _bad_cast():
    from sqlalchemy import text

    from app.db import db

    db.session.execute(text("SELECT '2026-02-30T00:00:00Z'::timestamptz"))
    return {"unreachable": True}


def _headers():
    from flask import request

    return {k: request.headers.get(k) for k in ("X-Org-ID", "X-User-ID", "X-User-Email", "X-Product")}


def _echo():
    from flask import request

    return {"size": len(request.get_data())}


def assert_error(resp, status: int, code: str = "VALIDATION_ERROR") -> dict:
    """The one check of an error answer: its status and code, a message, and the envelope's metadata
    (`{success: false, timestamp: <int>}`, nothing else). Returns the whole body."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["metadata"] == {"success": False, "timestamp": body["metadata"]["timestamp"]}
    assert isinstance(body["metadata"]["timestamp"], int)
    return body


def marshmallow_load(schema: Schema, body):
    """`schema`'s load by marshmallow alone, nested schemas included (every FastLoad lane is off for the
    call: a Nested field loads through its schema's `load`), or "refused": the reference the fast lanes
    are compared with."""
    lane_load = FastLoad.load
    FastLoad.load = Schema.load
    try:
        return Schema.load(schema, body)
    except ValidationError:
        return "refused"
    finally:
        FastLoad.load = lane_load
