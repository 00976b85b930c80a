"""Sub-agents: CRUD; deleting one that agents reference is a 409 unless forced."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.agents.models import SubAgent
from app.agents.services.agents import agents_referencing_sub_agent, lock_agents, remove_sub_agent_references
from app.agents.services.common import merge, titled, utcnow
from app.agents.services.documents import DocumentStore
from app.errors import Conflict
from app.tenancy import Tenant

store = DocumentStore(SubAgent, key="subAgent", many_key="subAgents", what="Sub-agent",
                      conflicts={"uq_sub_agents_org_id_name": "A sub-agent with this name already exists."},
                      columns=lambda doc: {"name": doc["name"]})


def list_sub_agents(*, limit: int | None = None, cursor: str | None = None) -> str:
    return store.list(limit=limit, cursor=cursor)


def get_sub_agent(sub_agent_id: str) -> str:
    return store.get(sub_agent_id)


def create_sub_agent(session: Session, tenant: Tenant, data: dict[str, Any]) -> str:
    return store.create(session, tenant, titled(data))


def update_sub_agent(session: Session, tenant: Tenant, sub_agent_id: str, changes: dict[str, Any], *,
                     if_match=None) -> str:
    row = store.lock(session, tenant.org_id, sub_agent_id)
    store.check_match(session, tenant.org_id, sub_agent_id, if_match)
    doc = titled(merge(row.doc, changes))
    doc.setdefault("tools", [])
    return store.save(session, tenant, row, doc)


def delete_sub_agent(session: Session, tenant: Tenant, sub_agent_id: str, *, force: bool, if_match=None) -> dict:
    """Delete a sub-agent. Referenced by agents → 409 naming them, unless `force` removes the references."""
    lock_agents(session, tenant)  # agent writes check sub-agent ids under this lock: no reference can slip in
    store.lock(session, tenant.org_id, sub_agent_id)
    store.check_match(session, tenant.org_id, sub_agent_id, if_match)
    referencing = agents_referencing_sub_agent(session, tenant.org_id, sub_agent_id)
    if referencing and not force:
        raise Conflict(f"The sub-agent is used by {len(referencing)} agent(s); remove it from them first "
                       "or delete with ?force=true.", {"agents": referencing})
    if referencing:
        remove_sub_agent_references(session, tenant, sub_agent_id, utcnow())
    return store.remove(session, tenant.org_id, sub_agent_id)
