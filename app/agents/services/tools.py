"""Tool definitions (CRUD, by-ids).

The AgentTools embedded in agents, catalog skills and sub-agents are self-contained copies:
their `toolId` need not name a tool definition of the org, so nothing here checks it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.agents.models import ToolDefinition
from app.agents.services import paging
from app.agents.services.common import dumps, invalid, merge, titled
from app.agents.services.documents import DocumentStore
from app.db import db
from app.fields import schema_errors
from app.tenancy import Tenant, tenant_select

store = DocumentStore(ToolDefinition, key="toolDefinition", many_key="toolDefinitions", what="Tool definition",
                      conflicts={"uq_tool_definitions_org_id_name": "A tool definition with this name already exists."},
                      columns=lambda doc: {"name": doc["name"]})


def list_tool_definitions(*, limit: int | None = None, cursor: str | None = None) -> str:
    """`{toolDefinitions, nextCursor}`: a page of the caller's org's tool definitions, by name."""
    return store.list(limit=limit, cursor=cursor)


def get_tool_definition(tool_id: str) -> str:
    return store.get(tool_id)


def tool_definitions_by_ids(ids: list[str]) -> str:
    """The requested tool definitions in request order; unknown ids are simply absent."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return dumps({"toolDefinitions": []})
    paging.check_fits(ToolDefinition, ToolDefinition.doc, ToolDefinition.id.in_(wanted), what="ids")
    rows = db.session.execute(tenant_select(ToolDefinition).with_only_columns(ToolDefinition.id, ToolDefinition.doc)
                              .where(ToolDefinition.id.in_(wanted))).all()
    by_id = {row.id: row.doc for row in rows}
    return dumps({"toolDefinitions": [by_id[i] for i in wanted if i in by_id]})


def create_tool_definition(session: Session, tenant: Tenant, data: dict[str, Any]) -> str:
    return store.create(session, tenant, titled(data))


def update_tool_definition(session: Session, tenant: Tenant, tool_id: str, changes: dict[str, Any], *,
                           if_match=None) -> str:
    row = store.lock(session, tenant.org_id, tool_id)
    store.check_match(session, tenant.org_id, tool_id, if_match)
    doc = titled(merge(row.doc, changes))
    errors = schema_errors(doc.get("configSchema") or {}, doc.get("defaultConfig") or {})
    if errors:
        raise invalid("toolDefinition.defaultConfig", errors)
    return store.save(session, tenant, row, doc)


def delete_tool_definition(session: Session, tenant: Tenant, tool_id: str, *, if_match=None) -> dict:
    """Delete a tool definition. Agents keep their customised copies (AgentTools are copies)."""
    store.lock(session, tenant.org_id, tool_id)
    store.check_match(session, tenant.org_id, tool_id, if_match)
    return store.remove(session, tenant.org_id, tool_id)
