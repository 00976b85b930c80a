"""Hostile input on the operations and bulk email routes: NUL characters, bad ids, bad tokens → 4xx."""

from __future__ import annotations

import pytest

from tests.support import assert_error, bearer, token

NUL = "a\x00b"


@pytest.mark.parametrize("method,path,body,status", [
    ("post", "/api/v1/email/bulk-send", {"recipients": ["a@example.com"], "subject": NUL, "body": "x"}, 400),
    ("post", "/api/v1/email/bulk-send", {"messages": [{"to": "a@example.com", "subject": "s", "body": NUL}]}, 400),
    ("post", "/api/v1/newsletter/subscribers", {"email": "z@example.com", "name": NUL}, 400),
    ("post", "/api/v1/newsletter/issues", {"subject": "s", "body": NUL}, 400),
    ("delete", "/api/v1/newsletter/subscribers/a%00b", None, 400),
    ("get", "/api/v1/email/bulk-send/a%00b", None, 400),
    ("get", "/api/v1/email/bulk-send/a%00b/recipients", None, 400),
    ("post", "/api/v1/newsletter/unsubscribe?token=%00.%00", None, 400),
    ("get", "/api/v1/newsletter/unsubscribe?token=" + "x" * 3000, None, 400),
    ("post", "/api/v1/newsletter/unsubscribe?token=eyJ4Ijox.fake", None, 401),
])
def test_email_routes(client, auth, method, path, body, status):
    resp = getattr(client, method)(path, json=body, headers=auth("write:notifications"))
    assert resp.status_code == status, resp.get_json()


@pytest.mark.parametrize("method,path,body,status", [
    ("post", "/api/v1/admin/artifacts", {"kind": "skill", "name": "summarize", "artifactVersion": 999,
                                         "definition": {"name": "summarize", "title": NUL, "category": "c"}}, 400),
    ("post", "/api/v1/admin/artifacts", [1, 2], 400),
    ("get", "/api/v1/admin/artifacts/rollouts/a%00b", None, 400),
    ("get", "/api/v1/admin/artifacts/rollouts/nope?after=%00", None, 400),
    ("get", "/api/v1/admin/artifacts/rollouts/nope?limit=0", None, 400),
    ("post", "/api/v1/admin/artifacts/rollouts/nope/resume", None, 404),
    ("post", "/internal/seed", {"org": {"title": NUL, "mainDomain": "z.com", "product": "default"},
                                "admin": {"email": "a@b.com", "firstName": "x", "lastName": "y"}}, 400),
])
def test_admin_routes(client, method, path, body, status):
    headers = bearer(token(org="platform-ops", role="super_admin"))
    resp = getattr(client, method)(path, json=body, headers=headers)
    assert resp.status_code == status, resp.get_json()


@pytest.mark.parametrize("method,path", [
    ("get", "/api/v1/agents/a%00b"),
    ("put", "/api/v1/widgets/a%00b"),
    ("get", "/api/v1/entities/definitions/a%00b"),
    ("delete", "/api/v1/newsletter/subscribers/a%00b"),
    ("get", "/api/v1/email/bulk-send/a%00b/recipients"),
    ("get", "/api/v1/admin/artifacts/rollouts/a%00b"),
    ("get", "/internal/seed/a%00b"),
    ("get", "/api/v1/no-such-route/%00"),
])
def test_nul_in_any_path_is_one_rule(client, method, path):
    """A NUL character in the URL path is 400 VALIDATION_ERROR in the envelope naming the path (the one NUL
    rule of a body, a query parameter and the path), whatever the domain (and before routing: an unknown
    path with a NUL is the same 400)."""
    headers = bearer(token(org="platform-ops", role="super_admin"))
    body = assert_error(getattr(client, method)(path, json={}, headers=headers), 400, "VALIDATION_ERROR")
    assert body["error"]["details"] == {"fields": {"path": ["must not contain the NUL character (U+0000)"]},
                                        "location": "path"}


def test_nul_in_path_still_needs_a_token(client):
    assert_error(client.get("/api/v1/agents/a%00b"), 401, "UNAUTHORIZED")


@pytest.mark.parametrize("path,body,where", [
    ("/api/v1/agents", {"agent": {"name": "n", "title": NUL}}, "agent.title"),
    ("/api/v1/entities/definitions", {"name": "n", "displayName": NUL}, "displayName"),
    ("/api/v1/entities/anything/records/query", {"query": {"filters": {"title": NUL}}}, "query.filters.title"),
    ("/api/v1/agents/images", {"provider": "provider-a", "model": "m", "prompt": NUL}, "prompt"),
    ("/api/v1/email/send", {"to": ["a@example.com"], "subject": "s", "body": NUL}, "body"),
    ("/api/v1/newsletter/subscribers", {"email": "z@example.com", "name": NUL}, "name"),
    ("/api/v1/analytics/events", {"sessionId": "s", "userId": NUL, "eventType": "t", "eventCategory": "c"}, "userId"),
    ("/api/v1/admin/artifacts", {"kind": "skill", "name": "summarize", "artifactVersion": 999,
                                 "definition": {"name": "summarize", "title": NUL}}, "definition.title"),
    ("/internal/seed", {"org": {"title": NUL, "mainDomain": "z.com"}}, "org.title"),
])
def test_nul_in_any_body_field_is_the_same_rule(client, path, body, where):
    """A NUL character in a JSON body, in every domain: the parser's one rule (app.jsonbody), 400
    VALIDATION_ERROR naming the field, as for the path and the query string."""
    headers = bearer(token(org="platform-ops", role="super_admin"))
    answer = assert_error(client.post(path, json=body, headers=headers), 400, "VALIDATION_ERROR")
    assert answer["error"]["details"] == {"fields": {where: ["must not contain the NUL character (U+0000)"]}}
