"""Token and scope logic (app.auth) without HTTP: start-up refusal, claims → tenant, scope matching."""

from __future__ import annotations

import time

import pytest

from app.auth import has_any_scope, scope_satisfies, tenant_from_claims
from app.errors import Forbidden, Unauthorized
from app.extensions import Blueprint
from app.tenancy import Tenant


def test_weak_secret_refuses_start(make_app):
    with pytest.raises(RuntimeError, match="at least 32 bytes"):
        make_app(JWT_SECRET="short-secret")


@pytest.mark.parametrize("held,required,ok", [
    ("read", "read:agents", True), ("write", "write:entities", True), ("admin", "admin:x", True),
    ("read", "write:agents", False), ("read:agents", "read:entities", False),
    ("read:agents", "read:agents", True), ("*", "anything", True)])
def test_scope_satisfies(held, required, ok):
    assert scope_satisfies(held, required) is ok


def tenant(scopes=(), role=None):
    return Tenant(org_id="o", user_id="u", email=None, role=role, scopes=tuple(scopes))


def test_any_one_scope_suffices_and_admin_roles_and_star_bypass():
    assert has_any_scope(tenant(["read:entities"]), ["write:entities", "read:entities"])
    assert not has_any_scope(tenant(["read:entities"]), ["write:entities"])
    assert has_any_scope(tenant([], role="admin"), ["write:entities"])
    assert has_any_scope(tenant([], role="super_admin"), ["write:entities"])
    assert has_any_scope(tenant(["*"]), ["write:entities"])
    assert not has_any_scope(tenant([], role="user"), ["read"])


def test_route_decorators_declare_what_authorize_request_enforces():
    @Blueprint.requires("read:x", "read")
    def view():
        return "ok"

    @Blueprint.requires(roles=("admin",))
    def admin_view():
        return "ok"

    assert view._required_scopes == ("read:x", "read") and view.__name__ == "view"
    assert admin_view._required_roles == ("admin",)


def test_claims_become_a_tenant(app):
    with app.app_context():
        t = tenant_from_claims({"org_id": "o1", "user_id": "u1", "email": "a@b.c", "role": "user",
                                "scopes": "read write", "product": "Other"})
        assert (t.org_id, t.user_id, t.scopes, t.product) == ("o1", "u1", ("read", "write"), "other")
        assert tenant_from_claims({"org_id": "o1", "user_id": "u1"}).product == app.config["DEFAULT_PRODUCT"]


@pytest.mark.parametrize("claims,error", [
    ({"user_id": "u"}, Unauthorized), ({"org_id": "o", "user_id": ""}, Unauthorized),
    ({"org_id": "o", "user_id": "u", "scopes": [1]}, Unauthorized),
    ({"org_id": "o", "user_id": "u", "iat": time.time() + 3600}, Unauthorized),
    ({"org_id": "o", "user_id": "u", "product": "???"}, Forbidden),
])
def test_bad_claims_are_refused(app, claims, error):
    with app.app_context(), pytest.raises(error):
        tenant_from_claims(claims)


def test_a_verified_token_is_checked_once_until_it_expires(app, monkeypatch):
    """The verified-token cache: a second decode of the same token skips verification; once the
    token is past exp (+ leeway) it is verified again, and that verification refuses it."""
    import app.auth as auth
    from tests.support import token

    calls = []
    verify = auth._verify
    monkeypatch.setattr(auth, "_verify", lambda tok, config: calls.append(tok) or verify(tok, config))
    tok = token(org="org-cache", scopes=("read",))
    with app.app_context():
        first = auth.decode_token(tok)
        assert auth.decode_token(tok) == first and len(calls) == 1
        later = first["exp"] + app.config["JWT_LEEWAY_SECONDS"] + 1
        monkeypatch.setattr(auth.time, "time", lambda: later)

        def expired(tok, config):  # what PyJWT answers at that time
            calls.append(tok)
            raise Unauthorized("Token expired.")
        monkeypatch.setattr(auth, "_verify", expired)
        with pytest.raises(Unauthorized):
            auth.decode_token(tok)
        assert len(calls) == 2
        with pytest.raises(Unauthorized):  # refused again, not served from the cache
            auth.decode_token(tok)
        assert len(calls) == 3


def test_a_token_verified_under_another_secret_is_not_trusted(make_app):
    """The cache key holds the verification settings: another app's secret verifies afresh."""
    from tests.support import token

    tok = token(org="org-cache", scopes=("read",))
    other = make_app(JWT_SECRET="another-secret-" + "y" * 40)
    assert other.test_client().get("/api/v1/me", headers={"Authorization": f"Bearer {tok}"}).status_code == 401


def test_a_cached_token_expires_when_pyjwt_would_refuse_it(app, monkeypatch):
    """PyJWT truncates a fractional exp; the cache must not accept a token for the fraction past it."""
    from types import SimpleNamespace

    from app import auth
    from tests.support import token

    leeway = app.config["JWT_LEEWAY_SECONDS"]
    with app.test_request_context():
        tok = token(org="org-frac", scopes=["read"])
        claims = auth.decode_token(tok)
        claims["exp"] = int(claims["exp"]) + 0.95  # as if the issuer had written a fractional exp
        monkeypatch.setattr(auth, "time", SimpleNamespace(time=lambda: int(claims["exp"]) + leeway + 0.5))

        def expired(tok, config):  # what PyJWT answers at that time
            raise Unauthorized("Token expired.")

        monkeypatch.setattr(auth, "_verify", expired)
        with pytest.raises(Unauthorized):
            auth.decode_token(tok)
