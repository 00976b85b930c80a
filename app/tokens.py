"""Signing secret and token minting, without the app: `flask token mint` needs nothing else.

`signing_secret(config)` is JWT_SECRET, or for development the secret generated once into
VAR_DIR/jwt-secret. `create_app` (app.auth.load_secret) and the CLI read it the same way, so a token
minted in another shell is accepted by the server that shares its configuration (the .env file,
app.config). Before it generates or reads a development secret it checks that it is not about to sign
with the state of a VAR_DIR nobody chose beside a running server of another (app.embedded_pg).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

import jwt

from app.embedded_pg import refuse_new_state

log = logging.getLogger(__name__)
ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32


def signing_secret(config: Mapping[str, Any]) -> str:
    """The signing secret: configured, or generated once into VAR_DIR/jwt-secret for development."""
    secret = config.get("JWT_SECRET") or ""
    if not secret:
        var_dir = config["VAR_DIR"]
        path = os.path.join(var_dir, "jwt-secret")
        exists = os.path.exists(path)
        if not exists or not config.get("DATABASE_URL"):
            refuse_new_state(config, "the development JWT secret" if exists else "a new development JWT secret")
        os.makedirs(var_dir, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(48))
            log.warning("JWT_SECRET is not set: generated a development secret into %s. "
                        "Set JWT_SECRET (>= 32 bytes) in any shared or production deployment.", path)
        except FileExistsError:
            log.info("JWT_SECRET is not set: using the development secret in %s.", path)
        with open(path) as fh:
            secret = fh.read().strip()
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise RuntimeError(f"JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes; refusing to start.")
    return secret


def mint_token(*, secret: str, issuer: str, audience: str, org: str, user: str,
               scopes: Iterable[str] = (), role: str | None = None, product: str | None = None,
               email: str | None = None, ttl: int = 3600, now: int | None = None) -> str:
    """A signed access token with the claims the gateway issues."""
    now = int(now if now is not None else time.time())
    claims: dict[str, Any] = {
        "org_id": org, "user_id": user, "scopes": list(scopes), "iat": now, "exp": now + ttl,
        "iss": issuer, "aud": audience,
    }
    if role:
        claims["role"] = role
    if product:
        claims["product"] = product
    if email:
        claims["email"] = email
    return jwt.encode(claims, secret, algorithm=ALGORITHM)
