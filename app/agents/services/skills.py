"""Catalog skills (CRUD by name, categories) and skill snapshots embedded in agents.

Attaching a catalog skill to an agent copies the skill's fields into the agent at that moment (a
snapshot: agents do not change under their owners' feet when the catalog does). The copy stays as
it is when the catalog skill changes or is deleted; a
caller refreshes it by detaching and attaching the skill again. An embedded skill is a
self-contained document: the caller may customise it (its tools need not match the
catalog skill's), and a skillId that names no catalog skill is kept as sent (a custom or imported skill).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.agents.models import CatalogSkill
from app.agents.services.common import invalid, merge, prune
from app.agents.services.documents import DocumentStore
from app.db import db
from app.errors import NotFound
from app.fields import schema_errors
from app.tenancy import Tenant, tenant_select

store = DocumentStore(CatalogSkill, key="skill", many_key="skills", what="Skill",
                      conflicts={"uq_skills_org_id_name": "A skill with this name already exists."},
                      columns=lambda doc: {"name": doc["name"], "category": doc["category"]})
SNAPSHOT_FIELDS = ("title", "description", "category", "slashCommand", "iconName", "systemPromptExtension")
SKILL_TOOL_FIELDS = ("toolId", "toolName", "title", "description", "type", "inputSchema", "configSchema",
                     "config", "enabled")


# --------------------------------------------------------------------------- catalog


def list_skills(*, limit: int | None = None, cursor: str | None = None) -> str:
    return store.list(limit=limit, cursor=cursor)


def get_skill(skill_id: str) -> str:
    return store.get(skill_id)


def get_skill_by_name(name: str) -> str:
    return store.find(CatalogSkill.name == name, what=f"Skill '{name}'")


def categories() -> list[str]:
    """Distinct categories of the caller's catalog skills, sorted (answered as a bare `string[]`, no
    wrapper object)."""
    stmt = (tenant_select(CatalogSkill).with_only_columns(CatalogSkill.category).distinct()
            .order_by(CatalogSkill.category))
    return list(db.session.scalars(stmt))


def _locked_by_name(session: Session, org_id: str, name: str) -> CatalogSkill:
    skill = session.scalars(tenant_select(CatalogSkill, org_id).where(CatalogSkill.name == name)
                            .with_for_update()).first()
    if skill is None:
        raise NotFound(f"Skill '{name}' not found.")
    return skill


def _finish(doc: dict[str, Any]) -> dict[str, Any]:
    doc = prune({k: v for k, v in doc.items() if k != "persisted"})
    doc["persisted"] = True
    return doc


def create_skill(session: Session, tenant: Tenant, data: dict[str, Any]) -> str:
    return store.create(session, tenant, _finish(data))


def update_skill(session: Session, tenant: Tenant, name: str, changes: dict[str, Any], *, if_match=None) -> str:
    """Update the catalog skill `name`. Agents that attached it keep their snapshot."""
    row = _locked_by_name(session, tenant.org_id, name)
    store.check_match(session, tenant.org_id, row.id, if_match)
    return store.save(session, tenant, row, _finish(merge(row.doc, changes)))


def delete_skill(session: Session, tenant: Tenant, name: str, *, if_match=None) -> dict:
    """Delete the catalog skill `name`; agents keep their snapshots of it."""
    row = _locked_by_name(session, tenant.org_id, name)
    store.check_match(session, tenant.org_id, row.id, if_match)
    return store.remove(session, tenant.org_id, row.id)


# --------------------------------------------------------------------------- snapshots


def snapshot_of(catalog: dict[str, Any]) -> dict[str, Any]:
    """The denormalised copy of a catalog skill that an agent stores."""
    snap = {"skillId": catalog["id"], "skillName": catalog["name"]}
    snap.update({k: catalog[k] for k in SNAPSHOT_FIELDS if catalog.get(k) is not None})
    snap["tools"] = [prune({k: tool.get(k) for k in SKILL_TOOL_FIELDS}) for tool in catalog.get("tools") or []]
    return snap


def _catalog_docs(session: Session, org_id: str, ids: set[str]) -> dict[str, dict]:
    if not ids:
        return {}
    rows = session.execute(tenant_select(CatalogSkill, org_id).with_only_columns(CatalogSkill.id, CatalogSkill.doc)
                           .where(CatalogSkill.id.in_(ids))).all()
    return {row.id: row.doc for row in rows}


def _customise_tools(base: list[dict], requested: list[dict], where: str) -> list[dict]:
    """The skill's tools as the caller sent them, each merged over the base tool with the same
    toolId (so `{toolId, toolName, enabled}` keeps the copied schemas); a toolId the base does not
    have is a custom tool, taken as sent. Every `config` must validate against its `configSchema`."""
    pool = list(base)
    out = []
    for index, tool in enumerate(requested):
        match = next((i for i, candidate in enumerate(pool) if candidate.get("toolId") == tool["toolId"]), None)
        merged = {**(pool.pop(match) if match is not None else {}), **prune(tool)}
        errors = schema_errors(merged.get("configSchema") or {}, merged.get("config") or {})
        if errors:
            raise invalid(f"{where}.tools.{index}.config", errors)
        out.append(merged)
    return out


def attach_skills(session: Session, org_id: str, requested: list[dict] | None, current: list[dict] | None, *,
                  restore: bool = False) -> list[dict]:
    """The agent's new `skills`, sorted by `order`.

    Each entry starts from a base: the agent's stored snapshot of that skill, else a fresh copy of
    the catalog skill, else nothing (a skillId unknown to the catalog: a custom or imported skill).
    What the caller sent overrides the base field by field, and a sent `tools` list is the skill's
    tool list (see `_customise_tools`). With `restore` (import), an entry that carries `skillName`
    is an exported snapshot and is taken exactly as sent.
    """
    requested = requested or []
    current_by_id = {s["skillId"]: s for s in current or []}
    ids = [s["skillId"] for s in requested]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise invalid("skills", f"Skill(s) attached twice: {', '.join(duplicates)}.")
    catalog = _catalog_docs(session, org_id, {i for i in ids if i not in current_by_id})
    result = []
    for index, entry in enumerate(requested):
        skill_id = entry["skillId"]
        if restore and entry.get("skillName"):
            base = {}
        elif skill_id in current_by_id:
            base = current_by_id[skill_id]
        elif skill_id in catalog:
            base = snapshot_of(catalog[skill_id])
        else:
            base = {}
        snap = {**base, **prune(entry)}
        base_tools = list(base.get("tools") or [])
        sent_tools = entry.get("tools")
        snap["tools"] = _customise_tools(base_tools, base_tools if sent_tools is None else sent_tools,
                                         f"skills.{index}")
        result.append(snap)
    return sorted(result, key=lambda s: s["order"])
