"""Widgets of an agent: CRUD and the one default widget per agent.

Changes to an agent's default widget lock the agent's row first, so two concurrent "make this
the default" requests queue; the partial unique index `uq_agent_widgets_default` backs it up.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, update

from app.agents.models import Agent, AgentWidget
from app.agents.services.common import (
    SUCCESS,
    doc_texts,
    dumps,
    flush_or_conflict,
    invalid,
    load_for_update,
    merge,
    new_id,
    one_doc_text,
    stamp_created,
    stamp_updated,
    utcnow,
    wrap_many,
    wrap_one,
)
from app.db import db
from app.tenancy import current_org, get_owned, tenant_select

_NAME_TAKEN = {"uq_agent_widgets_agent_id_name": "This agent already has a widget with this name."}


def list_widgets(agent_id: str) -> str:
    get_owned(Agent, agent_id, "Agent")
    return wrap_many("widgets", doc_texts(AgentWidget, AgentWidget.agent_id == agent_id, order_by=AgentWidget.name))


def get_default_widget(agent_id: str) -> str:
    get_owned(Agent, agent_id, "Agent")
    return wrap_one("widget", one_doc_text(AgentWidget, "Default widget", AgentWidget.agent_id == agent_id,
                                           AgentWidget.is_default.is_(True)))


def get_widget(widget_id: str) -> str:
    return wrap_one("widget", one_doc_text(AgentWidget, "Widget", AgentWidget.id == widget_id))


def _clear_defaults(agent_id: str, keep_id: str) -> None:
    rows = db.session.scalars(tenant_select(AgentWidget).where(
        AgentWidget.agent_id == agent_id, AgentWidget.is_default.is_(True), AgentWidget.id != keep_id)).all()
    for row in rows:
        doc = {**row.doc, "isDefault": False}
        db.session.execute(update(AgentWidget).where(AgentWidget.org_id == row.org_id, AgentWidget.id == row.id)
                           .values(is_default=False, doc=doc))


def create_widget(agent_id: str, data: dict[str, Any]) -> str:
    load_for_update(Agent, agent_id, "Agent")  # the agent's row lock serialises its default widget
    moment = utcnow()
    doc = {**data, "id": new_id(), "agentId": agent_id}
    stamp_created(doc, moment)
    if doc["isDefault"]:
        _clear_defaults(agent_id, doc["id"])
    db.session.add(AgentWidget(id=doc["id"], org_id=current_org(), agent_id=agent_id, name=doc["name"],
                               is_default=doc["isDefault"], doc=doc, created_at=moment, updated_at=moment))
    flush_or_conflict(_NAME_TAKEN)
    db.session.commit()
    return dumps({"widget": doc})


def _load_widget_locked(widget_id: str) -> AgentWidget:
    agent_id = get_owned(AgentWidget, widget_id, "Widget").agent_id
    load_for_update(Agent, agent_id, "Agent")  # lock order: agent, then widget
    return load_for_update(AgentWidget, widget_id, "Widget")


def update_widget(widget_id: str, changes: dict[str, Any]) -> str:
    row = _load_widget_locked(widget_id)
    moment = utcnow()
    doc = merge(row.doc, changes)
    doc["agentId"] = row.agent_id
    stamp_updated(doc, row.doc, moment)
    if doc["isDefault"] and not row.is_default:
        _clear_defaults(row.agent_id, row.id)
    row.name, row.is_default, row.doc, row.updated_at = doc["name"], doc["isDefault"], doc, moment
    flush_or_conflict(_NAME_TAKEN)
    db.session.commit()
    return dumps({"widget": doc})


def delete_widget(widget_id: str) -> dict:
    row = _load_widget_locked(widget_id)
    db.session.execute(delete(AgentWidget).where(AgentWidget.org_id == current_org(), AgentWidget.id == row.id))
    db.session.commit()
    return SUCCESS


def make_default_widget(widget_id: str, agent_id: str) -> dict:
    """Make the widget its agent's only default; `agent_id` must be the widget's agent."""
    row = _load_widget_locked(widget_id)
    if row.agent_id != agent_id:
        raise invalid("agentId", "agentId must be the id of the widget's agent.")
    if not row.is_default:
        moment = utcnow()
        _clear_defaults(row.agent_id, row.id)
        doc = {**row.doc, "isDefault": True}
        stamp_updated(doc, row.doc, moment)
        row.is_default, row.doc, row.updated_at = True, doc, moment
        db.session.flush()
    db.session.commit()
    return SUCCESS
