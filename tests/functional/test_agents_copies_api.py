"""Agent tools and skills are self-contained copies, through HTTP: any toolId is
accepted, embedded skills may be customised, export/import works across orgs with nothing else
present, sub-agents need only a name, and skill categories are a bare string[]."""

from __future__ import annotations

import pytest

from tests.functional.agents_support import (
    Registry,
    agent_body,
    agent_tool,
    rich_agent_body,
    unique,
    without_server_fields,
)
from tests.support import assert_error

CUSTOM_TOOL = {"toolId": "custom-crm-lookup", "toolName": "crm_lookup", "title": "CRM lookup", "type": "api",
               "inputSchema": {"type": "object", "properties": {"email": {"type": "string"}}},
               "configSchema": {"type": "object", "properties": {"limit": {"type": "integer"}}},
               "config": {"limit": 3}, "enabled": True, "order": 0}
SKILL_TOOL = {k: v for k, v in CUSTOM_TOOL.items() if k != "order"}  # AgentSkillTool has no order


@pytest.fixture()
def reg(client, auth):
    return Registry(client, auth("read:agents", "write:agents"))


def _fresh_org(client, auth, label: str) -> Registry:
    return Registry(client, auth("read:agents", "write:agents", org=unique(f"org-{label}"), user="importer"))


# --------------------------------------------------------------------------- 1. any toolId


def test_agent_accepts_a_tool_that_names_no_tool_definition(reg):
    agent = reg.create_agent(tools=[CUSTOM_TOOL])
    assert agent["tools"] == [CUSTOM_TOOL]
    system = {"toolId": "system.web_search", "toolName": "web_search", "enabled": True}
    updated = reg.put(f"/agents/{agent['id']}", {"tools": [CUSTOM_TOOL, system]})
    assert updated.status_code == 200, updated.get_json()
    assert updated.get_json()["agent"]["tools"] == [CUSTOM_TOOL, system]


def test_two_customised_copies_of_one_tool_definition_are_accepted(reg):
    tool = reg.create_tool()
    copies = [agent_tool(tool, toolName="invoice_eu", config={"endpoint": "https://eu.example.com"}),
              agent_tool(tool, toolName="invoice_us", config={"endpoint": "https://us.example.com"}, order=1)]
    assert [t["toolName"] for t in reg.create_agent(tools=copies)["tools"]] == ["invoice_eu", "invoice_us"]


def test_catalog_skill_and_sub_agent_accept_any_tool_id(reg):
    skill = reg.create_skill(tools=[CUSTOM_TOOL])
    assert skill["tools"] == [CUSTOM_TOOL]
    changed = reg.put("/skills/by-name", {"tools": [{**CUSTOM_TOOL, "toolId": "another-custom"}]},
                      query_string={"name": skill["name"]})
    assert changed.status_code == 200 and changed.get_json()["skill"]["tools"][0]["toolId"] == "another-custom"
    sub = reg.create_sub_agent(tools=[CUSTOM_TOOL])
    assert sub["tools"] == [CUSTOM_TOOL]
    resp = reg.put(f"/subagents/{sub['id']}", {"subAgent": {"tools": [{**CUSTOM_TOOL, "toolId": "third"}]}})
    assert resp.status_code == 200 and resp.get_json()["subAgent"]["tools"][0]["toolId"] == "third"


@pytest.mark.parametrize("tool", [
    {"toolName": "no_id", "enabled": True},
    {"toolId": "t", "enabled": True},
    {"toolId": "t", "toolName": "t"},
    {**CUSTOM_TOOL, "config": {"limit": "many"}},
    {**CUSTOM_TOOL, "inputSchema": {"type": "string"}},
    {**CUSTOM_TOOL, "surprise": 1},
])
def test_a_tool_is_still_validated_on_its_own_shape(reg, tool):
    assert_error(reg.post("/agents", agent_body(tools=[tool])), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/subagents", {"subAgent": {"name": "s", "tools": [tool]}}), 400, "VALIDATION_ERROR")


# --------------------------------------------------------------------------- 2. customised skills


def _catalog_skill(reg):
    tool = reg.create_tool(configSchema={"type": "object", "properties": {"limit": {"type": "integer"}}},
                           defaultConfig={"limit": 5})
    return reg.create_skill(tools=[agent_tool(tool, config={"limit": 5})]), tool


def test_attached_skill_may_have_tools_the_catalog_skill_does_not(reg):
    skill, tool = _catalog_skill(reg)
    entry = {"skillId": skill["id"], "enabled": True, "order": 0,
             "tools": [{"toolId": tool["id"], "toolName": tool["name"], "enabled": False},
                       {"toolId": "t-1", "toolName": "extra", "enabled": True}]}
    (attached,) = reg.create_agent(skills=[entry])["skills"]
    # catalog content is copied (the skill's fields, and the schemas of the tool it already had)
    assert attached["skillName"] == skill["name"] and attached["title"] == skill["title"]
    copied, extra = attached["tools"]
    assert copied["inputSchema"] == tool["inputSchema"] and copied["config"] == {"limit": 5}
    assert copied["enabled"] is False
    assert extra == {"toolId": "t-1", "toolName": "extra", "enabled": True}


def test_sent_skill_fields_customise_the_copy_and_survive_updates(reg):
    skill, _ = _catalog_skill(reg)
    entry = {"skillId": skill["id"], "enabled": True, "order": 0, "title": "Short summaries",
             "systemPromptExtension": "One bullet.", "tools": []}
    agent = reg.create_agent(skills=[entry])
    (attached,) = agent["skills"]
    assert attached["title"] == "Short summaries" and attached["systemPromptExtension"] == "One bullet."
    assert attached["tools"] == [] and attached["category"] == skill["category"]
    # resending just the reference keeps the customised snapshot
    again = reg.put(f"/agents/{agent['id']}", {"skills": [{"skillId": skill["id"], "enabled": True, "order": 1}]})
    assert again.get_json()["agent"]["skills"][0] == {**attached, "order": 1}


def test_skill_unknown_to_the_catalog_is_kept_as_sent(reg):
    custom = {"skillId": "my-own-skill", "skillName": "triage", "title": "Triage", "enabled": True, "order": 0,
              "tools": [SKILL_TOOL]}
    agent = reg.create_agent(skills=[custom])
    assert agent["skills"] == [custom]
    assert reg.get("/agents/summary").get_json()["agents"][0]["skills"][0]["skillName"] == "triage"


def test_customised_skill_tool_config_is_validated_against_its_schema(reg):
    skill, tool = _catalog_skill(reg)
    entry = {"skillId": skill["id"], "enabled": True, "order": 0,
             "tools": [{"toolId": tool["id"], "toolName": tool["name"], "enabled": True, "config": {"limit": "x"}}]}
    body = assert_error(reg.post("/agents", agent_body(skills=[entry])), 400, "VALIDATION_ERROR")
    assert "skills.0.tools.0.config" in body["error"]["details"]["fields"]


# --------------------------------------------------------------------------- 3. export / import across orgs


def test_export_imports_into_an_org_with_no_tools_or_skills(client, auth, reg):
    tool = reg.create_tool()
    skill, skill_tool = _catalog_skill(reg)
    agent = reg.post("/agents", rich_agent_body(
        tools=[agent_tool(tool), CUSTOM_TOOL | {"order": 1}],
        skills=[{"skillId": skill["id"], "enabled": True, "order": 0},
                {"skillId": "custom-skill", "skillName": "custom", "enabled": False, "order": 1,
                 "tools": [SKILL_TOOL]}])).get_json()["agent"]
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()

    other = _fresh_org(client, auth, "import")
    assert other.get("/tool-definitions").get_json() == {"toolDefinitions": [], "nextCursor": None}
    assert other.get("/skills").get_json() == {"skills": [], "nextCursor": None}
    resp = other.post("/agents/import", exported)
    assert resp.status_code == 201, resp.get_json()
    imported = resp.get_json()["agent"]
    assert without_server_fields(imported) == without_server_fields(agent)
    assert imported["createdBy"] == "importer"
    # the imported agent stays editable in its new org
    edited = other.put(f"/agents/{imported['id']}", {"title": "Edited", "skills": imported["skills"]})
    assert edited.status_code == 200 and edited.get_json()["agent"]["skills"] == imported["skills"]


def test_import_still_checks_sub_agent_ids(client, auth, reg):
    sub = reg.create_sub_agent()
    agent = reg.create_agent(subAgentIds=[sub["id"]])
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()
    other = _fresh_org(client, auth, "import-sub")
    body = assert_error(other.post("/agents/import", exported), 400, "VALIDATION_ERROR")
    assert body["error"]["details"]["unknownSubAgentIds"] == [sub["id"]]


# --------------------------------------------------------------------------- 4. only name is required


def test_sub_agent_with_only_a_name_gets_the_documented_defaults(reg):
    resp = reg.post("/subagents", {"subAgent": {"name": "helper"}})
    assert resp.status_code == 201, resp.get_json()
    sub = resp.get_json()["subAgent"]
    assert without_server_fields(sub) == {"name": "helper", "title": "helper", "description": "",
                                          "systemPrompt": "", "temperature": 0.7, "maxTokens": 2048,
                                          "tools": [], "status": "active"}
    changed = reg.put(f"/subagents/{sub['id']}", {"subAgent": {"provider": "provider-x", "model": "m1"}})
    assert changed.get_json()["subAgent"]["provider"] == "provider-x"
    cleared = reg.put(f"/subagents/{sub['id']}", {"subAgent": {"provider": None, "model": None}})
    assert "provider" not in cleared.get_json()["subAgent"] and "model" not in cleared.get_json()["subAgent"]


def test_tool_definition_with_only_a_name(reg):
    resp = reg.post("/tool-definitions", {"toolDefinition": {"name": "ping"}})
    assert resp.status_code == 201
    tool = without_server_fields(resp.get_json()["toolDefinition"])
    assert tool == {"name": "ping", "title": "ping", "description": "", "type": "function", "version": "1.0.0",
                    "inputSchema": {"type": "object", "properties": {}}, "configSchema": {},
                    "defaultConfig": {}, "isSystem": False, "enabled": True}


def test_openapi_documents_what_only_name_requires(client):
    schemas = client.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
    assert schemas["SubAgentFields"]["required"] == ["name"]
    assert schemas["ToolDefinitionFields"]["required"] == ["name"]


# --------------------------------------------------------------------------- 5. categories


def test_skill_categories_are_a_bare_string_list(reg, client):
    assert reg.get("/skills/categories").get_json() == []
    reg.create_skill(category="writing")
    reg.create_skill(category="analysis")
    assert reg.get("/skills/categories").get_json() == ["analysis", "writing"]
    doc = client.get("/api/v1/openapi.json").get_json()
    schema = doc["paths"]["/api/v1/skills/categories"]["get"]["responses"]["200"]["content"]["application/json"]
    assert schema["schema"]["type"] == "array" and schema["schema"]["items"] == {"type": "string"}
