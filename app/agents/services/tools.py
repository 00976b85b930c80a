"""Tool definitions (CRUD, by-ids) and validation of tool references embedded in agents,
catalog skills and sub-agents."""

from __future__ import annotations

from typing import Any

from app.agents.fields import schema_errors
from app.agents.models import ToolDefinition
from app.agents.services.common import dumps, existing_ids, invalid, merge, titled
from app.agents.services.documents import DocumentStore
from app.db import db
from app.tenancy import tenant_select

# Tools the platform itself provides to every org. An AgentTool with `isSystem: true` may name one
# of these instead of a tool definition of the org.
SYSTEM_TOOLS: dict[str, str] = {
    "system.knowledge_search": "Search the organization's knowledge base",
    "system.web_search": "Search the public web",
    "system.human_handoff": "Hand the conversation to a human agent",
    "system.csat_survey": "Ask the customer-satisfaction survey",
    "system.current_time": "Current date and time",
}
store = DocumentStore(ToolDefinition, key="toolDefinition", many_key="toolDefinitions", what="Tool definition",
                      conflicts={"uq_tool_definitions_org_id_name": "A tool definition with this name already exists."},
                      columns=lambda doc: {"name": doc["name"]})


def validate_tool_refs(tools: list[dict[str, Any]] | None, known: set[str] = frozenset(), *,
                       field: str = "tools") -> None:
    """Every tool must name a tool definition of the org or (with isSystem) a system tool.

    Tools whose toolId is in `known` (already on the stored object) are not re-checked: they are
    copies, and deleting their tool definition later must not make the owner unsaveable.
    """
    tools = tools or []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool["toolId"] in seen:
            raise invalid(f"{field}.{index}.toolId", f"Tool {tool['toolId']} is listed twice.")
        seen.add(tool["toolId"])
    to_check = {t["toolId"] for t in tools if t["toolId"] not in known}
    system = {t["toolId"] for t in tools if t.get("isSystem") and t["toolId"] in SYSTEM_TOOLS}
    missing = to_check - system - existing_ids(ToolDefinition, to_check - system)
    if missing:
        raise invalid(field, f"Unknown tool id(s): {', '.join(sorted(missing))}. A tool must reference a "
                             "tool definition of this organization or a system tool.",
                      unknownToolIds=sorted(missing))


def list_tool_definitions() -> str:
    """`{toolDefinitions}` of the caller's org, by name."""
    return store.list()


def get_tool_definition(tool_id: str) -> str:
    return store.get(tool_id)


def tool_definitions_by_ids(ids: list[str]) -> str:
    """The requested tool definitions in request order; unknown ids are simply absent."""
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return dumps({"toolDefinitions": []})
    rows = db.session.execute(tenant_select(ToolDefinition).with_only_columns(ToolDefinition.id, ToolDefinition.doc)
                              .where(ToolDefinition.id.in_(wanted))).all()
    by_id = {row.id: row.doc for row in rows}
    return dumps({"toolDefinitions": [by_id[i] for i in wanted if i in by_id]})


def create_tool_definition(data: dict[str, Any]) -> str:
    return store.create(titled(data))


def update_tool_definition(tool_id: str, changes: dict[str, Any]) -> str:
    row = store.lock(tool_id)
    doc = titled(merge(row.doc, changes))
    errors = schema_errors(doc.get("configSchema") or {}, doc.get("defaultConfig") or {})
    if errors:
        raise invalid("toolDefinition.defaultConfig", errors)
    return store.save(row, doc)


def delete_tool_definition(tool_id: str) -> dict:
    """Delete a tool definition. Agents keep their customised copies (AgentTools are copies)."""
    store.lock(tool_id)
    return store.remove(tool_id)
