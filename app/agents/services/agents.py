"""Agents: CRUD, default agent, summary, by-name, export/import, status transitions.

Writes of agents in one org are serialised by a transaction-scoped advisory lock (`lock_org`),
taken before any row lock. That makes "setting isDefault on one clears it on the others" atomic
under concurrent requests, and the partial unique index `uq_agents_default` guarantees it in the
database whatever happens. Reads return the stored JSON documents as text.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.agents.models import Agent, SubAgent
from app.agents.services import documents, paging
from app.agents.services.common import (
    existing_ids,
    invalid,
    iso,
    lock_org,
    merge,
    prune,
    utcnow,
)
from app.agents.services.documents import DocumentStore
from app.agents.services.prompts import apply_system_prompt
from app.agents.services.skills import attach_skills
from app.errors import Conflict
from app.fields import schema_errors
from app.tenancy import Tenant, tenant_select

# Allowed status changes (staying in the same status is always allowed). A draft is published
# (active) or discarded (archived); active and inactive toggle; only an inactive agent is archived;
# an archived agent comes back only as inactive, to be re-activated deliberately.
TRANSITIONS: dict[str, frozenset[str]] = {
    "draft": frozenset({"active", "archived"}),
    "active": frozenset({"inactive"}),
    "inactive": frozenset({"active", "archived"}),
    "archived": frozenset({"inactive"}),
}
SUMMARY_ALWAYS = ("id", "name", "title", "type", "status", "isDefault", "isPublic", "scope")
SUMMARY_OPTIONAL = ("description", "iconName", "provider", "model", "capabilities", "samplePrompts", "metadata")
SUMMARY_SKILL_FIELDS = ("skillId", "skillName", "title", "category", "slashCommand", "iconName", "enabled", "order")
_LOCK = "agents"


def _columns(doc: dict[str, Any]) -> dict[str, Any]:
    return {"name": doc["name"], "title": doc["title"], "type": doc["type"], "status": doc["status"],
            "is_default": doc["isDefault"], "sub_agent_ids": list(doc.get("subAgentIds") or []),
            "summary": summary_of(doc)}


store = DocumentStore(Agent, key="agent", many_key="agents", what="Agent",
                      conflicts={"uq_agents_org_id_name": "An agent with this name already exists."},
                      columns=_columns)


# --------------------------------------------------------------------------- reads


def _filters(status: str | None = None, type_: str | None = None, is_default: bool | None = None) -> list:
    where = []
    if status is not None:
        where.append(Agent.status == status)
    if type_ is not None:
        where.append(Agent.type == type_)
    if is_default is not None:
        where.append(Agent.is_default.is_(is_default))
    return where


def list_agents(*, limit: int | None = None, cursor: str | None = None, **filters) -> str:
    """`{agents, nextCursor}`: a page of the agents of the caller's org and product matching `filters`,
    by name (app.agents.services.paging)."""
    return store.list(*_filters(**filters), limit=limit, cursor=cursor, filters=filters)


def list_summaries(*, limit: int | None = None, cursor: str | None = None, **filters) -> str:
    """`{agents, nextCursor}` of AgentSummary (precomputed at write time) matching `filters`, by name."""
    return paging.page(Agent, Agent.summary, "agents", "agents/summary", *_filters(**filters),
                       limit=limit, cursor=cursor, filters=filters)


def get_agent(agent_id: str) -> str:
    return store.get(agent_id)


def get_agent_by_name(name: str) -> str:
    return store.find(Agent.name == name, what=f"Agent '{name}'")


def get_default_agent() -> str:
    return store.find(Agent.is_default.is_(True), what="Default agent (none is set)")


# --------------------------------------------------------------------------- entity tags


def etag_of_text(body: str) -> str:
    """The ETag of an agent answered as `body` (`{"agent": <stored JSON text>}`, what GET sends)."""
    return documents.etag_of_text(body)


def etag_of(session: Session, org_id: str, agent_id: str) -> str:
    """The ETag of the stored agent (DocumentStore.etag_of)."""
    return store.etag_of(session, org_id, agent_id)


# --------------------------------------------------------------------------- writes


def create_agent(session: Session, tenant: Tenant, data: dict[str, Any]) -> str:
    """Create an agent from a validated Partial Agent (schema defaults already applied)."""
    lock_org(session, tenant, _LOCK)
    doc = _prepare(session, tenant, dict(data), previous=None, prompt_sent=bool(data.get("systemPrompt")))
    _set_skills(doc, data.get("skills"), attach_skills(session, tenant.org_id, data.get("skills"), []))
    return store.create(session, tenant, doc, before=_single_default(session, tenant, None))


def update_agent(session: Session, tenant: Tenant, agent_id: str, changes: dict[str, Any], *, if_match=None) -> str:
    """Apply a Partial Agent: named top-level fields replace the stored ones, null clears. A stale
    If-Match (`if_match`) is 412, compared with the row locked for the update."""
    lock_org(session, tenant, _LOCK)
    row = store.lock(session, tenant.org_id, agent_id)
    store.check_match(session, tenant.org_id, agent_id, if_match)
    previous = row.doc
    doc = merge(previous, changes)
    _check_transition(previous["status"], doc["status"])
    if "type" in changes and "subType" not in changes and previous.get("subType") == previous["type"]:
        doc["subType"] = doc["type"]  # subType followed type: keep following it
    doc = _prepare(session, tenant, doc, previous=previous, prompt_sent="systemPrompt" in changes)
    if "skills" in changes:
        _set_skills(doc, changes.get("skills"),
                    attach_skills(session, tenant.org_id, changes.get("skills"), previous.get("skills")))
    return store.save(session, tenant, row, doc, before=_single_default(session, tenant, row))


def delete_agent(session: Session, tenant: Tenant, agent_id: str, *, if_match=None) -> dict:
    """Delete an agent; its widgets go with it (ON DELETE CASCADE). A stale If-Match is 412."""
    store.lock(session, tenant.org_id, agent_id)
    store.check_match(session, tenant.org_id, agent_id, if_match)
    return store.remove(session, tenant.org_id, agent_id)


def export_agent(agent_id: str) -> str:
    """The full Agent, as stored (import accepts this body unchanged)."""
    return get_agent(agent_id)


def import_agent(session: Session, tenant: Tenant, data: dict[str, Any], *, overwrite: bool) -> tuple[str, bool]:
    """Create an agent from a full Agent; its name taken → 409, or replaced with `overwrite`.
    Returns the `{agent}` body and whether a new agent was created.

    Server fields are re-filled: a new id (or, when overwriting, the replaced agent's id and
    creation stamps), this org and product, and this caller. Skill snapshots and tools are restored
    as exported: they are self-contained, so the importing org needs no matching catalog skills or
    tool definitions (only `subAgentIds` must name sub-agents of the org).
    """
    lock_org(session, tenant, _LOCK)
    existing = session.scalars(tenant_select(Agent, tenant.org_id).where(Agent.name == data["name"])
                               .with_for_update()).first()
    if existing is not None and not overwrite:
        raise Conflict(f"An agent named '{data['name']}' already exists; use ?overwrite=true to replace it.",
                       {"agentId": existing.id})
    doc = _prepare(session, tenant, dict(data), previous=data, prompt_sent=False)
    _set_skills(doc, data.get("skills"), attach_skills(session, tenant.org_id, data.get("skills"), [], restore=True))
    if existing is None:
        return store.create(session, tenant, doc, before=_single_default(session, tenant, None)), True
    return store.save(session, tenant, existing, doc, before=_single_default(session, tenant, existing)), False


# --------------------------------------------------------------------------- helpers


def lock_agents(session: Session, tenant: Tenant) -> None:
    """Take the org's agent-write lock (other services that change agents or what they reference)."""
    lock_org(session, tenant, _LOCK)


def _prepare(session: Session, tenant: Tenant, doc: dict[str, Any], *, previous: dict[str, Any] | None,
             prompt_sent: bool) -> dict[str, Any]:
    """Defaults that depend on other fields, cross-field rules and reference checks."""
    doc = prune(doc)
    doc.setdefault("subType", doc["type"])
    if doc["type"] == "react":
        react = {"provider": doc["provider"], "model": doc["model"], "temperature": doc["temperature"],
                 "maxTokens": doc["maxTokens"], "maxIterations": 10}
        doc["reactConfig"] = {**react, **prune(doc.get("reactConfig") or {})}
    if doc["scope"] == "user" and not doc.get("scopeId"):
        doc["scopeId"] = tenant.user_id
    if doc["scope"] in ("team", "custom") and not doc.get("scopeId"):
        raise invalid("scopeId", f"scopeId is required when scope is '{doc['scope']}'.")
    if doc["scope"] == "org":
        doc.pop("scopeId", None)
    if doc["isDefault"] and doc["status"] == "archived":
        raise Conflict("An archived agent cannot be the default agent.")
    _check_config(doc)
    _check_sub_agents(session, tenant.org_id, doc.get("subAgentIds"))
    apply_system_prompt(doc, previous=previous, prompt_sent=prompt_sent, moment_iso=iso(utcnow()))
    return doc


def _set_skills(doc: dict[str, Any], sent: list[dict] | None, skills: list[dict]) -> None:
    """The agent's `skills` as attached; a list sent empty stays an empty list (echoed like every other
    list field), null or absent leaves the field unset."""
    if sent is None:
        doc.pop("skills", None)
    else:
        doc["skills"] = skills


def _check_config(doc: dict[str, Any]) -> None:
    errors = schema_errors(doc.get("configSchema") or {}, doc.get("config") or {})
    if errors:
        raise invalid("config", errors)


def _check_sub_agents(session: Session, org_id: str, ids: list[str] | None) -> None:
    ids = ids or []
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise invalid("subAgentIds", f"Sub-agent(s) listed twice: {', '.join(duplicates)}.")
    missing = sorted(set(ids) - existing_ids(session, org_id, SubAgent, ids))
    if missing:
        raise invalid("subAgentIds", f"Unknown sub-agent id(s): {', '.join(missing)}.", unknownSubAgentIds=missing)


def _check_transition(old: str, new: str) -> None:
    if old != new and new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(TRANSITIONS[old]))
        raise Conflict(f"An agent cannot go from '{old}' to '{new}'; from '{old}' it can go to: {allowed}.",
                       {"from": old, "to": new, "allowed": sorted(TRANSITIONS[old])})


def summary_of(doc: dict[str, Any]) -> dict[str, Any]:
    """AgentSummary: the eight identity fields always, the optional ones when set (non-empty)."""
    summary = {k: doc[k] for k in SUMMARY_ALWAYS}
    summary.update({k: doc[k] for k in SUMMARY_OPTIONAL if doc.get(k) not in (None, "", [], {})})
    if doc.get("skills"):
        summary["skills"] = [{k: s[k] for k in SUMMARY_SKILL_FIELDS if s.get(k) is not None} for s in doc["skills"]]
    return summary


def _clear_other_defaults(session: Session, org_id: str, keep_id: str) -> None:
    """Unset isDefault on every other agent of the org (under the org's agent lock)."""
    others = session.scalars(tenant_select(Agent, org_id).where(Agent.is_default.is_(True), Agent.id != keep_id)
                             .with_for_update()).all()
    for other in others:
        doc = {**other.doc, "isDefault": False}
        session.execute(update(Agent).where(Agent.org_id == other.org_id, Agent.id == other.id)
                           .values(is_default=False, doc=doc, summary=summary_of(doc)))


def _single_default(session: Session, tenant: Tenant, previous: Agent | None):
    """`before` hook: fill the tenant fields, and an agent becoming the default unsets the others
    first (under the org's agent lock, so two such requests cannot interleave)."""

    def hook(doc: dict[str, Any]) -> None:
        doc.update(orgId=tenant.org_id, product=tenant.product)
        if doc["isDefault"] and not (previous is not None and previous.is_default):
            _clear_other_defaults(session, tenant.org_id, doc["id"])

    return hook


def remove_sub_agent_references(session: Session, tenant: Tenant, sub_agent_id: str, moment: datetime) -> None:
    """Drop `sub_agent_id` from every agent of the org that lists it (sub-agent force delete).

    The caller holds the org's agent lock (`lock_agents`)."""
    rows = session.scalars(tenant_select(Agent, tenant.org_id).where(Agent.sub_agent_ids.contains([sub_agent_id]))
                           .with_for_update()).all()
    user = tenant.user_id
    for row in rows:
        doc = {**row.doc, "subAgentIds": [i for i in row.doc.get("subAgentIds", []) if i != sub_agent_id],
               "updatedAt": iso(moment), "updatedBy": user}
        for column, value in _columns(doc).items():
            setattr(row, column, value)
        row.doc, row.updated_at = doc, moment


def agents_referencing_sub_agent(session: Session, org_id: str, sub_agent_id: str) -> list[dict[str, str]]:
    stmt = (tenant_select(Agent, org_id).with_only_columns(Agent.id, Agent.name)
            .where(Agent.sub_agent_ids.contains([sub_agent_id])).order_by(Agent.name))
    return [{"id": row.id, "name": row.name} for row in session.execute(stmt)]
