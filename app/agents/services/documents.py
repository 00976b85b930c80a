"""One store per registry table: every row holds a wire document (`doc`) plus the scalar columns
derived from it. Reads return the stored JSON text (lists a page at a time: app.agents.services.paging);
writes stamp the audit fields, keep the columns in step with the document, refuse a document larger
than REGISTRY_MAX_DOCUMENT_BYTES (every field has its own limit, but a hundred tools within theirs
could still add up) and turn unique-constraint violations into 409s.

Entity tags (app.preconditions): a registry document has no version column, so its tag is the md5 of
the representation GET sends (`{key: <stored JSON text>}`), computed by PostgreSQL over that very text
for writes (`etag_of`, under the write's row lock) and in Python over the bytes read (`etag_of_text`).
Every change of the document — including one made on the side, such as another widget becoming the
default — changes the tag (and every write does: it stamps `updatedAt`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from flask import current_app
from sqlalchemy import Text, cast, delete, func, literal, select
from sqlalchemy.orm import Session

from app.agents.services import paging
from app.agents.services.common import (
    SUCCESS,
    dumps,
    flush_or_conflict,
    load_for_update,
    new_id,
    one_doc_text,
    stamp_created,
    stamp_updated,
    utcnow,
    wrap_one,
)
from app.errors import ValidationFailed
from app.preconditions import etag, require_match
from app.tenancy import Tenant

Hook = Callable[[dict[str, Any]], None]


def etag_of_text(body: str) -> str:
    """The ETag of a document answered as `body` (what GET sends): the md5 of those bytes."""
    return etag(hashlib.md5(body.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest())


class DocumentStore:
    """CRUD of one table of the registry. Reads are the request's (its session and tenant); writes take
    the session (the caller's unit of work: they flush, never commit) and the acting tenant."""

    def __init__(self, model, *, key: str, many_key: str, what: str, conflicts: dict[str, str],
                 columns: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.model, self.key, self.many_key, self.what = model, key, many_key, what
        self.conflicts, self.columns = conflicts, columns

    # reads ------------------------------------------------------------------------------

    def list(self, *where, limit: int | None = None, cursor: str | None = None, list_id: str | None = None,
             filters: dict[str, Any] | None = None) -> str:
        """`{many_key: [...], nextCursor}`: a page of the org's documents matching `where`, by name.
        `list_id` and `filters` name what a cursor is valid for (default: the table)."""
        return paging.page(self.model, self.model.doc, self.many_key, list_id or self.many_key, *where,
                           limit=limit, cursor=cursor, filters=filters)

    def get(self, object_id: str) -> str:
        return self.find(self.model.id == object_id)

    def find(self, *where, what: str | None = None) -> str:
        """`{key: doc}` of the first document matching `where`, or 404."""
        return wrap_one(self.key, one_doc_text(self.model, what or self.what, *where))

    def lock(self, session: Session, org_id: str, object_id: str):
        """The org's row, locked for this transaction (404 otherwise)."""
        return load_for_update(session, org_id, self.model, object_id, self.what)

    # entity tags ------------------------------------------------------------------------

    def etag_of(self, session: Session, org_id: str, object_id: str) -> str:
        """The ETag of the stored document, computed by PostgreSQL over the text GET would send (after
        this transaction's writes, or under its row lock)."""
        body = literal(f'{{"{self.key}":') + cast(self.model.doc, Text) + literal("}")
        digest = session.scalar(select(func.md5(body)).where(self.model.org_id == org_id,
                                                              self.model.id == object_id))
        return etag(digest)

    def check_match(self, session: Session, org_id: str, object_id: str, expected) -> None:
        """412 unless If-Match (`expected`, None when absent) names the locked row's current tag."""
        if expected is not None:
            require_match(expected, self.etag_of(session, org_id, object_id), self.what.lower())

    # writes -----------------------------------------------------------------------------

    def create(self, session: Session, tenant: Tenant, doc: dict[str, Any], *, before: Hook | None = None) -> str:
        """Insert `doc` for `tenant` with a new id and creation stamps; `before` runs just before the insert."""
        moment = utcnow()
        doc.setdefault("id", new_id())
        stamp_created(doc, moment, tenant.user_id)
        if before is not None:
            before(doc)
        session.add(self.model(id=doc["id"], org_id=tenant.org_id, doc=doc, created_at=moment,
                               updated_at=moment, **self.columns(doc)))
        return self._flush(session, doc)

    def save(self, session: Session, tenant: Tenant, row, doc: dict[str, Any], *, before: Hook | None = None) -> str:
        """Replace `row`'s document with `doc` (creation stamps kept, update stamps refreshed)."""
        moment = utcnow()
        stamp_updated(doc, row.doc, moment, tenant.user_id)
        doc["id"] = row.id
        if before is not None:
            before(doc)
        for column, value in self.columns(doc).items():
            setattr(row, column, value)
        row.doc, row.updated_at = doc, moment
        return self._flush(session, doc)

    def remove(self, session: Session, org_id: str, object_id: str) -> dict:
        session.execute(delete(self.model).where(self.model.org_id == org_id, self.model.id == object_id))
        return SUCCESS

    def _flush(self, session: Session, doc: dict[str, Any]) -> str:
        text = dumps(doc)
        limit = int(current_app.config["REGISTRY_MAX_DOCUMENT_BYTES"])
        size = len(text.encode("utf-8", "surrogatepass"))
        if limit and size > limit:
            raise ValidationFailed(
                f"The {self.what.lower()} would be {size} bytes as JSON; at most {limit} "
                "(REGISTRY_MAX_DOCUMENT_BYTES). Make its largest fields (tools, skills, configs, metadata) smaller.",
                {"bytes": size, "maxBytes": limit})
        flush_or_conflict(session, self.conflicts)
        return wrap_one(self.key, text)
