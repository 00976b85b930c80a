"""Foundation through HTTP: auth, scopes, tenancy headers, envelope, health, request ids."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid

import jwt
import pytest

from app.auth import PUBLIC_PREFIXES
from tests.support import AUDIENCE, ISSUER, TEST_SECRET, assert_error, bearer, token


def _claims(org="org-x", **over):
    now = int(time.time())
    claims = {"org_id": org, "user_id": "u1", "scopes": ["read"], "iat": now, "exp": now + 300,
              "iss": ISSUER, "aud": AUDIENCE}
    claims.update(over)
    return {k: v for k, v in claims.items() if v is not None}


def _b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


NEGATIVE_TOKENS = {
    "alg_none": lambda: f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(_claims())}.",
    "hs512": lambda: jwt.encode(_claims(), TEST_SECRET, algorithm="HS512"),
    "wrong_key": lambda: jwt.encode(_claims(), "another-secret-" + "y" * 40, algorithm="HS256"),
    "expired": lambda: jwt.encode(_claims(iat=int(time.time()) - 1000, exp=int(time.time()) - 500),
                                  TEST_SECRET, algorithm="HS256"),
    "future_iat": lambda: jwt.encode(_claims(iat=int(time.time()) + 3600, exp=int(time.time()) + 7200),
                                     TEST_SECRET, algorithm="HS256"),
    "missing_exp": lambda: jwt.encode(_claims(exp=None), TEST_SECRET, algorithm="HS256"),
    "missing_iat": lambda: jwt.encode(_claims(iat=None), TEST_SECRET, algorithm="HS256"),
    "missing_aud": lambda: jwt.encode(_claims(aud=None), TEST_SECRET, algorithm="HS256"),
    "missing_iss": lambda: jwt.encode(_claims(iss=None), TEST_SECRET, algorithm="HS256"),
    "wrong_aud": lambda: jwt.encode(_claims(aud="someone-else"), TEST_SECRET, algorithm="HS256"),
    "wrong_iss": lambda: jwt.encode(_claims(iss="evil"), TEST_SECRET, algorithm="HS256"),
    "garbage": lambda: "not.a.jwt",
    "missing_org": lambda: jwt.encode(_claims(org_id=None), TEST_SECRET, algorithm="HS256"),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE_TOKENS))
def test_negative_tokens_are_401(client, case):
    resp = client.get("/api/v1/me", headers=bearer(NEGATIVE_TOKENS[case]()))
    assert_error(resp, 401, "UNAUTHORIZED")


@pytest.mark.parametrize("header", ["", "Bearer", "Basic abc", "Bearer a b", "Bearer a,b",
                                    "Bearer " + "x" * 9000])
def test_malformed_authorization_headers_are_401(client, header):
    headers = {"Authorization": header} if header else {}
    assert_error(client.get("/api/v1/me", headers=headers), 401, "UNAUTHORIZED")


def test_me_returns_verified_identity(client, org_id):
    tok = token(org=org_id, scopes=["read:agents", "write"], role="member", email="a@b.c")
    resp = client.get("/api/v1/me", headers=bearer(tok))
    assert resp.status_code == 200
    assert resp.get_json() == {"orgId": org_id, "userId": "user-1", "email": "a@b.c", "role": "member",
                               "scopes": ["read:agents", "write"], "product": "default"}


def test_spoofed_identity_headers_are_overwritten(client, org_id):
    headers = bearer(token(org=org_id, email="me@x.io")) | {
        "X-Org-ID": "victim-org", "X-User-ID": "root", "X-User-Email": "ceo@victim", "X-Product": "other"}
    resp = client.get("/api/v1/_test/headers", headers=headers)
    assert resp.get_json() == {"X-Org-ID": org_id, "X-User-ID": "user-1", "X-User-Email": "me@x.io",
                               "X-Product": "default"}
    assert client.get("/api/v1/me", headers=headers).get_json()["orgId"] == org_id


def test_product_claim_selects_product_and_unknown_is_403(client, org_id):
    ok = client.get("/api/v1/me", headers=bearer(token(org=org_id, product="other")))
    assert ok.get_json()["product"] == "other"
    assert_error(client.get("/api/v1/me", headers=bearer(token(org=org_id, product="nope"))),
                    403, "FORBIDDEN")
    assert_error(client.get("/api/v1/me", headers=bearer(token(org=org_id, product="../x"))),
                    403, "FORBIDDEN")


@pytest.mark.parametrize("scopes,role,status", [
    ([], None, 403),
    (["write:agents"], None, 403),
    (["read:entities", "read:agents"], None, 200),   # any-of
    (["read"], None, 200),                           # generic satisfies specific
    (["write"], None, 403),                          # generic of another kind does not
    (["*"], None, 200),
    ([], "admin", 200),
    ([], "super_admin", 200),
    ([], "member", 403),
])
def test_scope_matrix(client, org_id, scopes, role, status):
    resp = client.get("/api/v1/_test/scoped", headers=bearer(token(org=org_id, scopes=scopes, role=role)))
    assert resp.status_code == status
    if status == 403:
        assert_error(resp, 403, "FORBIDDEN")


@pytest.mark.parametrize("scopes,role,status", [
    (["read", "write", "admin"], None, 403), (["*"], None, 200), ([], "admin", 200), ([], "user", 403)])
def test_admin_route_requires_role(client, org_id, scopes, role, status):
    resp = client.get("/api/v1/_test/admin", headers=bearer(token(org=org_id, scopes=scopes, role=role)))
    assert resp.status_code == status


def test_envelope_for_unknown_route_and_wrong_method(client, org_id):
    assert_error(client.get("/api/v1/does-not-exist"), 404, "NOT_FOUND")
    assert_error(client.get("/nowhere"), 404, "NOT_FOUND")
    resp = client.delete("/api/v1/me", headers=bearer(token(org=org_id)))
    assert_error(resp, 405, "INVALID_INPUT")
    assert "GET" in resp.headers["Allow"]


def test_oversized_body_is_413(client, app, org_id):
    limit = app.config["MAX_CONTENT_LENGTH"]
    resp = client.post("/api/v1/_test/echo", data=b"x" * (limit + 1),
                       headers=bearer(token(org=org_id)) | {"Content-Type": "application/octet-stream"})
    assert_error(resp, 413, "PAYLOAD_TOO_LARGE")


def test_unexpected_exception_is_500_without_trace(client, org_id):
    resp = client.get("/api/v1/_test/boom", headers=bearer(token(org=org_id)))
    body = assert_error(resp, 500, "SYSTEM_ERROR")
    text = resp.get_data(as_text=True)
    assert "secret internal detail" not in text and "Traceback" not in text
    assert body["error"]["details"]["requestId"] == resp.headers["X-Request-ID"]


def test_request_id_echoed_when_sane_and_replaced_otherwise(client):
    assert client.get("/health", headers={"X-Request-ID": "abc-123"}).headers["X-Request-ID"] == "abc-123"
    replaced = client.get("/health", headers={"X-Request-ID": "bad id <script>"}).headers["X-Request-ID"]
    assert replaced and replaced != "bad id <script>" and len(replaced) == 32
    # a random version-4 UUID in hex, as uuid.uuid4().hex gives, and a new one per request
    ids = {client.get("/health").headers["X-Request-ID"] for _ in range(20)}
    assert len(ids) == 20
    assert all(uuid.UUID(hex=i).hex == i and uuid.UUID(hex=i).version == 4 for i in ids | {replaced})


def test_cors_answers_the_configured_origins_of_each_app(make_app, org_id):
    """CORS_ORIGINS is read per app: two apps with different settings in one process each answer
    their own origins; `*` allows any; empty turns CORS off."""
    headers = bearer(token(org=org_id))
    one = make_app(CORS_ORIGINS=" https://a.example , https://b.example").test_client()
    other = make_app(CORS_ORIGINS="https://c.example").test_client()
    anyone = make_app(CORS_ORIGINS="*").test_client()
    off = make_app(CORS_ORIGINS="").test_client()
    for client, origin, allowed in ((one, "https://a.example", True), (one, "https://b.example", True),
                                    (one, "https://c.example", False), (other, "https://c.example", True),
                                    (other, "https://a.example", False), (anyone, "https://z.example", True),
                                    (off, "https://a.example", False)):
        resp = client.get("/api/v1/me", headers=headers | {"Origin": origin})
        assert resp.status_code == 200
        if allowed:
            assert resp.headers["Access-Control-Allow-Origin"] == origin and resp.headers["Vary"] == "Origin"
            assert resp.headers["Access-Control-Allow-Headers"] == ("Authorization, Content-Type, X-Request-ID, "
                                                                    "Idempotency-Key, If-Match, If-None-Match")
            assert resp.headers["Access-Control-Expose-Headers"] == "ETag, Idempotent-Replayed, Location, Retry-After"
        else:
            assert "Access-Control-Allow-Origin" not in resp.headers and "Vary" not in resp.headers
    assert "Access-Control-Allow-Origin" not in one.get("/api/v1/me", headers=headers).headers  # no Origin


def test_me_answers_the_identity_of_the_token(client, org_id):
    """/api/v1/me is dumped through IdentitySchema (returned as is when already in wire form)."""
    body = client.get("/api/v1/me", headers=bearer(token(org=org_id, scopes=("read", "write:agents"),
                                                             email="ada@example.com"))).get_json()
    assert body == {"orgId": org_id, "userId": body["userId"], "email": "ada@example.com", "role": None,
                    "scopes": ["read", "write:agents"], "product": "default"}


def test_health_reports_checks(client):
    resp = client.get("/health")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["blobStorage"]["status"] == "ok"


def test_health_is_503_when_database_is_down(make_app):
    broken = make_app(DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/nothing", DB_POOL_TIMEOUT=1)
    resp = broken.test_client().get("/health")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["status"] == "degraded" and body["checks"]["database"]["status"] == "fail"


def test_openapi_document_and_docs_page(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert "/api/v1/me" in doc["paths"]
    assert client.get("/api/v1/docs").status_code == 200


# Routes of the app that are deliberately not in the OpenAPI document, each with its reason.
UNDOCUMENTED_ROUTES = {
    "/static/<path:filename>": "Flask's default static folder: no API files are served from it",
    "/api/v1/openapi.json": "the OpenAPI document itself",
    "/api/v1/docs": "the Swagger UI page (for people) that renders the document",
    "/api/v1/docs/assets/<path:filename>": "the Swagger UI's scripts and styles",
    "/blobs/<container>/<path:key>": "the public file URLs of the local blob store (where generated images "
                                     "are served in development); a bucket serves them in production",
    "/console": "the operator console (HTML for a browser), not the API",
    "/console/": "the operator console (HTML for a browser), not the API",
    "/console/analytics": "the operator console (HTML for a browser), not the API",
    "/console/assets/<path:name>": "the operator console's scripts and styles (content-hashed names)",
    "/console/session": "the console's own cookie session (sign in/out), used only by its page",
    "/console/token": "the console's own token refresh, used only by its page",
    "/metrics": "Prometheus metrics in the text exposition format, for the scraper (internal token only)",
}
TEST_ONLY_PREFIX = "/api/v1/_test/"  # tests.support.register_test_routes: exist only in the test app


def test_every_route_is_in_the_openapi_document_unless_deliberately_left_out(app, client):
    """app.url_map and the document's paths agree: every method of every route is documented, except the
    routes listed above with their reason, and the document names no route the app does not have."""
    doc = client.get("/api/v1/openapi.json").get_json()
    documented = {(path, method) for path, operations in doc["paths"].items()
                  for method in operations if method != "parameters"}
    served, missing = set(), []
    for rule in app.url_map.iter_rules():
        if rule.rule in UNDOCUMENTED_ROUTES or rule.rule.startswith(TEST_ONLY_PREFIX):
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            served.add((path, method.lower()))
            if (path, method.lower()) not in documented:
                missing.append(f"{method} {rule.rule}")
    assert missing == []
    assert sorted(documented - served) == []
    assert {rule.rule for rule in app.url_map.iter_rules()} >= set(UNDOCUMENTED_ROUTES)  # no stale exclusion


def test_health_is_documented_without_a_token(client):
    operation = client.get("/api/v1/openapi.json").get_json()["paths"]["/health"]["get"]
    assert operation["security"] == []
    assert {"200", "503"} <= set(operation["responses"]) and "401" not in operation["responses"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema


def test_every_operation_documents_its_access_rules(app, client):
    """Who may call an operation is documented where it is enforced (app.extensions.Blueprint)."""
    doc = client.get("/api/v1/openapi.json").get_json()
    seen = 0
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":
                continue
            seen += 1
            public = path.startswith(PUBLIC_PREFIXES) or path == "/health"  # no token is read: never a 401
            assert ("401" in operation["responses"]) is not public, (method, path)
            if path.startswith("/internal/"):  # the internal token or an admin bearer token (app.auth.require)
                assert operation["security"] == [{"internalToken": []}, {"bearerAuth": []}], (method, path)
                assert "403" in operation["responses"], (method, path)
                continue
            # unsubscribe: a signed link is the credential; /health: cluster-internal, no token
            assert operation["security"] == ([] if public else [{"bearerAuth": []}]), (method, path)
            rule = next(r for r in app.url_map.iter_rules()
                        if re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", r.rule) == path and method.upper() in r.methods)
            view = app.view_functions[rule.endpoint]
            handler = getattr(getattr(view, "view_class", None), method, view)
            declared = getattr(handler, "_required_scopes", None) or getattr(handler, "_required_roles", None)
            assert ("403" in operation["responses"]) == bool(declared), (method, path)
    assert seen > 50


def test_every_internal_route_keeps_the_internal_rule(app):
    """/internal is no longer guarded by a blueprint hook of its own: each route carries the rule
    (app.auth.require). Every method of every /internal route, documented or not, accepts the internal
    token or the role admin/super_admin itself (scope `*` does not stand in for it), nothing less: a
    route that forgot it would take any valid token of any product (the product check is skipped there)."""
    seen = 0
    for rule in app.url_map.iter_rules():
        if not (rule.rule == "/internal" or rule.rule.startswith("/internal/")):
            continue
        view = app.view_functions[rule.endpoint]
        for method in sorted(rule.methods - {"OPTIONS", "HEAD"}):
            handler = getattr(getattr(view, "view_class", None), method.lower(), view)
            seen += 1
            assert getattr(handler, "_internal_token", False), (rule.rule, method)
            assert set(getattr(handler, "_required_roles", None) or ()) <= {"admin", "super_admin"}, (rule.rule, method)
            assert getattr(handler, "_required_roles", None), (rule.rule, method)
            assert getattr(handler, "_star_bypasses", True) is False, (rule.rule, method)
    assert seen >= 2
