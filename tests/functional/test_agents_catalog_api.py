"""Catalog skills (and skill snapshots), tool definitions, sub-agents and widgets through HTTP."""

from __future__ import annotations

import pytest

from tests.functional.agents_support import (
    Registry,
    agent_body,
    agent_tool,
    concurrently,
    skill_body,
    tool_definition_body,
)
from tests.support import assert_error


@pytest.fixture()
def reg(client, auth):
    return Registry(client, auth("read:agents", "write:agents"))


# --------------------------------------------------------------------------- catalog skills


def test_skill_crud_by_name(reg):
    tool = reg.create_tool()
    created = reg.post("/skills", skill_body(name="writer", tools=[agent_tool(tool)],
                                             configSchema={"type": "object"})).get_json()["skill"]
    assert created["persisted"] is True and created["enabled"] is True and created["artifactVersion"] == 1
    assert reg.get(f"/skills/{created['id']}").get_json() == {"skill": created}
    assert [s["name"] for s in reg.get("/skills").get_json()["skills"]] == ["writer"]
    updated = reg.put("/skills/by-name", {"title": "Writer v2", "artifactVersion": 2},
                      query_string={"name": "writer"}).get_json()["skill"]
    assert updated["title"] == "Writer v2" and updated["artifactVersion"] == 2 and updated["id"] == created["id"]
    assert updated["createdAt"] == created["createdAt"]
    assert reg.delete("/skills/by-name", query_string={"name": "writer"}).get_json() == {"success": True}
    assert_error(reg.get(f"/skills/{created['id']}"), 404, "NOT_FOUND")
    assert_error(reg.delete("/skills/by-name", query_string={"name": "writer"}), 404, "NOT_FOUND")
    assert_error(reg.put("/skills/by-name", {"title": "x"}, query_string={"name": "writer"}), 404, "NOT_FOUND")


def test_skill_lookup_by_name_is_tenant_scoped(reg, client, auth):
    created = reg.create_skill(name="lookup-me")
    assert reg.get("/skills/by-name", query_string={"name": "lookup-me"}).get_json() == {"skill": created}
    body = assert_error(reg.get("/skills/by-name", query_string={"name": "absent"}), 404, "NOT_FOUND")
    assert "absent" in body["error"]["message"]
    other_org = Registry(client, auth("read:agents", org="org-someone-else"))
    assert_error(other_org.get("/skills/by-name", query_string={"name": "lookup-me"}), 404, "NOT_FOUND")
    assert_error(reg.get("/skills/by-name"), 400, "VALIDATION_ERROR")  # the name is required
    assert Registry(client, auth("write:agents")).get("/skills/by-name", query_string={
        "name": "lookup-me"}).status_code == 403  # reading needs a read scope, as GET /skills/{id}


def test_skill_wrapped_body_and_rename(reg):
    resp = reg.post("/skills", {"skill": skill_body(name="wrapped-skill")})
    assert resp.status_code == 201
    renamed = reg.put("/skills/by-name", {"name": "renamed-skill"}, query_string={"name": "wrapped-skill"})
    assert renamed.get_json()["skill"]["name"] == "renamed-skill"
    assert reg.get("/skills").get_json()["skills"][0]["name"] == "renamed-skill"


def test_skill_name_unique_per_org(reg):
    reg.create_skill(name="dup")
    assert_error(reg.post("/skills", skill_body(name="dup")), 409, "CONFLICT")
    reg.create_skill(name="other")
    assert_error(reg.put("/skills/by-name", {"name": "dup"}, query_string={"name": "other"}), 409, "CONFLICT")


@pytest.mark.parametrize("over", [{"name": ...}, {"title": ...}, {"category": ...}, {"slashCommand": "no-slash"},
                                  {"enabled": "true"}, {"configSchema": {"type": 3}}, {"artifactVersion": -1},
                                  {"tools": [{"toolId": "t", "toolName": "t"}]},
                                  {"surprise": 1}])
def test_invalid_skill_is_400(reg, over):
    body = {k: v for k, v in {**skill_body(), **over}.items() if v is not ...}
    assert_error(reg.post("/skills", body), 400, "VALIDATION_ERROR")


def test_skill_categories_distinct_and_sorted(reg):
    for category in ("writing", "analysis", "writing", "coding"):
        reg.create_skill(category=category)
    assert reg.get("/skills/categories").get_json() == ["analysis", "coding", "writing"]


def test_by_name_requires_name(reg):
    assert_error(reg.put("/skills/by-name", {"title": "x"}), 400, "VALIDATION_ERROR")


# --------------------------------------------------------------------------- skill snapshots


def _skill_with_tool(reg):
    tool = reg.create_tool(configSchema={"type": "object", "properties": {"limit": {"type": "integer"}}},
                           defaultConfig={"limit": 5})
    skill = reg.create_skill(tools=[agent_tool(tool, config={"limit": 5})])
    return skill, tool


def test_attaching_copies_the_catalog_skill(reg):
    skill, tool = _skill_with_tool(reg)
    agent = reg.create_agent(skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])
    (attached,) = agent["skills"]
    assert attached["skillName"] == skill["name"] and attached["title"] == "Summarize"
    for key in ("description", "category", "slashCommand", "iconName", "systemPromptExtension"):
        assert attached[key] == skill[key]
    assert attached["tools"] == [{"toolId": tool["id"], "toolName": tool["name"], "title": tool["title"],
                                  "type": "api", "inputSchema": tool["inputSchema"],
                                  "configSchema": tool["configSchema"], "config": {"limit": 5}, "enabled": True}]


def test_catalog_changes_do_not_reach_attached_skills_until_reattached(reg):
    skill, tool = _skill_with_tool(reg)
    agent = reg.create_agent(skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])
    snapshot = agent["skills"][0]
    new_schema = {"type": "object", "properties": {"limit": {"type": "integer", "maximum": 10}}}
    reg.put("/skills/by-name", {"title": "Summarize v2", "systemPromptExtension": "Two bullets.",
                                "tools": [agent_tool(tool, configSchema=new_schema, config={"limit": 3})]},
            query_string={"name": skill["name"]})
    # a later update that resends the skill keeps the stored snapshot
    again = reg.put(f"/agents/{agent['id']}", {"skills": [{"skillId": skill["id"], "enabled": False, "order": 2}],
                                                "title": "touched"}).get_json()["agent"]
    assert again["skills"][0] == {**snapshot, "enabled": False, "order": 2}
    assert reg.get(f"/agents/{agent['id']}").get_json()["agent"]["skills"][0]["title"] == "Summarize"
    # detach, then attach again: the new catalog version is copied
    reg.put(f"/agents/{agent['id']}", {"skills": []})
    refreshed = reg.put(f"/agents/{agent['id']}", {"skills": [{"skillId": skill["id"], "enabled": True,
                                                                "order": 0}]}).get_json()["agent"]
    (fresh,) = refreshed["skills"]
    assert fresh["title"] == "Summarize v2" and fresh["systemPromptExtension"] == "Two bullets."
    assert fresh["tools"][0]["configSchema"] == new_schema and fresh["tools"][0]["config"] == {"limit": 3}


def test_snapshot_survives_catalog_delete(reg):
    skill, _ = _skill_with_tool(reg)
    agent = reg.create_agent(skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])
    reg.delete("/skills/by-name", query_string={"name": skill["name"]})
    kept = reg.put(f"/agents/{agent['id']}", {"description": "still fine"}).get_json()["agent"]
    assert kept["skills"] == agent["skills"]


def test_skills_sorted_by_order_and_order_zero_is_valid(reg):
    skills = [reg.create_skill() for _ in range(3)]
    agent = reg.create_agent(skills=[{"skillId": skills[0]["id"], "enabled": True, "order": 2},
                                     {"skillId": skills[1]["id"], "enabled": True, "order": 0},
                                     {"skillId": skills[2]["id"], "enabled": False, "order": 1}])
    assert [s["skillId"] for s in agent["skills"]] == [skills[1]["id"], skills[2]["id"], skills[0]["id"]]
    assert [s["order"] for s in agent["skills"]] == [0, 1, 2]


def test_duplicate_skill_is_400(reg):
    skill = reg.create_skill()
    twice = [{"skillId": skill["id"], "enabled": True, "order": 0}, {"skillId": skill["id"], "enabled": True,
                                                                     "order": 1}]
    assert_error(reg.post("/agents", agent_body(skills=twice)), 400, "VALIDATION_ERROR")


def test_skill_tool_customisation_is_validated_against_the_snapshot(reg):
    skill, tool = _skill_with_tool(reg)
    entry = {"skillId": skill["id"], "enabled": True, "order": 0}
    ok = reg.create_agent(skills=[{**entry, "tools": [{"toolId": tool["id"], "toolName": tool["name"],
                                                       "enabled": False, "config": {"limit": 9}}]}])
    assert ok["skills"][0]["tools"][0]["enabled"] is False and ok["skills"][0]["tools"][0]["config"] == {"limit": 9}
    bad_config = [{**entry, "tools": [{"toolId": tool["id"], "toolName": "x", "enabled": True,
                                       "config": {"limit": "many"}}]}]
    assert_error(reg.post("/agents", agent_body(skills=bad_config)), 400, "VALIDATION_ERROR")


# --------------------------------------------------------------------------- tool definitions


def test_tool_definition_crud(reg):
    resp = reg.post("/tool-definitions", {"toolDefinition": tool_definition_body(name="get_weather")})
    assert resp.status_code == 201
    tool = resp.get_json()["toolDefinition"]
    assert tool["version"] == "1.0.0" and tool["isSystem"] is False and tool["enabled"] is True
    assert reg.get(f"/tool-definitions/{tool['id']}").get_json() == {"toolDefinition": tool}
    assert reg.get("/tool-definitions").get_json() == {"toolDefinitions": [tool], "nextCursor": None}
    updated = reg.put(f"/tool-definitions/{tool['id']}",
                      {"toolDefinition": {"description": "Weather now", "version": "1.1.0"}}).get_json()
    assert updated["toolDefinition"]["description"] == "Weather now"
    assert updated["toolDefinition"]["inputSchema"] == tool["inputSchema"]
    assert reg.delete(f"/tool-definitions/{tool['id']}").get_json() == {"success": True}
    assert_error(reg.get(f"/tool-definitions/{tool['id']}"), 404, "NOT_FOUND")


def test_tool_definition_defaults(reg):
    tool = reg.post("/tool-definitions", {"toolDefinition": {"name": "ping"}}).get_json()["toolDefinition"]
    assert tool["title"] == "ping" and tool["type"] == "function" and tool["description"] == ""
    assert tool["inputSchema"] == {"type": "object", "properties": {}}
    assert tool["configSchema"] == {} and tool["defaultConfig"] == {}


@pytest.mark.parametrize("over", [
    {"name": "1starts-with-digit"}, {"name": "has space"}, {"inputSchema": {"type": "string"}},
    {"inputSchema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
    {"outputSchema": {"type": 12}}, {"configSchema": {"required": "not-a-list"}},
    {"defaultConfig": {"endpoint": 5}}, {"isSystem": "no"}, {"type": "Not A Type"}, {"extra": True},
])
def test_invalid_tool_definition_is_400(reg, over):
    assert_error(reg.post("/tool-definitions", {"toolDefinition": tool_definition_body(**over)}), 400,
                 "VALIDATION_ERROR")


def test_tool_definition_needs_the_wrapper(reg):
    assert_error(reg.post("/tool-definitions", tool_definition_body()), 400, "VALIDATION_ERROR")


def test_tool_definition_update_validates_and_name_is_unique(reg):
    first = reg.create_tool(name="first_tool")
    reg.create_tool(name="second_tool")
    assert_error(reg.put(f"/tool-definitions/{first['id']}", {"toolDefinition": {"name": "second_tool"}}), 409,
                 "CONFLICT")
    assert_error(reg.post("/tool-definitions", {"toolDefinition": tool_definition_body(name="first_tool")}), 409,
                 "CONFLICT")
    assert_error(reg.put(f"/tool-definitions/{first['id']}",
                         {"toolDefinition": {"configSchema": {"type": "object", "required": ["token"]}}}),
                 400, "VALIDATION_ERROR")


def test_tool_definitions_by_ids(reg):
    a, b = reg.create_tool(), reg.create_tool()
    resp = reg.post("/tool-definitions/by-ids", {"ids": [b["id"], "unknown", a["id"], b["id"]]})
    assert [t["id"] for t in resp.get_json()["toolDefinitions"]] == [b["id"], a["id"]]
    assert reg.post("/tool-definitions/by-ids", {"ids": []}).get_json() == {"toolDefinitions": []}
    assert_error(reg.post("/tool-definitions/by-ids", {"ids": "x"}), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/tool-definitions/by-ids", {}), 400, "VALIDATION_ERROR")


# --------------------------------------------------------------------------- sub-agents


def test_sub_agent_crud(reg):
    tool = reg.create_tool()
    resp = reg.post("/subagents", {"subAgent": {"name": "researcher", "provider": "p", "model": "m",
                                                "tools": [agent_tool(tool)], "systemPrompt": "Research."}})
    assert resp.status_code == 201
    sub = resp.get_json()["subAgent"]
    assert sub["title"] == "researcher" and sub["status"] == "active" and sub["temperature"] == 0.7
    assert reg.get(f"/subagents/{sub['id']}").get_json() == {"subAgent": sub}
    assert reg.get("/subagents").get_json() == {"subAgents": [sub], "nextCursor": None}
    updated = reg.put(f"/subagents/{sub['id']}", {"subAgent": {"status": "inactive", "maxTokens": 512}})
    assert updated.get_json()["subAgent"]["status"] == "inactive"
    assert updated.get_json()["subAgent"]["tools"] == sub["tools"]
    assert reg.delete(f"/subagents/{sub['id']}").get_json() == {"success": True}
    assert_error(reg.get(f"/subagents/{sub['id']}"), 404, "NOT_FOUND")


@pytest.mark.parametrize("over", [{"name": ...}, {"provider": ""}, {"model": 5}, {"temperature": 3},
                                  {"status": "archived"}, {"maxTokens": "many"},
                                  {"tools": [{"toolId": "ghost", "toolName": "g"}]}])
def test_invalid_sub_agent_is_400(reg, over):
    body = {k: v for k, v in {"name": "s1", "provider": "p", "model": "m", **over}.items() if v is not ...}
    assert_error(reg.post("/subagents", {"subAgent": body}), 400, "VALIDATION_ERROR")


def test_sub_agent_name_unique(reg):
    reg.create_sub_agent(name="same")
    assert_error(reg.post("/subagents", {"subAgent": {"name": "same", "provider": "p", "model": "m"}}), 409,
                 "CONFLICT")


def test_deleting_a_referenced_sub_agent_is_409_unless_forced(reg):
    sub, spare = reg.create_sub_agent(), reg.create_sub_agent()
    users = [reg.create_agent(name=n, subAgentIds=[sub["id"], spare["id"]]) for n in ("user-a", "user-b")]
    body = assert_error(reg.delete(f"/subagents/{sub['id']}"), 409, "CONFLICT")
    assert body["error"]["details"]["agents"] == [{"id": a["id"], "name": a["name"]} for a in users]
    assert reg.get(f"/subagents/{sub['id']}").status_code == 200
    assert reg.delete(f"/subagents/{sub['id']}", query_string={"force": "true"}).get_json() == {"success": True}
    for agent in users:
        stored = reg.get(f"/agents/{agent['id']}").get_json()["agent"]
        assert stored["subAgentIds"] == [spare["id"]]
    # only the forced reference was removed: the spare is still referenced
    assert reg.delete(f"/subagents/{spare['id']}").status_code == 409


# --------------------------------------------------------------------------- widgets


def test_widget_crud_and_defaults(reg):
    agent = reg.create_agent()
    resp = reg.post(f"/agents/{agent['id']}/widgets", {"widget": {"name": "site"}})
    assert resp.status_code == 201
    widget = resp.get_json()["widget"]
    assert widget["agentId"] == agent["id"] and widget["isDefault"] is False
    assert widget["position"] == "bottom-right" and widget["theme"]["primaryColor"] == "#2563EB"
    assert widget["allowedOrigins"] == [] and widget["launcherIcon"] == "chat"
    assert reg.get(f"/widgets/{widget['id']}").get_json() == {"widget": widget}
    assert reg.get(f"/agents/{agent['id']}/widgets").get_json() == {"widgets": [widget], "nextCursor": None}
    updated = reg.put(f"/widgets/{widget['id']}", {"widget": {
        "greeting": "Hello!", "position": "top-left", "allowedOrigins": ["https://shop.example.com"],
        "theme": {"mode": "dark", "primaryColor": "#000"}, "customCssUrl": "https://cdn.example.com/w.css",
        "launcherIcon": "https://cdn.example.com/icon.png", "agentId": "ignored"}}).get_json()["widget"]
    assert updated["greeting"] == "Hello!" and updated["theme"]["mode"] == "dark"
    assert updated["theme"]["textColor"] == "#111827" and updated["agentId"] == agent["id"]
    assert reg.delete(f"/widgets/{widget['id']}").get_json() == {"success": True}
    assert_error(reg.get(f"/widgets/{widget['id']}"), 404, "NOT_FOUND")


@pytest.mark.parametrize("over", [{"name": ""}, {"position": "middle"}, {"theme": {"primaryColor": "blue"}},
                                  {"allowedOrigins": ["https://x.com/path"]}, {"allowedOrigins": ["ftp://x.com"]},
                                  {"customCssUrl": "http://insecure.example.com/a.css"},
                                  {"launcherIcon": "http://x.com/i.png"}, {"launcherIcon": "\u00fcU7/\u0013"},
                                  {"theme": {"borderRadius": 99}},
                                  {"isDefault": 1}, {"colour": "red"}])
def test_invalid_widget_is_400(reg, over):
    agent = reg.create_agent()
    assert_error(reg.post(f"/agents/{agent['id']}/widgets", {"widget": {"name": "w", **over}}), 400,
                 "VALIDATION_ERROR")


def test_widget_of_unknown_agent_is_404(reg):
    assert_error(reg.post("/agents/ghost/widgets", {"widget": {"name": "w"}}), 404, "NOT_FOUND")
    assert_error(reg.get("/agents/ghost/widgets"), 404, "NOT_FOUND")
    assert_error(reg.get("/agents/ghost/widgets/default"), 404, "NOT_FOUND")


def test_one_default_widget_per_agent(reg):
    agent, other_agent = reg.create_agent(), reg.create_agent()
    assert_error(reg.get(f"/agents/{agent['id']}/widgets/default"), 404, "NOT_FOUND")
    first = reg.create_widget(agent["id"], isDefault=True)
    second = reg.create_widget(agent["id"])
    other = reg.create_widget(other_agent["id"], isDefault=True)
    assert reg.get(f"/agents/{agent['id']}/widgets/default").get_json()["widget"]["id"] == first["id"]
    resp = reg.post(f"/widgets/{second['id']}/default", {"agentId": agent["id"]})
    assert resp.get_json() == {"success": True}
    widgets = reg.get(f"/agents/{agent['id']}/widgets").get_json()["widgets"]
    assert [w["id"] for w in widgets if w["isDefault"]] == [second["id"]]
    assert reg.get(f"/agents/{other_agent['id']}/widgets/default").get_json()["widget"]["id"] == other["id"]
    # a widget created as default takes over too
    third = reg.create_widget(agent["id"], isDefault=True)
    assert reg.get(f"/agents/{agent['id']}/widgets/default").get_json()["widget"]["id"] == third["id"]
    assert not reg.get(f"/widgets/{second['id']}").get_json()["widget"]["isDefault"]


def test_set_default_widget_requires_its_own_agent(reg):
    agent, other_agent = reg.create_agent(), reg.create_agent()
    widget = reg.create_widget(agent["id"])
    assert_error(reg.post(f"/widgets/{widget['id']}/default", {"agentId": other_agent["id"]}), 400,
                 "VALIDATION_ERROR")
    assert_error(reg.post(f"/widgets/{widget['id']}/default", {}), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/widgets/ghost/default", {"agentId": agent["id"]}), 404, "NOT_FOUND")
    assert_error(reg.get(f"/agents/{agent['id']}/widgets/default"), 404, "NOT_FOUND")


def test_widget_name_unique_per_agent(reg):
    agent, other = reg.create_agent(), reg.create_agent()
    reg.create_widget(agent["id"], name="main")
    assert_error(reg.post(f"/agents/{agent['id']}/widgets", {"widget": {"name": "main"}}), 409, "CONFLICT")
    reg.create_widget(other["id"], name="main")


# --------------------------------------------------------------------------- races


def test_two_concurrent_default_widget_requests_leave_one_default(app, reg, auth):
    headers = auth("read:agents", "write:agents")
    agent = reg.create_agent()
    for _round in range(6):
        a, b = reg.create_widget(agent["id"]), reg.create_widget(agent["id"])
        results = concurrently(app, [
            lambda c, w=w: c.post(f"/api/v1/widgets/{w['id']}/default", json={"agentId": agent["id"]},
                                  headers=headers) for w in (a, b)])
        assert [r.status_code for r in results] == [200, 200]
        widgets = reg.get(f"/agents/{agent['id']}/widgets").get_json()["widgets"]
        assert len([w for w in widgets if w["isDefault"]]) == 1


def test_sub_agent_delete_racing_an_agent_that_references_it_never_leaves_a_dangling_id(app, reg, auth):
    headers = auth("read:agents", "write:agents")
    for _round in range(6):
        sub = reg.create_sub_agent()
        created, deleted = concurrently(app, [
            lambda c, s=sub: c.post("/api/v1/agents", json=agent_body(subAgentIds=[s["id"]]), headers=headers),
            lambda c, s=sub: c.delete(f"/api/v1/subagents/{s['id']}", headers=headers)])
        assert (created.status_code, deleted.status_code) in {(201, 409), (400, 200)}
        if created.status_code == 201:
            assert reg.get(f"/subagents/{sub['id']}").status_code == 200


def test_launcher_icon_rule_is_the_documented_pattern(app):
    """An icon name (no "/") or an https URL: the OpenAPI document states the same pattern the API
    applies, so a schema-valid body is never refused for its launcherIcon."""
    import re

    spec = app.test_client().get("/api/v1/openapi.json").get_json()
    documented = {name: schema["properties"]["launcherIcon"] for name, schema in spec["components"]["schemas"].items()
                  if "launcherIcon" in schema.get("properties", {})}
    assert documented
    patterns = {p["pattern"] for p in documented.values()}
    assert len(patterns) == 1
    pattern = re.compile(patterns.pop())
    for icon, ok in [("chat", True), ("rocket-2", True), ("https://cdn.example.com/i.png", True),
                     ("http://x.com/i.png", False), ("a/b", False), ("\u00fcU7/\u0013", False), ("ü", True)]:
        assert bool(pattern.match(icon)) is ok, icon
