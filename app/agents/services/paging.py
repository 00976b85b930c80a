"""Pages of the registry's lists: `limit` + `nextCursor`, bounded by count and by bytes.

A list answers `{<key>: [...], "nextCursor": <string or null>}` in name order. The cursor is the entity
store's keyset cursor (app.entities.cursor: signed, bound to the org, the list and its filters), keyed
by (name, id), so a walk over the pages neither repeats nor skips a row while others are inserted or
deleted.

A page holds at most `limit` documents (REGISTRY_LIST_DEFAULT_LIMIT, at most REGISTRY_LIST_MAX_LIMIT)
and ends before the document that would take it past REGISTRY_LIST_MAX_BYTES: the sizes are measured
by PostgreSQL (one query, a running sum over the page), so a document that does not go on this page is
not even sent to the app. The first document of a page always goes on it, however large, so a walk
always moves on. A document larger than a whole response (MAX_RESPONSE_BYTES less an allowance for the
wrapper) — only a row stored before the field limits existed can be — is never served in a list: the
page names it in `omitted` (`{id, name, bytes}`) and goes on past it, so one such row cannot make
the list unreadable; the caller can still delete it or shrink it with a PUT.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import Text, case, cast, func, select

from app.db import db
from app.entities import budget as page_budget
from app.entities import cursor as keyset
from app.errors import PayloadTooLarge
from app.tenancy import current_org, tenant_select

PATH = "cursor"


def _digest(list_id: str, filters: dict[str, Any]) -> str:
    shape = {"list": list_id, "filters": {k: v for k, v in sorted(filters.items()) if v is not None}}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _bounds(limit: int | None) -> tuple[int, int, int]:
    """(limit, page byte budget, largest document a list may serve): app.entities.budget's rule."""
    return page_budget.bounds(limit, "REGISTRY_LIST_DEFAULT_LIMIT", "REGISTRY_LIST_MAX_BYTES")


def page(model, column, key: str, list_id: str, *where, limit: int | None = None, cursor: str | None = None,
         filters: dict[str, Any] | None = None) -> str:
    """`{key: [...], nextCursor}` (and `omitted` when a document was too large to serve): one page of
    the caller's rows of `model` matching `where`, each as the JSON text of `column`, by name."""
    org = current_org()
    digest = _digest(list_id, filters or {})
    limit, budget, servable = _bounds(limit)
    conditions = list(where)
    if cursor:
        position = keyset.decode(cursor, org, list_id, digest, path=PATH, what="list")
        conditions.append(keyset.after(model.name, model.id, False, position))

    rows = (tenant_select(model).with_only_columns(model.id, model.name, cast(column, Text).label("body"))
            .where(*conditions).order_by(model.name, model.id).limit(limit + 1).subquery())
    size = func.octet_length(rows.c.body)
    order = (rows.c.name, rows.c.id)
    # bytes of the page up to and including this row (rows too large to serve count for nothing)
    running = page_budget.running_bytes(size, order, servable)
    sized = select(rows.c.id, rows.c.name, rows.c.body, size.label("size"), running.label("running"),
                   func.row_number().over(order_by=order).label("n")).subquery()
    on_page = page_budget.on_page(sized.c.n, sized.c.size, sized.c.running, limit, budget, servable)
    stmt = (select(sized.c.id, sized.c.name, sized.c.size, sized.c.n, case((on_page, sized.c.body)).label("body"))
            .order_by(sized.c.name, sized.c.id))

    texts: list[str] = []
    omitted: list[dict[str, Any]] = []
    last, more = None, False
    for row in db.session.execute(stmt):
        if row.n > limit:
            more = True
            break
        if row.body is None:
            if row.size > servable:  # stored before the limits: named, skipped
                omitted.append({"id": row.id, "name": row.name, "bytes": row.size})
                last = row
                continue
            more = True  # the page is full (bytes)
            break
        texts.append(row.body)
        last = row
    next_cursor = None
    if more and last is not None:
        next_cursor = keyset.encode(org, list_id, digest, keyset.Position(0, last.name, last.id))
    body = f'{{"{key}":[{",".join(texts)}],"nextCursor":{json.dumps(next_cursor)}'
    if omitted:
        body += ',"omitted":' + json.dumps(omitted, ensure_ascii=False, separators=(",", ":"))
    return body + "}"


def check_fits(model, column, *where, what: str) -> None:
    """413 before loading anything when the caller's rows matching `where` would not fit in one response
    (a list that is not paged, e.g. tool definitions by ids): their sizes are summed by PostgreSQL."""
    _, _, servable = _bounds(1)
    stmt = tenant_select(model).with_only_columns(func.coalesce(func.sum(func.octet_length(cast(column, Text))), 0))
    total = int(db.session.scalar(stmt.where(*where)))
    if total > servable:
        raise PayloadTooLarge(f"The answer would be {total} bytes, more than one response may carry; ask for fewer "
                              f"{what}.", {"responseBytes": total, "maxResponseBytes": servable})
