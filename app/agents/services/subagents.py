"""Sub-agents: CRUD; deleting one that agents reference is a 409 unless forced."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete

from app.agents.models import SubAgent
from app.agents.services.agents import agents_referencing_sub_agent, lock_agents, remove_sub_agent_references
from app.agents.services.common import (
    SUCCESS,
    doc_texts,
    dumps,
    flush_or_conflict,
    load_for_update,
    merge,
    new_id,
    one_doc_text,
    prune,
    stamp_created,
    stamp_updated,
    utcnow,
    wrap_many,
    wrap_one,
)
from app.agents.services.tools import validate_tool_refs
from app.db import db
from app.errors import Conflict
from app.tenancy import current_org

_NAME_TAKEN = {"uq_sub_agents_org_id_name": "A sub-agent with this name already exists."}


def _finish(doc: dict[str, Any]) -> dict[str, Any]:
    doc = prune(doc)
    doc.setdefault("title", doc["name"])
    return doc


def list_sub_agents() -> str:
    return wrap_many("subAgents", doc_texts(SubAgent, order_by=SubAgent.name))


def get_sub_agent(sub_agent_id: str) -> str:
    return wrap_one("subAgent", one_doc_text(SubAgent, "Sub-agent", SubAgent.id == sub_agent_id))


def create_sub_agent(data: dict[str, Any]) -> str:
    validate_tool_refs(data.get("tools"), field="subAgent.tools")
    moment = utcnow()
    doc = _finish({**data, "id": new_id()})
    stamp_created(doc, moment)
    db.session.add(SubAgent(id=doc["id"], org_id=current_org(), name=doc["name"], doc=doc,
                            created_at=moment, updated_at=moment))
    flush_or_conflict(_NAME_TAKEN)
    db.session.commit()
    return dumps({"subAgent": doc})


def update_sub_agent(sub_agent_id: str, changes: dict[str, Any]) -> str:
    row = load_for_update(SubAgent, sub_agent_id, "Sub-agent")
    validate_tool_refs(changes.get("tools"), {t["toolId"] for t in row.doc.get("tools") or []},
                       field="subAgent.tools")
    moment = utcnow()
    doc = _finish(merge(row.doc, changes))
    doc.setdefault("tools", [])
    stamp_updated(doc, row.doc, moment)
    row.name, row.doc, row.updated_at = doc["name"], doc, moment
    flush_or_conflict(_NAME_TAKEN)
    db.session.commit()
    return dumps({"subAgent": doc})


def delete_sub_agent(sub_agent_id: str, *, force: bool) -> dict:
    """Delete a sub-agent. Referenced by agents → 409 naming them, unless `force` removes the references."""
    lock_agents()  # agent writes check sub-agent ids under this lock: no reference can slip in meanwhile
    load_for_update(SubAgent, sub_agent_id, "Sub-agent")
    referencing = agents_referencing_sub_agent(sub_agent_id)
    if referencing and not force:
        raise Conflict(f"The sub-agent is used by {len(referencing)} agent(s); remove it from them first "
                       "or delete with ?force=true.", {"agents": referencing})
    if referencing:
        remove_sub_agent_references(sub_agent_id, utcnow())
    db.session.execute(delete(SubAgent).where(SubAgent.org_id == current_org(), SubAgent.id == sub_agent_id))
    db.session.commit()
    return SUCCESS
