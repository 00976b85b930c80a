"""The tenant of a request and the one helper every tenant query goes through.

The tenant comes only from verified JWT claims (app.auth); the caller's X-Org-ID / X-User-ID /
X-User-Email / X-Product headers are overwritten from them. Every tenant row carries `org_id` and
every read goes through `tenant_select` / `get_owned`, so an object of another org is a 404.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.db import db
from app.errors import Forbidden, NotFound, Unauthorized
from app.platform_models import Product
from app.reqctx import app_object, current_g, g_or_none, request_or_none

T = TypeVar("T")


@dataclass(frozen=True)
class Tenant:
    org_id: str
    user_id: str
    email: str | None
    role: str | None
    scopes: tuple[str, ...] = field(default_factory=tuple)
    product: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return {"orgId": self.org_id, "userId": self.user_id, "email": self.email,
                "role": self.role, "scopes": list(self.scopes), "product": self.product}


def set_tenant(tenant: Tenant, req: Any = None) -> None:
    """Install the verified tenant and re-stamp the identity headers from it (`req`: the current
    request object, when the caller has it at hand)."""
    current_g().tenant = tenant
    if req is None:
        req = request_or_none()
    if req is not None:
        env = req.environ
        env["HTTP_X_ORG_ID"] = tenant.org_id
        env["HTTP_X_USER_ID"] = tenant.user_id
        env["HTTP_X_USER_EMAIL"] = tenant.email or ""
        env["HTTP_X_PRODUCT"] = tenant.product


def current_tenant() -> Tenant:
    names = g_or_none()
    tenant = names.get("tenant") if names is not None else None
    if tenant is None:
        raise Unauthorized("Authentication required.")
    return tenant


def current_org() -> str:
    return current_tenant().org_id


def tenant_select(model: type[T], org_id: str | None = None) -> Select:
    """`SELECT model WHERE org_id = <tenant org>`: the start of every tenant query."""
    return select(model).where(model.org_id == (org_id or current_org()))  # type: ignore[attr-defined]


def get_owned(model: type[T], object_id: Any, what: str | None = None, *, extra=None, session: Session | None = None,
              org_id: str | None = None) -> T:
    """Load one object of org `org_id` (by default the caller's) by primary key with `session` (by default
    the request's), or raise 404 (never 403)."""
    stmt = tenant_select(model, org_id).where(model.id == object_id)  # type: ignore[attr-defined]
    if extra is not None:
        stmt = stmt.where(extra)
    obj = (session or db.session).scalars(stmt).first()
    if obj is None:
        raise NotFound(f"{what or model.__name__} not found.")
    return obj


class ProductRegistry:
    """Known products of one app's database, cached briefly so every request does not hit
    platform.products. Each app has its own (`products`, below), so a process holding several apps
    (tests, tools) never answers for one database from another's cache."""

    ttl = 30.0

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        with db.engine.connect() as conn:
            names = set(conn.scalars(select(Product.slug)))
        with self._lock:
            self._names, self._loaded_at = names, time.monotonic()

    def require(self, product: str) -> None:
        """403 unless `product` is provisioned (refreshes the cache once on a miss)."""
        if product in self._names and time.monotonic() - self._loaded_at < self.ttl:
            return
        self._refresh()
        if product not in self._names:
            raise Forbidden(f"Unknown product '{product}'.")


class _CurrentAppProducts:
    """`products.require(...)`: the ProductRegistry of the current app, made on first use and kept in
    `app.extensions["product_registry"]` (it was one registry per process, filled from whichever
    database asked first)."""

    def registry(self, app: Any = None) -> ProductRegistry:
        extensions = (app if app is not None else app_object()).extensions
        found = extensions.get("product_registry")
        if found is None:
            found = extensions.setdefault("product_registry", ProductRegistry())  # atomic: one per app
        return found

    def require(self, product: str) -> None:
        self.registry().require(product)


products = _CurrentAppProducts()
