"""Building blocks shared by the registry services: ids, timestamps, audit stamps, reads of
stored JSON documents, locks, and turning constraint violations into 409s."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db import db
from app.errors import Conflict, NotFound, ValidationFailed
from app.tenancy import Tenant, tenant_select
from app.wire import SUCCESS, iso, new_id, utcnow

# ids, the clock, the timestamp format and SUCCESS are the wire layer's (app.wire), used by every resource module
__all__ = ["SUCCESS", "iso", "new_id", "utcnow"]


def prune(doc: dict[str, Any]) -> dict[str, Any]:
    """Drop unset optional fields (None): documents carry only what is set."""
    return {k: v for k, v in doc.items() if v is not None}


def titled(doc: dict[str, Any]) -> dict[str, Any]:
    """`prune`, and a missing `title` defaults to the machine `name`."""
    doc = prune(doc)
    doc.setdefault("title", doc["name"])
    return doc


def stamp_created(doc: dict[str, Any], moment: datetime, user: str) -> None:
    """Fill the audit fields of a new document (`user`: the acting tenant's user)."""
    doc.update(createdAt=iso(moment), updatedAt=iso(moment), createdBy=user, updatedBy=user)


def stamp_updated(doc: dict[str, Any], previous: dict[str, Any], moment: datetime, user: str) -> None:
    """Keep the creation stamps of `previous`, refresh the update stamps (`user`: the acting tenant's user)."""
    doc.update(createdAt=previous["createdAt"], createdBy=previous["createdBy"],
               updatedAt=iso(moment), updatedBy=user)


def merge(previous: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """PUT semantics: named top-level fields replace the stored ones; null clears an optional field."""
    return prune({**previous, **changes})


# --------------------------------------------------------------------------- reads of stored JSON


def doc_texts(model, *where, order_by=None) -> list[str]:
    """The stored documents (JSON text, no re-serialisation) of the caller's org."""
    stmt = tenant_select(model).with_only_columns(cast(model.doc, Text)).where(*where)
    if order_by is not None:
        stmt = stmt.order_by(order_by)
    return list(db.session.scalars(stmt))


def one_doc_text(model, what: str, *where) -> str:
    texts = doc_texts(model, *where)
    if not texts:
        raise NotFound(f"{what} not found.")
    return texts[0]


def wrap_one(key: str, doc_text: str) -> str:
    return f'{{"{key}":{doc_text}}}'


def wrap_many(key: str, doc_texts_: Iterable[str]) -> str:
    return f'{{"{key}":[{",".join(doc_texts_)}]}}'


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def load_for_update(session: Session, org_id: str, model, object_id: str, what: str):
    """The org's object, row-locked for the rest of the transaction (404 for other orgs)."""
    obj = session.scalars(tenant_select(model, org_id).where(model.id == object_id).with_for_update()).first()
    if obj is None:
        raise NotFound(f"{what} not found.")
    return obj


def existing_ids(session: Session, org_id: str, model, ids: Iterable[str]) -> set[str]:
    ids = list(ids)
    if not ids:
        return set()
    return set(session.scalars(tenant_select(model, org_id).with_only_columns(model.id).where(model.id.in_(ids))))


def lock_org(session: Session, tenant: Tenant, kind: str) -> None:
    """Serialise writes of `kind` within the caller's org and product (transaction-scoped lock).

    The lock is taken before any row lock, so concurrent writers queue here instead of
    deadlocking on each other's rows.
    """
    key = f"agent-registry:{kind}:{tenant.product}:{tenant.org_id}"
    session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(key, 0))))


def flush_or_conflict(session: Session, messages: dict[str, str]) -> None:
    """Flush; a violated unique constraint named in `messages` becomes 409 with that message."""
    try:
        session.flush()
    except IntegrityError as exc:  # the unit of work (the request's) rolls back
        constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
        if constraint in messages:
            raise Conflict(messages[constraint]) from None
        raise


def invalid(field: str, message: str | list[str], **extra: Any) -> ValidationFailed:
    """A VALIDATION_ERROR whose details name the field, like schema failures do."""
    details: dict[str, Any] = {"fields": {field: message if isinstance(message, list) else [message]}}
    details.update(extra)
    return ValidationFailed(message if isinstance(message, str) else message[0], details)
