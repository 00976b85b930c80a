"""Bearer JWT authentication, scope and role checks, token minting.

Authentication runs once per request (`authenticate_request`, a before_request hook) for every
/api/v1 and /internal route except the OpenAPI pages; routes then declare what they need with
`@blp.requires` (`require`). Algorithms are pinned to HS256; the token never chooses. On /internal a
route may also accept the cluster's shared `X-Internal-Token` (`require(..., internal_token=True)`).
"""

from __future__ import annotations

import functools
import hmac
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import jwt
from flask import Flask, current_app, g

from app.db import product_slug
from app.errors import Forbidden, Unauthorized
from app.reqctx import app_object, current_g, current_request
from app.tenancy import Tenant, current_tenant, products, set_tenant
from app.tokens import ALGORITHM as ALGORITHM  # re-exported: signing and minting live in app.tokens
from app.tokens import MIN_SECRET_BYTES as MIN_SECRET_BYTES
from app.tokens import mint_token as mint_token
from app.tokens import signing_secret

log = logging.getLogger(__name__)

MAX_AUTH_HEADER = 8192
BYPASS_ROLES = frozenset({"admin", "super_admin"})
# No bearer token: the OpenAPI pages, and the newsletter unsubscribe link (its signed token is the
# credential; app.email.newsletter).
PUBLIC_PREFIXES = ("/api/v1/docs", "/api/v1/openapi.json", "/api/v1/newsletter/unsubscribe")
API_PREFIX = "/api/v1"
# Cluster-internal operations: a bearer token as on /api/v1, or X-Internal-Token where the
# route accepts it. The token's product is not required to be provisioned there: those routes name
# the product they act on (seeding creates it), the token's selects no data.
INTERNAL_PREFIX = "/internal"
INTERNAL_TOKEN_HEADER = "X-Internal-Token"


def load_secret(app: Flask) -> str:
    """The signing secret: configured, or generated once into VAR_DIR/jwt-secret for development
    (app.tokens, shared with `flask token mint`)."""
    return signing_secret(app.config)


def _bearer_token(req=None) -> str:
    # `headers.get("Authorization", "")`: the environ entry it reads
    header = (req if req is not None else current_request()).environ.get("HTTP_AUTHORIZATION", "")
    if not header:
        raise Unauthorized("Missing bearer token.")
    if len(header) > MAX_AUTH_HEADER:
        raise Unauthorized("Authorization header too large.")
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer" or "," in parts[1]:
        raise Unauthorized("Authorization must be exactly one Bearer token.")
    return parts[1]


# Verified tokens, so a client's repeated requests pay the HMAC and claim checks once: key = the token
# and the settings it was verified under, value = its claims. Only signature-verified tokens enter;
# a hit is re-checked against `exp` (the only check whose answer changes with time — iat/nbf held
# when it was verified and stay true); bounded (cleared when full). Per process, no invalidation
# needed: nothing revokes a token before its exp.
_VERIFIED: dict[tuple, dict[str, Any]] = {}
VERIFIED_CACHE_SIZE = 4096


def decode_token(token: str, config=None) -> dict[str, Any]:
    if config is None:
        config = app_object().config
    key = (token, config["JWT_SECRET"], config["JWT_AUDIENCE"], config["JWT_ISSUER"], config["JWT_LEEWAY_SECONDS"])
    claims = _VERIFIED.get(key)
    if claims is not None:
        # PyJWT truncates exp (int()) and refuses once int(exp) <= now - leeway: judge a hit the same way
        if time.time() < int(claims["exp"]) + config["JWT_LEEWAY_SECONDS"]:
            return claims
        _VERIFIED.pop(key, None)  # expired since: decode again, which answers "Token expired."
    claims = _verify(token, config)
    if isinstance(claims.get("exp"), (int, float)):
        if len(_VERIFIED) >= VERIFIED_CACHE_SIZE:
            _VERIFIED.clear()
        _VERIFIED[key] = claims
    return claims


def _verify(token: str, config) -> dict[str, Any]:
    try:
        return jwt.decode(
            token, config["JWT_SECRET"], algorithms=[ALGORITHM],
            audience=config["JWT_AUDIENCE"], issuer=config["JWT_ISSUER"],
            leeway=config["JWT_LEEWAY_SECONDS"],
            options={"require": ["exp", "iat", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthorized("Token expired.") from None
    except jwt.ImmatureSignatureError:
        raise Unauthorized("Token not valid yet (iat in the future).") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(f"Invalid token: {exc}.") from None


def tenant_from_claims(claims: dict[str, Any], config=None) -> Tenant:
    if config is None:
        config = app_object().config
    org, user = claims.get("org_id"), claims.get("user_id")
    if not isinstance(org, str) or not org or not isinstance(user, str) or not user:
        raise Unauthorized("Token lacks org_id or user_id.")
    scopes = claims.get("scopes") or []
    if isinstance(scopes, str):
        scopes = scopes.split()
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise Unauthorized("Token scopes must be a list of strings.")
    iat = claims.get("iat")
    if isinstance(iat, (int, float)) and iat > time.time() + config["JWT_LEEWAY_SECONDS"]:
        raise Unauthorized("Token not valid yet (iat in the future).")
    raw_product = claims.get("product") or config["DEFAULT_PRODUCT"]
    try:
        product = product_slug(str(raw_product))
    except ValueError:
        raise Forbidden(f"Unknown product '{raw_product}'.") from None
    return Tenant(org_id=org, user_id=user, email=claims.get("email"), role=claims.get("role"),
                  scopes=tuple(scopes), product=product)


# The Tenant made from a token's claims, per claims dict (a cached token's claims are `_VERIFIED`'s value,
# the same dict object on every hit), so a client's repeated requests build it once: key = id of that
# dict, value = (the dict itself, which keeps the id from being reused, DEFAULT_PRODUCT, the Tenant).
# Exact: the claims are never changed, the tenant depends on them and DEFAULT_PRODUCT only, and the one
# time-dependent check ("iat in the future") cannot fail later once it has passed (the leeway is part of
# `_VERIFIED`'s key: another leeway means another dict). Bounded as `_VERIFIED`.
_TENANTS: dict[int, tuple[dict[str, Any], Any, Tenant]] = {}


def _tenant_of(claims: dict[str, Any], config) -> Tenant:
    default_product = config["DEFAULT_PRODUCT"]
    entry = _TENANTS.get(id(claims))
    if entry is not None and entry[0] is claims and entry[1] == default_product:
        return entry[2]
    tenant = tenant_from_claims(claims, config)
    if len(_TENANTS) >= VERIFIED_CACHE_SIZE:
        _TENANTS.clear()
    _TENANTS[id(claims)] = (claims, default_product, tenant)
    return tenant


def authenticate_request() -> None:
    """before_request: verify the credentials of every /api/v1 and /internal request and install the
    caller (the tenant, or on /internal the internal-token caller `g.internal_caller`)."""
    req = current_request()
    path = req.path
    internal = path == INTERNAL_PREFIX or path.startswith(INTERNAL_PREFIX + "/")
    if not (path.startswith(API_PREFIX) or internal) or path.startswith(PUBLIC_PREFIXES):
        return
    if req.method == "OPTIONS" or req.routing_exception is not None:
        return  # CORS preflight; unknown path or method answers 404/405 without a token
    if internal:
        if INTERNAL_TOKEN_HEADER in req.headers and _view_marker("_internal_token"):
            _check_internal_token(req.headers[INTERNAL_TOKEN_HEADER])
            g.internal_caller = "internal-token"
            return
        if not req.headers.get("Authorization"):
            raise Unauthorized(f"{INTERNAL_TOKEN_HEADER} or an admin bearer token is required.")
    app = app_object()
    config = app.config
    tenant = _tenant_of(decode_token(_bearer_token(req), config), config)
    if not internal:
        products.registry(app).require(tenant.product)
    set_tenant(tenant, req)
    if internal:
        g.internal_caller = f"user:{tenant.user_id}"


def _check_internal_token(sent: str) -> None:
    expected = current_app.config.get("INTERNAL_API_TOKEN") or ""
    if not expected:
        raise Unauthorized("Internal token authentication is disabled (INTERNAL_API_TOKEN is not set).")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Unauthorized("Invalid internal token.")


def _view(req=None):
    if req is None:
        req = current_request()
    rule = req.url_rule
    view = app_object().view_functions.get(rule.endpoint) if rule is not None else None
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        method = req.method
        view = getattr(view_class, method.lower(), None)
        if view is None and method == "HEAD":
            view = getattr(view_class, "get", None)
    return view


def _view_marker(name: str):
    return getattr(_view(), name, None)


def is_internal_token_caller() -> bool:
    return current_g().get("internal_caller") == "internal-token"


def authorize_request() -> None:
    """before_request, after authentication: enforce the view's declared scopes and roles before
    any body or query parsing, so an unauthorized caller learns nothing from validation errors.
    The markers are those `require` leaves (functools.wraps copies them up through flask-smorest's
    decorators, so they are found whatever the decorator order is)."""
    req = current_request()
    if req.url_rule is None:
        return
    names = current_g()
    tenant = names.get("tenant")
    if tenant is None and names.get("internal_caller") != "internal-token":
        return
    view = _view(req)
    _check(getattr(view, "_required_scopes", None), getattr(view, "_required_roles", None),
           getattr(view, "_star_bypasses", True), bool(getattr(view, "_internal_token", False)), tenant)


def _check(scopes, roles, star_bypasses: bool, internal_token: bool, tenant: Tenant | None = None) -> None:
    if internal_token and is_internal_token_caller():
        return  # authenticate_request verified the shared token, on a route that accepts it
    if tenant is None:
        tenant = current_tenant()
    if roles:
        _check_role(tenant, roles, star_bypasses)
    if scopes:
        _check_scopes(tenant, scopes)


def _check_scopes(tenant: Tenant, required: tuple[str, ...]) -> None:
    if not has_any_scope(tenant, required):
        raise Forbidden(f"Missing scope: one of {', '.join(required)} is required.")


def _check_role(tenant: Tenant, roles: tuple[str, ...], star_bypasses: bool = True) -> None:
    if tenant.role not in roles and not (star_bypasses and "*" in tenant.scopes):
        raise Forbidden(f"Requires role {' or '.join(roles)}.")


def scope_satisfies(held: str, required: str) -> bool:
    """`write` satisfies `write:agents`; an exact match always does."""
    if held == required or held == "*":
        return True
    return ":" not in held and required.split(":", 1)[0] == held


def has_any_scope(tenant: Tenant, required: Iterable[str]) -> bool:
    if tenant.role in BYPASS_ROLES or "*" in tenant.scopes:
        return True
    for r in required:  # loops, not any(generator): a generator left early is closed with GeneratorExit
        for h in tenant.scopes:
            if scope_satisfies(h, r):
                return True
    return False


def require(*scopes: str, roles: tuple[str, ...] = (), star_bypasses: bool = True,
            internal_token: bool = False) -> Callable:
    """Route decorator: the token needs any one of `scopes` (admin roles and `*` bypass) and, when
    `roles` are given, one of those roles (or scope `*`, unless `star_bypasses=False`).
    `internal_token=True` (routes under /internal only): the shared X-Internal-Token
    (INTERNAL_API_TOKEN) satisfies the requirement as well.

    Enforced before the request body is parsed (`authorize_request` reads the markers set here,
    whatever the decorator order) and again when the view runs; documented in OpenAPI (401, 403 and
    the security of the operation) by app.extensions.Blueprint from the same markers. Routes
    use it as `@blp.requires(...)`, the one access decorator (this is its implementation)."""

    def decorator(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            _check(scopes, roles, star_bypasses, internal_token)
            return view(*args, **kwargs)

        if scopes:
            wrapper._required_scopes = scopes  # type: ignore[attr-defined]
        if roles:
            wrapper._required_roles = roles  # type: ignore[attr-defined]
        if not star_bypasses:
            wrapper._star_bypasses = False  # type: ignore[attr-defined]
        if internal_token:
            wrapper._internal_token = True  # type: ignore[attr-defined]
        return wrapper

    return decorator

