"""Console sign-in: how the page gets short-lived access tokens without ever holding a secret.

A browser client never holds a signing secret: it obtains its token from an endpoint of the
application that returns `{token, expiresIn}`, and refreshes it about 5 minutes before expiry. Here the
application is the console itself: a sign-in opens a console session (a signed, HttpOnly,
SameSite=Strict cookie that page scripts cannot read), and `POST /console/token` exchanges that
session for a fresh access token. The signing secret stays on the server; the page keeps the token
in memory only.

The only sign-in this service ships is the development one (`CONSOLE_DEV_SIGNIN`, off by default):
it trusts the identity typed into the form, so it must never be enabled where real data lives.
Elsewhere the page takes a token pasted by an operator (`flask token mint`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer

from app.auth import mint_token

SESSION_COOKIE = "pg_console_session"
COOKIE_PATH = "/console"
# The console only reads dashboards; its tokens carry nothing more (spec: analytics reads need
# `read` or `read:analytics`; the global view is granted by the role, not a scope).
TOKEN_SCOPES = ("read:analytics",)


@dataclass(frozen=True)
class ConsoleIdentity:
    """Who a console session acts as: the claims its tokens carry."""

    org_id: str
    user_id: str
    role: str | None = None
    product: str | None = None
    email: str | None = None


def _serializer(secret: str) -> URLSafeTimedSerializer:
    # Keyed by the JWT secret (salted, so a cookie is never a valid JWT and vice versa):
    # rotating the secret ends every console session, as it ends every token.
    return URLSafeTimedSerializer(secret, salt="platform-gateway console session")


def open_session(identity: ConsoleIdentity, *, secret: str) -> str:
    """The signed cookie value of a new console session."""
    return _serializer(secret).dumps(asdict(identity))


def read_session(cookie: str | None, *, secret: str, max_age: int) -> ConsoleIdentity | None:
    """The identity of a console session cookie, or None when missing, forged or expired."""
    if not cookie:
        return None
    try:
        data: Any = _serializer(secret).loads(cookie, max_age=max_age)
        return ConsoleIdentity(**data)
    except (BadSignature, TypeError):
        return None


def issue_token(identity: ConsoleIdentity, config: dict[str, Any], *, now: float | None = None) -> dict:
    """`{token, expiresIn}` for the page: a short-lived access token with the session's claims."""
    ttl = int(config["CONSOLE_TOKEN_TTL_SECONDS"])
    token = mint_token(
        secret=config["JWT_SECRET"], issuer=config["JWT_ISSUER"], audience=config["JWT_AUDIENCE"],
        org=identity.org_id, user=identity.user_id, email=identity.email, role=identity.role,
        product=identity.product, scopes=TOKEN_SCOPES, ttl=ttl,
        now=int(now if now is not None else time.time()))
    return {"token": token, "expiresIn": ttl}
