"""Widgets of an agent: CRUD and the one default widget per agent.

Changes to an agent's default widget lock the agent's row first, so two concurrent "make this
the default" requests queue; the partial unique index `uq_agent_widgets_default` backs it up.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.agents.models import Agent, AgentWidget
from app.agents.services.common import SUCCESS, invalid, load_for_update, merge
from app.agents.services.documents import DocumentStore
from app.tenancy import Tenant, get_owned, tenant_select

store = DocumentStore(AgentWidget, key="widget", many_key="widgets", what="Widget",
                      conflicts={"uq_agent_widgets_agent_id_name": "This agent already has a widget with this name."},
                      columns=lambda doc: {"name": doc["name"], "is_default": doc["isDefault"],
                                           "agent_id": doc["agentId"]})


def list_widgets(agent_id: str, *, limit: int | None = None, cursor: str | None = None) -> str:
    get_owned(Agent, agent_id, "Agent")
    return store.list(AgentWidget.agent_id == agent_id, limit=limit, cursor=cursor, list_id=f"widgets:{agent_id}")


def get_default_widget(agent_id: str) -> str:
    get_owned(Agent, agent_id, "Agent")
    return store.find(AgentWidget.agent_id == agent_id, AgentWidget.is_default.is_(True), what="Default widget")


def get_widget(widget_id: str) -> str:
    return store.get(widget_id)


def _clear_defaults(session: Session, org_id: str, agent_id: str, keep_id: str) -> None:
    rows = session.scalars(tenant_select(AgentWidget, org_id).where(
        AgentWidget.agent_id == agent_id, AgentWidget.is_default.is_(True), AgentWidget.id != keep_id)).all()
    for row in rows:
        doc = {**row.doc, "isDefault": False}
        session.execute(update(AgentWidget).where(AgentWidget.org_id == row.org_id, AgentWidget.id == row.id)
                           .values(is_default=False, doc=doc))


def _keep_single_default(session: Session, org_id: str, previous: AgentWidget | None):
    """`before` hook: a widget becoming its agent's default unsets the others first."""

    def hook(doc: dict[str, Any]) -> None:
        if doc["isDefault"] and not (previous is not None and previous.is_default):
            _clear_defaults(session, org_id, doc["agentId"], doc["id"])

    return hook


def create_widget(session: Session, tenant: Tenant, agent_id: str, data: dict[str, Any]) -> str:
    load_for_update(session, tenant.org_id, Agent, agent_id, "Agent")  # the agent's row lock serialises its default
    return store.create(session, tenant, {**data, "agentId": agent_id},
                        before=_keep_single_default(session, tenant.org_id, None))


def _load_widget_locked(session: Session, org_id: str, widget_id: str) -> AgentWidget:
    agent_id = get_owned(AgentWidget, widget_id, "Widget", session=session, org_id=org_id).agent_id
    load_for_update(session, org_id, Agent, agent_id, "Agent")  # lock order: agent, then widget
    return store.lock(session, org_id, widget_id)


def update_widget(session: Session, tenant: Tenant, widget_id: str, changes: dict[str, Any], *,
                  if_match=None) -> str:
    row = _load_widget_locked(session, tenant.org_id, widget_id)
    store.check_match(session, tenant.org_id, widget_id, if_match)
    doc = {**merge(row.doc, changes), "agentId": row.agent_id}
    return store.save(session, tenant, row, doc, before=_keep_single_default(session, tenant.org_id, row))


def delete_widget(session: Session, tenant: Tenant, widget_id: str, *, if_match=None) -> dict:
    row = _load_widget_locked(session, tenant.org_id, widget_id)
    store.check_match(session, tenant.org_id, row.id, if_match)
    return store.remove(session, tenant.org_id, row.id)


def make_default_widget(session: Session, tenant: Tenant, widget_id: str, agent_id: str) -> dict:
    """Make the widget its agent's only default; `agent_id` must be the widget's agent."""
    row = _load_widget_locked(session, tenant.org_id, widget_id)
    if row.agent_id != agent_id:
        raise invalid("agentId", "agentId must be the id of the widget's agent.")
    if not row.is_default:
        store.save(session, tenant, row, {**row.doc, "isDefault": True},
                   before=_keep_single_default(session, tenant.org_id, row))
    return SUCCESS
