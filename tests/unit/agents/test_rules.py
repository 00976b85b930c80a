"""Pure rules of the agent service: transitions, summary shape, partial schemas."""

from __future__ import annotations

import pytest
from marshmallow import ValidationError

from app.agents.schemas import AgentInputSchema, AgentSchema, partial_of
from app.agents.services.agents import TRANSITIONS, _check_transition, summary_of
from app.errors import Conflict


def test_every_status_has_a_way_out_and_archived_only_returns_to_inactive():
    assert set(TRANSITIONS) == {"draft", "active", "inactive", "archived"}
    assert TRANSITIONS["archived"] == {"inactive"}
    assert all(TRANSITIONS[s] for s in TRANSITIONS)
    _check_transition("active", "active")  # staying is always allowed
    with pytest.raises(Conflict):
        _check_transition("active", "draft")


def test_summary_always_has_eight_fields_and_drops_empty_optionals():
    doc = {"id": "1", "name": "n", "title": "t", "type": "chat", "status": "draft", "isDefault": False,
           "isPublic": True, "scope": "org", "description": "", "capabilities": [], "provider": "p",
           "systemPrompt": "long", "skills": [{"skillId": "s", "skillName": "x", "enabled": True, "order": 0,
                                                "tools": [{"toolId": "t"}], "systemPromptExtension": "long"}]}
    summary = summary_of(doc)
    assert set(summary) == {"id", "name", "title", "type", "status", "isDefault", "isPublic", "scope",
                            "provider", "skills"}
    assert summary["skills"] == [{"skillId": "s", "skillName": "x", "enabled": True, "order": 0}]


def test_partial_schema_keeps_nested_objects_strict():
    patch = partial_of(AgentInputSchema)
    assert patch.load({"title": "x"}) == {"title": "x"}  # no defaults are filled on update
    with pytest.raises(ValidationError) as info:
        patch.load({"handoffConfig": {"enabled": True}})
    assert "triggerKeywords" in info.value.messages["handoffConfig"]
    assert partial_of(AgentInputSchema).__class__ is patch.__class__
    assert patch.__class__.__name__ == "AgentInputPatchSchema"


def test_input_unwraps_and_drops_server_fields():
    body = {"agent": {"name": "n", "title": "t", "type": "chat", "provider": "p", "model": "m", "id": "x",
                      "createdBy": "mallory"}}
    loaded = AgentInputSchema().load(body)
    assert "id" not in loaded and "createdBy" not in loaded and loaded["name"] == "n"
    assert set(AgentSchema._declared_fields) > set(AgentInputSchema._declared_fields)
