"""Console pages, the console's token endpoints, and the Swagger UI assets.

Plain Flask routes (not part of the OpenAPI document, which describes `/api/v1`): the console
reads its data through the public analytics API with the caller's token, like any other client.
"""

from __future__ import annotations

import os

import flask_swagger_ui
from flask import Blueprint, abort, current_app, redirect, render_template, request
from marshmallow import ValidationError

from app.console.assets import AssetStore, compress_page, send
from app.console.schemas import DevSignInRequest
from app.console.services import (
    COOKIE_PATH,
    SESSION_COOKIE,
    ConsoleIdentity,
    issue_token,
    open_session,
    read_session,
)
from app.db import product_slug
from app.errors import Forbidden, Unauthorized, ValidationFailed
from app.jsonbody import loads, require_json_body
from app.reqctx import current_request
from app.tenancy import products
from app.wire import SUCCESS, json_response

HERE = os.path.dirname(os.path.abspath(__file__))
# Swagger UI's own build, shipped inside the flask-swagger-ui wheel (we use only its files)
SWAGGER_UI_DIST = os.path.join(os.path.dirname(flask_swagger_ui.__file__), "dist")
OUR_DOCS_ASSETS = os.path.join(HERE, "static", "docs")
CONSOLE_ASSETS = AssetStore(os.path.join(HERE, "static"), hashed=True)
DOCS_ASSETS = (AssetStore(OUR_DOCS_ASSETS, hashed=False), AssetStore(SWAGGER_UI_DIST, hashed=False))
# Pages of these prefixes get the console's security headers (see `security_headers`).
PAGE_PREFIXES = ("/console", "/api/v1/docs")
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))

# No Flask static route: the console's files are served by `console_asset` under content-hashed names.
console_bp = Blueprint("console", __name__, template_folder="templates")
blueprints: list = []  # nothing for flask-smorest: these routes are not part of /api/v1
plain_blueprints = [console_bp]


@console_bp.get("/console/")
@console_bp.get("/console")
def console_home():
    """The console's start page is the analytics dashboard."""
    return redirect("/console/analytics", code=302)


@console_bp.get("/console/analytics")
def analytics_page():
    """The analytics dashboard (HTML; its script fetches everything with the caller's token)."""
    page = current_app.make_response(render_template(
        "console/analytics.html", dev_signin=bool(current_app.config["CONSOLE_DEV_SIGNIN"]),
        asset_url=asset_url))
    page.headers["Cache-Control"] = "no-cache"  # always the newest page, which names the newest assets
    return compress_page(page, request)


def asset_url(name: str) -> str:
    """`/console/assets/<name with its content hash>` of a file under app/console/static."""
    return "/console/assets/" + CONSOLE_ASSETS.url_name(name)


@console_bp.get("/console/assets/<path:name>")
def console_asset(name: str):
    """The console's script, style and Chart.js, by content-hashed name: cached for a year, gzip."""
    asset = CONSOLE_ASSETS.find(name)
    if asset is None:
        abort(404)
    return send(asset, request, immutable=True)


@console_bp.post("/console/session")
def dev_sign_in():
    """Development sign-in: opens a console session for the identity in the body.

    Off unless CONSOLE_DEV_SIGNIN is set: it trusts what is typed, so it only suits a developer's
    machine. Answers the first `{token, expiresIn}` and sets the HttpOnly session cookie."""
    _require_dev_sign_in()
    identity = _identity_from_body()
    config = current_app.config
    response = _token_response(identity)
    response.set_cookie(SESSION_COOKIE, open_session(identity, secret=config["JWT_SECRET"]),
                        max_age=int(config["CONSOLE_SESSION_TTL_SECONDS"]), path=COOKIE_PATH,
                        httponly=True, samesite="Strict", secure=_secure_cookies())
    return response


@console_bp.delete("/console/session")
def sign_out():
    """Ends the console session (the page also forgets its token)."""
    response = json_response(SUCCESS)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True, samesite="Strict",
                           secure=_secure_cookies())
    return response


@console_bp.post("/console/token")
def refresh_token():
    """`{token, expiresIn}` for the open console session: the page calls it about 5 minutes
    before its token expires, and again whenever the API answers 401."""
    _require_dev_sign_in()
    config = current_app.config
    identity = read_session(request.cookies.get(SESSION_COOKIE), secret=config["JWT_SECRET"],
                            max_age=int(config["CONSOLE_SESSION_TTL_SECONDS"]))
    if identity is None:
        raise Unauthorized("No console session (or it has expired): sign in again.")
    return _token_response(identity)


@console_bp.get("/api/v1/docs/assets/<path:filename>")
def docs_asset(filename: str):
    """Swagger UI's files (from the flask-swagger-ui wheel) and our page script, served locally."""
    for store in DOCS_ASSETS:
        asset = store.find(filename)
        if asset is not None:
            return send(asset, request, immutable=False)  # revalidated (ETag), gzip
    abort(404)


@console_bp.after_app_request
def security_headers(response):
    """CSP and friends on the console and docs pages only: scripts and styles from this origin,
    no inline script, no third-party origin, no framing. API responses are left as they are."""
    path = current_request().path
    if not path.startswith(PAGE_PREFIXES):
        return response
    if not path.startswith("/api/v1/docs/assets"):
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _require_dev_sign_in() -> None:
    if not current_app.config["CONSOLE_DEV_SIGNIN"]:
        raise Forbidden("Development sign-in is disabled (CONSOLE_DEV_SIGNIN is off). Paste an access "
                        "token instead, e.g. one printed by `flask token mint`.")


def _identity_from_body() -> ConsoleIdentity:
    # the API's one JSON layer: 415 for another type, 400 for bad JSON (depth, digits, surrogates)
    body = loads(request.get_data(cache=True)) if require_json_body(request) else None
    if not isinstance(body, dict):
        raise ValidationFailed("Request validation failed.", {"fields": {"_schema": ["Expected an object."]}})
    try:
        data = DevSignInRequest().load(body)
    except ValidationError as exc:
        raise ValidationFailed("Request validation failed.", {"fields": exc.messages}) from None
    if data["product"] is not None:
        _require_product(data["product"])
    return ConsoleIdentity(org_id=data["orgId"], user_id=data["userId"], role=data["role"],
                           product=data["product"], email=data["email"])


def _require_product(name: str) -> None:
    try:
        slug = product_slug(name)
    except ValueError as exc:
        raise ValidationFailed("Request validation failed.", {"fields": {"product": [str(exc)]}}) from None
    products.require(slug)  # 403 for a product that is not provisioned, as for a token


def _token_response(identity: ConsoleIdentity):
    return json_response(issue_token(identity, current_app.config), headers={"Cache-Control": "no-store"})


def _secure_cookies() -> bool:
    return request.is_secure or current_app.config["PUBLIC_BASE_URL"].startswith("https://")
