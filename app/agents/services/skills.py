"""Catalog skills (CRUD by name, categories) and skill snapshots embedded in agents.

Attaching a catalog skill to an agent copies the skill's fields into the agent at that moment
(spec "Versioning" 4). The copy stays as it is when the catalog skill changes or is deleted; a
caller refreshes it by detaching and attaching the skill again.
"""

from __future__ import annotations

from typing import Any

from app.agents.fields import schema_errors
from app.agents.models import CatalogSkill
from app.agents.services.common import invalid, merge, prune
from app.agents.services.documents import DocumentStore
from app.agents.services.tools import validate_tool_refs
from app.db import db
from app.errors import NotFound
from app.tenancy import tenant_select

store = DocumentStore(CatalogSkill, key="skill", many_key="skills", what="Skill",
                      conflicts={"uq_skills_org_id_name": "A skill with this name already exists."},
                      columns=lambda doc: {"name": doc["name"], "category": doc["category"]})
SNAPSHOT_FIELDS = ("title", "description", "category", "slashCommand", "iconName", "systemPromptExtension")
SKILL_TOOL_FIELDS = ("toolId", "toolName", "title", "description", "type", "inputSchema", "configSchema",
                     "config", "enabled")


# --------------------------------------------------------------------------- catalog


def list_skills() -> str:
    return store.list()


def get_skill(skill_id: str) -> str:
    return store.get(skill_id)


def categories() -> dict[str, list[str]]:
    """Distinct categories of the caller's catalog skills, sorted."""
    stmt = (tenant_select(CatalogSkill).with_only_columns(CatalogSkill.category).distinct()
            .order_by(CatalogSkill.category))
    return {"categories": list(db.session.scalars(stmt))}


def _locked_by_name(name: str) -> CatalogSkill:
    skill = db.session.scalars(tenant_select(CatalogSkill).where(CatalogSkill.name == name).with_for_update()).first()
    if skill is None:
        raise NotFound(f"Skill '{name}' not found.")
    return skill


def _finish(doc: dict[str, Any]) -> dict[str, Any]:
    doc = prune({k: v for k, v in doc.items() if k != "persisted"})
    doc["persisted"] = True
    return doc


def create_skill(data: dict[str, Any]) -> str:
    validate_tool_refs(data.get("tools"))
    return store.create(_finish(data))


def update_skill(name: str, changes: dict[str, Any]) -> str:
    """Update the catalog skill `name`. Agents that attached it keep their snapshot."""
    row = _locked_by_name(name)
    validate_tool_refs(changes.get("tools"), {t["toolId"] for t in row.doc.get("tools") or []})
    return store.save(row, _finish(merge(row.doc, changes)))


def delete_skill(name: str) -> dict:
    """Delete the catalog skill `name`; agents keep their snapshots of it."""
    return store.remove(_locked_by_name(name).id)


# --------------------------------------------------------------------------- snapshots


def snapshot_of(catalog: dict[str, Any]) -> dict[str, Any]:
    """The denormalised copy of a catalog skill that an agent stores."""
    snap = {"skillId": catalog["id"], "skillName": catalog["name"]}
    snap.update({k: catalog[k] for k in SNAPSHOT_FIELDS if catalog.get(k) is not None})
    snap["tools"] = [prune({k: tool.get(k) for k in SKILL_TOOL_FIELDS}) for tool in catalog.get("tools") or []]
    return snap


def _catalog_docs(ids: set[str]) -> dict[str, dict]:
    if not ids:
        return {}
    rows = db.session.execute(tenant_select(CatalogSkill).with_only_columns(CatalogSkill.id, CatalogSkill.doc)
                              .where(CatalogSkill.id.in_(ids))).all()
    return {row.id: row.doc for row in rows}


def _customise_tools(base: list[dict], requested: list[dict] | None, where: str) -> list[dict]:
    """Apply the caller's per-tool `enabled` / `config` to the snapshot's tools."""
    if requested is None:
        return base
    by_id = {t["toolId"]: t for t in base}
    for index, tool in enumerate(requested):
        if tool["toolId"] not in by_id:
            raise invalid(f"{where}.tools.{index}.toolId",
                          f"Tool {tool['toolId']} is not part of this skill; attach the skill again to "
                          "pick up catalog changes.")
    out = []
    for index, snap in enumerate(base):
        custom = next((t for t in requested if t["toolId"] == snap["toolId"]), None)
        tool = dict(snap)
        if custom is not None:
            tool["enabled"] = custom["enabled"]
            if custom.get("config") is not None:
                tool["config"] = custom["config"]
        errors = schema_errors(tool.get("configSchema") or {}, tool.get("config") or {})
        if errors:
            raise invalid(f"{where}.tools.{index}.config", errors)
        out.append(tool)
    return out


def attach_skills(requested: list[dict] | None, current: list[dict] | None, *,
                  keep_sent_snapshots: bool = False) -> list[dict]:
    """The agent's new `skills`: stored snapshots for skills it already has, fresh catalog copies
    for newly attached ones (or, on import, the sent snapshots), each with the caller's `enabled`,
    `order` and per-tool settings; sorted by `order`. Unknown catalog skill ids are a 400."""
    requested = requested or []
    current_by_id = {s["skillId"]: s for s in current or []}
    ids = [s["skillId"] for s in requested]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise invalid("skills", f"Skill(s) attached twice: {', '.join(duplicates)}.")
    new_ids = {i for i in ids if i not in current_by_id}
    catalog = _catalog_docs(new_ids)
    missing = sorted(new_ids - set(catalog))
    if missing:
        raise invalid("skills", f"Unknown skill id(s): {', '.join(missing)}.", unknownSkillIds=missing)
    result = []
    for index, entry in enumerate(requested):
        skill_id = entry["skillId"]
        if skill_id in current_by_id:
            base = current_by_id[skill_id]
        elif keep_sent_snapshots and entry.get("skillName"):
            base = prune(entry)  # an exported snapshot: restored as it was exported
        else:
            base = snapshot_of(catalog[skill_id])
        snap = {k: v for k, v in base.items() if k not in ("enabled", "order", "tools")}
        snap["tools"] = _customise_tools(list(base.get("tools") or []),
                                         None if keep_sent_snapshots else entry.get("tools"), f"skills.{index}")
        snap.update(enabled=entry["enabled"], order=entry["order"])
        result.append(snap)
    return sorted(result, key=lambda s: s["order"])
