"""Saved views of a definition."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, func, update
from sqlalchemy.orm import Session

from app.entities import budget as page_budget
from app.entities import cursor as keyset
from app.entities.filters import FieldResolver, parse_filters
from app.entities.models import EntityDefinition, EntityView
from app.entities.services.context import filter_context
from app.errors import NotFound, ValidationFailed
from app.tenancy import Tenant, tenant_select
from app.wire import iso, new_id, utcnow


def view_to_wire(v: EntityView, definition: EntityDefinition) -> dict[str, Any]:
    return {"id": v.id, "entityId": v.entity_id, "entityName": definition.name, "name": v.name, "type": v.type,
            "description": v.description, "columns": v.columns, "filters": v.filters, "sortBy": v.sort_by,
            "sortOrder": v.sort_order, "pageSize": v.page_size, "isDefault": v.is_default, "config": v.config,
            "createdAt": iso(v.created_at), "updatedAt": iso(v.updated_at), "createdBy": v.created_by,
            "updatedBy": v.updated_by}


def list_views(session: Session, definition: EntityDefinition) -> list[EntityView]:
    stmt = tenant_select(EntityView, definition.org_id).where(EntityView.entity_id == definition.id).order_by(
        EntityView.created_at, EntityView.id)
    return list(session.scalars(stmt))


# a view's bytes on a list page (app.entities.budget), measured by PostgreSQL: its unbounded columns
VIEW_SIZE = (func.octet_length(EntityView.name) + func.coalesce(func.octet_length(EntityView.description), 0)
             + func.coalesce(func.octet_length(cast(EntityView.columns, Text)), 0)
             + func.coalesce(func.octet_length(cast(EntityView.filters, Text)), 0)
             + func.coalesce(func.octet_length(cast(EntityView.config, Text)), 0) + page_budget.ITEM_FIXED_BYTES)


def list_views_page(session: Session, definition: EntityDefinition, *, limit: int | None = None,
                    cursor: str | None = None) -> tuple[list[EntityView], str | None]:
    """A page of `list_views` (by creation, then id) and the next page's cursor (None on the last): the
    entity store's keyset cursor, bound to the org and this definition's view list."""
    list_id = f"views:{definition.id}"
    digest = keyset.query_digest({})
    limit, budget, _servable = page_budget.bounds(limit, "ENTITY_LIST_DEFAULT_LIMIT", "ENTITY_LIST_MAX_BYTES")
    V = EntityView
    stmt = (tenant_select(V, definition.org_id).with_only_columns(V.id, V.created_at, VIEW_SIZE.label("size"))
            .where(V.entity_id == definition.id).order_by(V.created_at, V.id).limit(limit + 1))
    if cursor:
        position = keyset.decode(cursor, definition.org_id, list_id, digest, path="cursor", what="list")
        if not isinstance(position.key, datetime):
            raise ValidationFailed("Invalid cursor: not a cursor of this list.",
                                   {"fields": {"cursor": ["not a cursor of this list"]}})
        stmt = stmt.where(keyset.after(EntityView.created_at, EntityView.id, False, position))
    rows, more = page_budget.page_rows(session, V, stmt, (V.created_at, V.id), limit, budget)
    if not more:
        return rows, None
    last = rows[-1]
    return rows, keyset.encode(definition.org_id, list_id, digest, keyset.Position(0, last.created_at, last.id))


def owned_view(session: Session, definition: EntityDefinition, view_id: str) -> EntityView:
    view = session.scalar(tenant_select(EntityView, definition.org_id).where(EntityView.id == view_id,
                                                                             EntityView.entity_id == definition.id))
    if view is None:
        raise NotFound("View not found.")
    return view


def _check_view(definition: EntityDefinition, data: dict) -> None:
    """Columns, sort field and filters must make sense for the definition (400 naming the problem)."""
    ctx = filter_context(definition)
    resolver = FieldResolver(ctx.catalog)
    problems: dict[str, list[str]] = {}
    for column in data.get("columns") or []:
        try:
            resolver.resolve(column)
        except ValidationFailed:
            problems.setdefault("columns", []).append(f"unknown field '{column}'")
    if data.get("sortBy"):
        try:
            resolver.resolve(data["sortBy"])
        except ValidationFailed:
            problems.setdefault("sortBy", []).append(f"unknown field '{data['sortBy']}'")
    if problems:
        raise ValidationFailed("Invalid view.", {"fields": problems})
    if "filters" in data:
        parse_filters(data["filters"], ctx)


_VIEW_ATTRS = {"name": "name", "type": "type", "description": "description", "columns": "columns",
               "filters": "filters", "sortBy": "sort_by", "sortOrder": "sort_order", "pageSize": "page_size",
               "config": "config"}


def _apply_view(session: Session, tenant: Tenant, definition: EntityDefinition, view: EntityView,
                data: dict) -> None:
    _check_view(definition, data)
    for key, attr in _VIEW_ATTRS.items():
        if key in data:
            setattr(view, attr, data[key])
    view.updated_at = utcnow()
    view.updated_by = tenant.user_id
    if data.get("isDefault") is True:
        session.execute(update(EntityView).where(
            EntityView.org_id == definition.org_id, EntityView.entity_id == definition.id,
            EntityView.id != view.id).values(is_default=False))
        view.is_default = True
        definition.default_view_id = view.id
    elif data.get("isDefault") is False:
        view.is_default = False
        if definition.default_view_id == view.id:
            definition.default_view_id = None


def create_view(session: Session, tenant: Tenant, definition: EntityDefinition, data: dict) -> EntityView:
    """A saved view of the definition; `isDefault` makes it the definition's defaultViewId."""
    if not data.get("name"):
        raise ValidationFailed("Request validation failed.", {"fields": {"name": ["Missing data for required "
                                                                                 "field."]}})
    _check_view(definition, data)
    view = EntityView(id=new_id(), org_id=tenant.org_id, entity_id=definition.id, name=data["name"], type="table",
                      columns=[], filters={}, sort_order=-1, config={}, is_default=False, created_by=tenant.user_id,
                      created_at=utcnow())
    session.add(view)
    _apply_view(session, tenant, definition, view, data)
    session.flush()
    return view


def update_view(session: Session, tenant: Tenant, definition: EntityDefinition, view_id: str, data: dict) -> None:
    view = owned_view(session, definition, view_id)
    _apply_view(session, tenant, definition, view, data)
    session.flush()


def delete_view(session: Session, definition: EntityDefinition, view_id: str) -> None:
    view = owned_view(session, definition, view_id)
    if definition.default_view_id == view.id:
        definition.default_view_id = None
    session.delete(view)
    session.flush()
