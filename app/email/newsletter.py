"""Newsletter: an org's subscribers and issues sent to every active one through the bulk path.

Every issue message carries `List-Unsubscribe` (an HTTPS link and RFC 8058 one-click POST) with a
signed token naming the product, org and subscriber. The token is an HMAC-SHA256 keyed from
JWT_SECRET (a purpose-specific derived key), does not expire (an unsubscribe link must keep working)
and needs no login: GET shows a confirmation page, POST unsubscribes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any
from urllib.parse import quote

from flask import current_app
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.db import db
from app.email.bulk import create_job
from app.email.models import EmailJob, NewsletterSubscriber
from app.errors import NotFound, Unauthorized, ValidationFailed
from app.tenancy import Tenant, products, tenant_select
from app.wire import iso, new_id, utcnow

UNSUBSCRIBE_PATH = "/api/v1/newsletter/unsubscribe"


def subscriber_to_wire(s: NewsletterSubscriber) -> dict[str, Any]:
    return {"id": s.id, "email": s.email, "name": s.name, "status": s.status, "source": s.source,
            "createdAt": iso(s.created_at), "updatedAt": iso(s.updated_at), "unsubscribedAt": iso(s.unsubscribed_at)}


def subscribe(session: Session, tenant: Tenant, email: str, name: str | None,
              source: str | None) -> tuple[NewsletterSubscriber, bool]:
    """Add (or re-activate) a subscriber of `tenant`'s org; returns it and whether anything changed."""
    email = email.strip().lower()
    now = utcnow()
    stmt = insert(NewsletterSubscriber).values(
        id=new_id(), org_id=tenant.org_id, email=email, name=name, status="active", source=source,
        created_at=now, updated_at=now)
    changed = session.execute(stmt.on_conflict_do_update(
        constraint="uq_newsletter_subscribers_org_id_email",
        set_={"status": "active", "updated_at": now, "unsubscribed_at": None,
              "name": func.coalesce(stmt.excluded.name, NewsletterSubscriber.name)},
        where=NewsletterSubscriber.status != "active").returning(NewsletterSubscriber.id)).first() is not None
    sub = session.scalars(tenant_select(NewsletterSubscriber, tenant.org_id)
                          .where(NewsletterSubscriber.email == email)).one()
    return sub, changed


def list_subscribers(status: str | None, after: str | None, limit: int) -> list[NewsletterSubscriber]:
    stmt = tenant_select(NewsletterSubscriber)
    if status:
        stmt = stmt.where(NewsletterSubscriber.status == status)
    if after:
        stmt = stmt.where(NewsletterSubscriber.email > after.lower())
    return list(db.session.scalars(stmt.order_by(NewsletterSubscriber.email).limit(limit)))


def _find(session: Session, org_id: str, ref: str) -> NewsletterSubscriber:
    """By id or by email address."""
    if "@" in ref:
        where = NewsletterSubscriber.email == ref.strip().lower()
    else:
        where = NewsletterSubscriber.id == ref
    sub = session.scalars(tenant_select(NewsletterSubscriber, org_id).where(where)).first()
    if sub is None:
        raise NotFound("Subscriber not found.")
    return sub


def unsubscribe(session: Session, tenant: Tenant, ref: str) -> NewsletterSubscriber:
    sub = _find(session, tenant.org_id, ref)
    _mark_unsubscribed(sub)
    session.flush()
    return sub


def _mark_unsubscribed(sub: NewsletterSubscriber) -> None:
    if sub.status != "unsubscribed":
        sub.status, sub.unsubscribed_at, sub.updated_at = "unsubscribed", utcnow(), utcnow()


# --------------------------------------------------------------------------- signed unsubscribe links


def _key() -> bytes:
    return hmac.new(current_app.config["JWT_SECRET"].encode(), b"newsletter-unsubscribe/v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unsubscribe_token(product: str, org_id: str, subscriber_id: str) -> str:
    payload = _b64(json.dumps([product, org_id, subscriber_id], separators=(",", ":")).encode())
    signature = _b64(hmac.new(_key(), payload.encode(), hashlib.sha256).digest())
    return f"{payload}.{signature}"


def read_token(token: str) -> tuple[str, str, str]:
    """(product, org, subscriber) of a valid token; 401 for anything forged, truncated or malformed."""
    try:
        payload, signature = token.split(".")
        expected = _b64(hmac.new(_key(), payload.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(signature, expected):
            raise ValueError("bad signature")
        product, org_id, subscriber_id = json.loads(_unb64(payload))
        if not all(isinstance(x, str) and x for x in (product, org_id, subscriber_id)):
            raise ValueError("bad payload")
    except (ValueError, TypeError, UnicodeDecodeError):
        raise Unauthorized("Invalid or tampered unsubscribe link.") from None
    return product, org_id, subscriber_id


def unsubscribe_url(product: str, org_id: str, subscriber_id: str) -> str:
    base = current_app.config["PUBLIC_BASE_URL"].rstrip("/")
    return f"{base}{UNSUBSCRIBE_PATH}?token={quote(unsubscribe_token(product, org_id, subscriber_id))}"


def subscriber_by_token(token: str, *, unsubscribe: bool = False) -> NewsletterSubscriber:
    """The subscriber a signed link names (no login); with `unsubscribe`, unsubscribed (idempotent)."""
    product, org_id, subscriber_id = read_token(token)
    products.require(product)
    with db.product_session(product) as session:
        sub = session.scalars(select(NewsletterSubscriber).where(
            NewsletterSubscriber.org_id == org_id, NewsletterSubscriber.id == subscriber_id)).first()
        if sub is None:
            raise NotFound("Subscriber not found.")
        if unsubscribe:
            _mark_unsubscribed(sub)
    return sub


# --------------------------------------------------------------------------- issues


def send_issue(session: Session, tenant: Tenant, subject: str, body: str) -> EmailJob:
    """A bulk job to every active subscriber, each message with its own List-Unsubscribe link; 400
    VALIDATION_ERROR when there are more than NEWSLETTER_MAX_RECIPIENTS (nothing is queued)."""
    cap = max(0, int(current_app.config["NEWSLETTER_MAX_RECIPIENTS"]))
    active = tenant_select(NewsletterSubscriber, tenant.org_id).where(NewsletterSubscriber.status == "active")
    subs = session.execute(active.with_only_columns(NewsletterSubscriber.id, NewsletterSubscriber.email)
                           .order_by(NewsletterSubscriber.email).limit(cap + 1)).all()
    if len(subs) > cap:
        count = session.scalar(active.with_only_columns(func.count()).order_by(None))
        raise ValidationFailed(
            f"This issue would go to {count} active subscribers; at most {cap} per issue. Nothing was sent.",
            {"activeSubscribers": count, "maxRecipients": cap})
    deliveries = []
    for sub in subs:
        url = unsubscribe_url(tenant.product, tenant.org_id, sub.id)
        deliveries.append({"to": sub.email, "headers": {"List-Unsubscribe": f"<{url}>",
                                                        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}})
    return create_job(session, tenant, kind="newsletter", deliveries=deliveries, subject=subject, body=body)


def list_issues(limit: int = 50) -> list[EmailJob]:
    return list(db.session.scalars(tenant_select(EmailJob).where(EmailJob.kind == "newsletter")
                                   .order_by(EmailJob.created_at.desc()).limit(limit)))
