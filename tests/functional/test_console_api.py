"""The console and the docs page over HTTP: same-origin assets only, CSP, development sign-in,
token refresh from the console session, and no secret in anything the page can read."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import jwt
import pytest

from tests.conftest import ROOT, TEST_SECRET

try:  # the shared envelope check (tests.support once the foundation clean-up lands)
    from tests.support import assert_error as assert_envelope
except ImportError:
    from tests.functional.test_foundation_api import assert_envelope
from tests.support import AUDIENCE, ISSUER, bearer

STATIC = os.path.join(ROOT, "app", "console", "static")


class _Refs(HTMLParser):
    """Every URL a page loads (src/href) and every inline script or event handler."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0
        self.handlers: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.handlers += [name for name in attrs if name.startswith("on")]
        for name in ("src", "href"):
            if attrs.get(name) and not (tag == "a" and name == "href"):
                self.urls.append(attrs[name])
        self._in_script = tag == "script" and "src" not in attrs

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag):
        self._in_script = False


def _page_refs(client, path) -> _Refs:
    resp = client.get(path)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.mimetype == "text/html"
    refs = _Refs()
    refs.feed(resp.get_data(as_text=True))
    return refs


def _assert_same_origin_assets(client, refs: _Refs) -> None:
    assert refs.urls, "the page loads nothing?"
    for url in refs.urls:
        if url.startswith("data:"):
            continue
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{url} is not same-origin"
        assert url.startswith("/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.data) > 0, url
    assert refs.inline_scripts == 0
    assert refs.handlers == []


CSP_DIRECTIVES = {"default-src": "'none'", "script-src": "'self'", "style-src": "'self'",
                  "connect-src": "'self'", "frame-ancestors": "'none'", "base-uri": "'none'"}


def _csp(resp) -> dict[str, str]:
    header = resp.headers.get("Content-Security-Policy", "")
    return dict(part.strip().split(" ", 1) for part in header.split(";") if part.strip())


# ------------------------------------------------------------------------- docs page (no CDN)

def test_docs_page_loads_only_same_origin_assets(client):
    refs = _page_refs(client, "/api/v1/docs")
    _assert_same_origin_assets(client, refs)
    scripts = [u for u in refs.urls if u.endswith(".js")]
    assert "/api/v1/docs/assets/swagger-ui-bundle.js" in scripts
    bundle = client.get("/api/v1/docs/assets/swagger-ui-bundle.js")
    assert bundle.mimetype in {"text/javascript", "application/javascript"}
    assert b"SwaggerUIBundle" in bundle.data


def test_docs_page_has_the_console_csp_and_points_at_the_local_openapi(client):
    resp = client.get("/api/v1/docs")
    policy = _csp(resp)
    for name, value in CSP_DIRECTIVES.items():
        assert policy[name] == value
    assert 'data-spec-url="/api/v1/openapi.json"' in resp.get_data(as_text=True)
    assert "cdn" not in resp.get_data(as_text=True).lower()


@pytest.mark.parametrize("path", ["../routes.py", "..%2Froutes.py", "nope.js", "%2e%2e/%2e%2e/config.py"])
def test_docs_assets_outside_the_asset_folders_are_404(client, path):
    resp = client.get(f"/api/v1/docs/assets/{path}")
    assert resp.status_code == 404
    assert b"import" not in resp.data


# ------------------------------------------------------------------------- console page

def test_console_page_loads_only_same_origin_assets(client):
    refs = _page_refs(client, "/console/analytics")
    _assert_same_origin_assets(client, refs)
    assert any(re.fullmatch(r"/console/assets/vendor/chart\.umd\.min\.[0-9a-f]{12}\.js", u) for u in refs.urls)
    assert client.get(CONSOLE_STATIC_NAMES_URL).status_code == 404  # no unhashed (revalidated) route left


CONSOLE_STATIC_NAMES_URL = "/console/static/console.js"


def _asset_urls(client) -> dict[str, str]:
    """{file under app/console/static: the hashed URL the page links}."""
    refs = _page_refs(client, "/console/analytics")
    out = {}
    for url in refs.urls:
        match = re.fullmatch(r"/console/assets/(.+)\.([0-9a-f]{12})(\.\w+)", url)
        if match:
            out[match.group(1) + match.group(3)] = url
    return out


def test_console_assets_have_hashed_names_long_cache_and_gzip(client):
    urls = _asset_urls(client)
    assert set(urls) == {"console.js", "console.css", "vendor/chart.umd.min.js"}
    for name, url in urls.items():
        with open(os.path.join(STATIC, name), "rb") as fh:
            content = fh.read()
        assert hashlib.sha256(content).hexdigest()[:12] in url  # the name changes with the content
        plain = client.get(url)  # no Accept-Encoding: the file as is
        assert plain.status_code == 200 and plain.data == content
        assert "Content-Encoding" not in plain.headers
        assert plain.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert plain.headers["Vary"] == "Accept-Encoding"
        packed = client.get(url, headers={"Accept-Encoding": "br;q=1, gzip;q=0.8, deflate"})
        assert packed.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(packed.data) == content
        assert len(packed.data) < len(content) / 2
        assert packed.headers["Cache-Control"] == plain.headers["Cache-Control"]
        refused = client.get(url, headers={"Accept-Encoding": "gzip;q=0, identity"})
        assert "Content-Encoding" not in refused.headers and refused.data == content
    chart = client.get(urls["vendor/chart.umd.min.js"], headers={"Accept-Encoding": "gzip"})
    assert chart.mimetype in ("application/javascript", "text/javascript")
    assert client.get(urls["console.css"]).mimetype == "text/css"


@pytest.mark.parametrize("path", ["console.000000000000.js", "console.js", "../routes.py",
                                  "..%2Froutes.py", "%2e%2e/assets.py", "vendor/chart.umd.min.js"])
def test_unknown_or_stale_asset_names_are_404(client, path):
    resp = client.get(f"/console/assets/{path}")
    assert resp.status_code == 404
    assert b"import" not in resp.data


def test_the_page_is_revalidated_and_compressed(client):
    page = client.get("/console/analytics", headers={"Accept-Encoding": "gzip"})
    assert page.headers["Cache-Control"] == "no-cache"
    assert page.headers["Content-Encoding"] == "gzip"
    assert b"<!DOCTYPE html>" in gzip.decompress(page.data)
    assert "Content-Encoding" not in client.get("/console/analytics").headers


def test_docs_assets_are_compressed_and_revalidated_with_an_etag(client):
    url = "/api/v1/docs/assets/swagger-ui-bundle.js"
    first = client.get(url, headers={"Accept-Encoding": "gzip"})
    assert first.status_code == 200 and first.headers["Content-Encoding"] == "gzip"
    assert first.headers["Cache-Control"] == "no-cache" and first.headers["ETag"]
    again = client.get(url, headers={"Accept-Encoding": "gzip", "If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""


def test_console_pages_carry_csp_and_api_responses_do_not(client, auth):
    page = client.get("/console/analytics")
    policy = _csp(page)
    for name, value in CSP_DIRECTIVES.items():
        assert policy[name] == value
    assert "'unsafe-inline'" not in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    for resp in (client.get("/api/v1/me", headers=auth()), client.get("/health"),
                 client.get("/api/v1/openapi.json"), client.get("/api/v1/me")):
        assert "Content-Security-Policy" not in resp.headers
        assert "X-Frame-Options" not in resp.headers


def test_console_root_redirects_to_the_dashboard(client):
    resp = client.get("/console")
    assert resp.status_code == 302
    assert resp.headers["Location"].endswith("/console/analytics")


def test_nothing_the_page_can_read_contains_the_signing_secret(client, make_app):
    app = make_app(CONSOLE_DEV_SIGNIN=True)
    dev = app.test_client()
    reads = [client.get("/console/analytics"), dev.get("/console/analytics"),
             dev.post("/console/session", json={"orgId": "acme"}), dev.post("/console/token")]
    for url in _asset_urls(client).values():
        reads.append(client.get(url))
    for resp in reads:
        assert resp.status_code == 200
        assert TEST_SECRET.encode() not in resp.data
        assert TEST_SECRET not in resp.headers.get("Set-Cookie", "")


# ------------------------------------------------------------------------- development sign-in

@pytest.fixture()
def dev_client(make_app):
    return make_app(CONSOLE_DEV_SIGNIN=True).test_client()


def _claims(token: str) -> dict:
    return jwt.decode(token, TEST_SECRET, algorithms=["HS256"], audience=AUDIENCE, issuer=ISSUER)


def test_dev_sign_in_is_off_unless_enabled(client):
    assert_envelope(client.post("/console/session", json={"orgId": "acme"}), 403, "FORBIDDEN")
    assert_envelope(client.post("/console/token"), 403, "FORBIDDEN")
    assert "Set-Cookie" not in client.post("/console/session", json={"orgId": "acme"}).headers
    page = client.get("/console/analytics").get_data(as_text=True)
    assert 'data-dev-signin="off"' in page
    assert "dev-signin-form" not in page


def test_dev_sign_in_returns_token_and_expires_in_and_sets_an_httponly_session(dev_client, org_id):
    resp = dev_client.post("/console/session", json={"orgId": org_id, "userId": "alice", "role": "admin",
                                                     "email": "alice@example.com"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"token", "expiresIn"}
    assert body["expiresIn"] == 900
    assert resp.headers["Cache-Control"] == "no-store"
    claims = _claims(body["token"])
    assert (claims["org_id"], claims["user_id"], claims["role"], claims["email"]) == \
        (org_id, "alice", "admin", "alice@example.com")
    assert claims["scopes"] == ["read:analytics"]
    assert claims["exp"] - claims["iat"] == 900
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("pg_console_session=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=28800"):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain http in tests; see test_cookie_is_secure_behind_https
    me = dev_client.get("/api/v1/me", headers=bearer(body["token"])).get_json()
    assert (me["orgId"], me["userId"], me["role"]) == (org_id, "alice", "admin")


def test_cookie_is_secure_behind_https(make_app):
    client = make_app(CONSOLE_DEV_SIGNIN=True, PUBLIC_BASE_URL="https://console.example.com").test_client()
    resp = client.post("/console/session", json={"orgId": "acme"})
    assert "Secure" in resp.headers["Set-Cookie"]


def test_token_endpoint_refreshes_from_the_session(dev_client, org_id):
    first = dev_client.post("/console/session", json={"orgId": org_id}).get_json()
    resp = dev_client.post("/console/token")
    assert resp.status_code == 200
    again = resp.get_json()
    assert again["expiresIn"] == 900 and resp.headers["Cache-Control"] == "no-store"
    assert _claims(again["token"])["org_id"] == _claims(first["token"])["org_id"] == org_id
    assert _claims(again["token"])["user_id"] == "dev-user"
    assert "role" not in _claims(again["token"])


def test_token_endpoint_short_ttl_is_configurable(make_app):
    client = make_app(CONSOLE_DEV_SIGNIN=True, CONSOLE_TOKEN_TTL_SECONDS=120).test_client()
    body = client.post("/console/session", json={"orgId": "acme"}).get_json()
    assert body["expiresIn"] == 120
    claims = _claims(body["token"])
    assert claims["exp"] - claims["iat"] == 120


def test_token_endpoint_without_a_session_is_401(dev_client):
    assert_envelope(dev_client.post("/console/token"), 401, "UNAUTHORIZED")


def test_forged_or_foreign_session_cookies_are_401(dev_client):
    from app.console.services import ConsoleIdentity, open_session

    foreign = open_session(ConsoleIdentity(org_id="victim", user_id="x", role="super_admin"),
                           secret="another-secret-" + "y" * 40)
    for value in (foreign, "garbage", foreign[:-3] + "abc", "e30.e30.e30"):
        dev_client.set_cookie("pg_console_session", value, path="/console")
        assert_envelope(dev_client.post("/console/token"), 401, "UNAUTHORIZED")


def test_sign_out_ends_the_session(dev_client):
    dev_client.post("/console/session", json={"orgId": "acme"})
    assert dev_client.post("/console/token").status_code == 200
    resp = dev_client.delete("/console/session")
    assert resp.status_code == 200 and resp.get_json() == {"success": True}
    assert re.search(r"pg_console_session=;.*(Max-Age=0|expires=Thu, 01 Jan 1970)", resp.headers["Set-Cookie"])
    assert_envelope(dev_client.post("/console/token"), 401, "UNAUTHORIZED")


def test_session_dies_with_the_dev_sign_in_switch(make_app):
    on = make_app(CONSOLE_DEV_SIGNIN=True).test_client()
    on.post("/console/session", json={"orgId": "acme"})
    cookie = on.get_cookie("pg_console_session", path="/console").value
    off = make_app().test_client()
    off.set_cookie("pg_console_session", cookie, path="/console")
    assert_envelope(off.post("/console/token"), 403, "FORBIDDEN")


# ------------------------------------------------------------------------- hostile sign-in bodies

def test_sign_in_body_must_be_json(dev_client):
    resp = dev_client.post("/console/session", data="orgId=acme", content_type="application/x-www-form-urlencoded")
    assert_envelope(resp, 415, "INVALID_INPUT")
    resp = dev_client.post("/console/session", data='{"orgId":"acme"}', content_type="text/plain")
    assert_envelope(resp, 415, "INVALID_INPUT")
    assert "Set-Cookie" not in resp.headers


@pytest.mark.parametrize("raw", ["{", "nul\x00l", '{"orgId": "a"', "[" * 100])
def test_malformed_sign_in_json_is_400(dev_client, raw):
    resp = dev_client.post("/console/session", data=raw, content_type="application/json")
    assert_envelope(resp, 400, "INVALID_INPUT")


@pytest.mark.parametrize("body,field", [
    ({}, "orgId"),
    ({"orgId": ""}, "orgId"),
    ({"orgId": "a b"}, "orgId"),
    ({"orgId": "x" * 129}, "orgId"),
    ({"orgId": "acme\u0000"}, "orgId"),
    ({"orgId": "acme\n"}, "orgId"),
    ({"orgId": 42}, "orgId"),
    ({"orgId": "acme", "role": "owner"}, "role"),
    ({"orgId": "acme", "userId": "../etc"}, "userId"),
    ({"orgId": "acme", "email": "not-an-email"}, "email"),
    ({"orgId": "acme", "scopes": ["*"]}, "scopes"),
    ({"orgId": "acme", "product": "!!!"}, "product"),
])
def test_invalid_sign_in_bodies_are_400_naming_the_field(dev_client, body, field):
    resp = dev_client.post("/console/session", json=body)
    envelope = assert_envelope(resp, 400, "VALIDATION_ERROR")
    assert field in envelope["error"]["details"]["fields"]
    assert "Set-Cookie" not in resp.headers


@pytest.mark.parametrize("body", [[], "acme", 7, None])
def test_sign_in_body_must_be_an_object(dev_client, body):
    import json

    resp = dev_client.post("/console/session", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 400
    assert resp.get_json()["error"]["code"] in {"VALIDATION_ERROR", "INVALID_INPUT"}


def test_sign_in_to_an_unknown_product_is_403(dev_client):
    assert_envelope(dev_client.post("/console/session", json={"orgId": "acme", "product": "nosuch"}),
                    403, "FORBIDDEN")
    ok = dev_client.post("/console/session", json={"orgId": "acme", "product": "other"})
    assert ok.status_code == 200 and _claims(ok.get_json()["token"])["product"] == "other"
