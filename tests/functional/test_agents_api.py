"""Agents through HTTP: CRUD, defaults, validation, transitions, the default invariant (also under
concurrency), summary, by-name, export/import and the generated system prompt."""

from __future__ import annotations

import pytest

from tests.functional.agents_support import (
    SERVER_FIELDS,
    Registry,
    agent_body,
    agent_tool,
    concurrently,
    rich_agent_body,
    without_server_fields,
)
from tests.support import assert_error


@pytest.fixture()
def reg(client, auth):
    return Registry(client, auth("read:agents", "write:agents"))


# --------------------------------------------------------------------------- create / read / defaults


def test_create_fills_documented_defaults_and_audit_fields(reg, org_id):
    resp = reg.post("/agents", agent_body(name="minimal"))
    assert resp.status_code == 201
    agent = resp.get_json()["agent"]
    assert agent["status"] == "draft" and agent["version"] == "1.0.0"
    assert agent["temperature"] == 0.7 and agent["maxTokens"] == 2048
    assert agent["csatConfig"] == {"enabled": False}
    assert agent["handoffConfig"] == {"enabled": False, "triggerKeywords": [], "handoffMessage": ""}
    assert agent["configSchema"] == {} and agent["scope"] == "org"
    assert agent["isDefault"] is False and agent["isPublic"] is False and agent["isFavorite"] is False
    assert agent["usageCount"] == 0 and agent["subType"] == "chat" and agent["systemPrompt"] == ""
    assert agent["orgId"] == org_id and agent["product"] == "default"
    assert agent["createdBy"] == agent["updatedBy"] == "user-1"
    assert agent["createdAt"].endswith("Z") and agent["createdAt"] == agent["updatedAt"]
    assert "description" not in agent and "skills" not in agent
    assert reg.get(f"/agents/{agent['id']}").get_json() == {"agent": agent}


EMPTY_LISTS = {"skills": [], "tools": [], "subAgentIds": [], "tags": [], "capabilities": [], "samplePrompts": [],
               "personalityTraits": []}


def test_empty_lists_are_echoed_on_create_update_export_and_import(reg):
    """A list field sent empty is stored and returned empty (not dropped): what was submitted is what
    the agent, its export and an import of that export say; null (or absent) still means unset."""
    agent = reg.post("/agents", agent_body(**EMPTY_LISTS, metadata={}, widgetConfig={})).get_json()["agent"]
    assert {k: agent.get(k) for k in EMPTY_LISTS} == EMPTY_LISTS
    assert agent["metadata"] == {} and agent["widgetConfig"] == {}  # an empty object likewise
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()["agent"]
    assert {k: exported.get(k) for k in EMPTY_LISTS} == EMPTY_LISTS
    reg.delete(f"/agents/{agent['id']}")
    imported = reg.post("/agents/import", exported).get_json()["agent"]
    assert {k: imported.get(k) for k in EMPTY_LISTS} == EMPTY_LISTS
    bare = reg.create_agent()
    assert "skills" not in bare and "tools" not in bare
    updated = reg.put(f"/agents/{bare['id']}", EMPTY_LISTS).get_json()["agent"]
    assert {k: updated.get(k) for k in EMPTY_LISTS} == EMPTY_LISTS
    cleared = reg.put(f"/agents/{bare['id']}", {"skills": None, "tools": None}).get_json()["agent"]
    assert "skills" not in cleared and "tools" not in cleared and cleared["tags"] == []


def test_server_fields_sent_by_the_caller_are_ignored(reg, org_id):
    body = agent_body(id="mine", orgId="other-org", product="other", createdAt="2001-01-01T00:00:00Z",
                      updatedAt="2001-01-01T00:00:00Z", createdBy="mallory", updatedBy="mallory")
    agent = reg.post("/agents", body).get_json()["agent"]
    assert agent["id"] != "mine" and agent["orgId"] == org_id and agent["product"] == "default"
    assert agent["createdBy"] == "user-1" and not agent["createdAt"].startswith("2001")


def test_wrapped_body_is_accepted(reg):
    resp = reg.post("/agents", {"agent": agent_body(name="wrapped")})
    assert resp.status_code == 201 and resp.get_json()["agent"]["name"] == "wrapped"


def test_rich_agent_round_trips_every_field(reg):
    tool = reg.create_tool()
    sub = reg.create_sub_agent()
    body = rich_agent_body(tools=[agent_tool(tool)], subAgentIds=[sub["id"]], type="react", subType="workflow",
                           reactConfig={"maxIterations": 4, "reasoningPrompt": "Think", "plannerHint": "x"})
    agent = reg.post("/agents", body).get_json()["agent"]
    for key, value in body.items():
        if key == "reactConfig":
            assert agent[key] == {"provider": "provider-x", "model": "large-chat", "temperature": 0.2,
                                  "maxTokens": 4096, "maxIterations": 4, "reasoningPrompt": "Think",
                                  "plannerHint": "x"}
        elif key == "metadata":
            assert agent[key] == {"owner": "billing"}  # systemPrompt was given: nothing generated
        else:
            assert agent[key] == value, key


def test_list_is_wrapped_and_sorted_by_name(reg):
    for name in ("charlie", "alpha", "bravo"):
        reg.create_agent(name=name)
    body = reg.get("/agents").get_json()
    assert [a["name"] for a in body["agents"]] == ["alpha", "bravo", "charlie"]


def test_get_unknown_agent_is_404(reg):
    assert_error(reg.get("/agents/does-not-exist"), 404, "NOT_FOUND")
    assert_error(reg.put("/agents/does-not-exist", {"title": "x"}), 404, "NOT_FOUND")
    assert_error(reg.delete("/agents/does-not-exist"), 404, "NOT_FOUND")


def test_by_name(reg):
    agent = reg.create_agent(name="finder")
    assert reg.get("/agents/by-name", query_string={"name": "finder"}).get_json() == {"agent": agent}
    assert_error(reg.get("/agents/by-name", query_string={"name": "nobody"}), 404, "NOT_FOUND")
    assert_error(reg.get("/agents/by-name"), 400, "VALIDATION_ERROR")


def test_duplicate_name_is_409_on_create_and_rename(reg):
    reg.create_agent(name="taken")
    assert_error(reg.post("/agents", agent_body(name="taken")), 409, "CONFLICT")
    other = reg.create_agent(name="free")
    assert_error(reg.put(f"/agents/{other['id']}", {"name": "taken"}), 409, "CONFLICT")


def test_delete_then_404(reg):
    agent = reg.create_agent()
    assert reg.delete(f"/agents/{agent['id']}").get_json() == {"success": True}
    assert_error(reg.get(f"/agents/{agent['id']}"), 404, "NOT_FOUND")


# --------------------------------------------------------------------------- validation


INVALID_AGENTS = {
    "missing name": {"name": ...},
    "missing title": {"title": ...},
    "missing type": {"type": ...},
    "missing provider": {"provider": ...},
    "missing model": {"model": ...},
    "bad type": {"type": "robot"},
    "bad subType": {"subType": "spreadsheet"},
    "bad status": {"status": "deleted"},
    "bad scope": {"scope": "planet"},
    "name with spaces": {"name": "has spaces"},
    "empty title": {"title": ""},
    "temperature too high": {"temperature": 2.5},
    "temperature negative": {"temperature": -0.1},
    "temperature as string": {"temperature": "0.5"},
    "maxTokens zero": {"maxTokens": 0},
    "maxTokens fraction": {"maxTokens": 10.5},
    "maxTokens bool": {"maxTokens": True},
    "isDefault as string": {"isDefault": "yes"},
    "tags not list": {"tags": "a,b"},
    "usageCount negative": {"usageCount": -1},
    "maxConcurrency zero": {"maxConcurrency": 0},
    "responseDelay negative": {"responseDelay": -5},
    "lastUsedAt not a date": {"lastUsedAt": "yesterday"},
    "unknown field": {"topP": 0.9},
    "csat without enabled": {"csatConfig": {}},
    "csat enabled without survey": {"csatConfig": {"enabled": True}},
    "csat survey without questions": {"csatConfig": {"enabled": True, "survey": {
        "questions": [], "timeThreshold": 10, "closeOnResponse": True}}},
    "csat survey missing timeThreshold": {"csatConfig": {"enabled": True, "survey": {
        "questions": [{"question": "ok?"}], "closeOnResponse": True}}},
    "csat choice without options": {"csatConfig": {"enabled": True, "survey": {
        "questions": [{"question": "pick", "type": "choice"}], "timeThreshold": 1, "closeOnResponse": True}}},
    "handoff missing keywords": {"handoffConfig": {"enabled": True, "handoffMessage": "hi"}},
    "handoff missing message": {"handoffConfig": {"enabled": True, "triggerKeywords": []}},
    "configSchema invalid": {"configSchema": {"type": "not-a-type"}},
    "configSchema not object": {"configSchema": ["type"]},
    "config violates configSchema": {"configSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
                                     "config": {"n": "three"}},
    "config misses required key": {"configSchema": {"type": "object", "required": ["region"]}, "config": {}},
    "tool without toolId": {"tools": [{"toolName": "x", "enabled": True}]},
    "tool without enabled": {"tools": [{"toolId": "x", "toolName": "x"}]},
    "tool bad inputSchema": {"tools": [{"toolId": "x", "toolName": "x", "enabled": True,
                                        "inputSchema": {"type": "string"}}]},
    "skill without order": {"skills": [{"skillId": "s", "enabled": True}]},
    "skill negative order": {"skills": [{"skillId": "s", "enabled": True, "order": -1}]},
    "react maxIterations zero": {"type": "react", "reactConfig": {"maxIterations": 0}},
    "team scope without scopeId": {"scope": "team"},
}


@pytest.mark.parametrize("case", sorted(INVALID_AGENTS))
def test_invalid_agent_is_400_with_field_details(reg, case):
    body = agent_body(**INVALID_AGENTS[case])
    error = assert_error(reg.post("/agents", body), 400, "VALIDATION_ERROR")["error"]
    assert error["details"]["fields"], error


def test_validation_details_name_the_nested_field(reg):
    body = agent_body(handoffConfig={"enabled": True, "triggerKeywords": ["x"]})
    details = assert_error(reg.post("/agents", body), 400, "VALIDATION_ERROR")["error"]["details"]
    assert "handoffMessage" in details["fields"]["handoffConfig"]


def test_malformed_json_is_invalid_input(reg, client, auth):
    resp = client.post("/api/v1/agents", data="{nope", content_type="application/json",
                       headers=auth("write:agents"))
    assert_error(resp, 400, "INVALID_INPUT")


def test_update_validates_the_merged_document(reg):
    agent = reg.create_agent(configSchema={"type": "object", "properties": {"n": {"type": "integer"}}},
                             config={"n": 1})
    assert_error(reg.put(f"/agents/{agent['id']}", {"config": {"n": "x"}}), 400, "VALIDATION_ERROR")
    # a new schema that the stored config does not satisfy is refused too
    stricter = {"type": "object", "required": ["m"]}
    assert_error(reg.put(f"/agents/{agent['id']}", {"configSchema": stricter}), 400, "VALIDATION_ERROR")
    assert_error(reg.put(f"/agents/{agent['id']}", {"temperature": 9}), 400, "VALIDATION_ERROR")
    assert_error(reg.put(f"/agents/{agent['id']}", {"title": None}), 400, "VALIDATION_ERROR")
    assert reg.get(f"/agents/{agent['id']}").get_json()["agent"] == agent


def test_update_replaces_named_fields_and_null_clears_optional_ones(reg):
    agent = reg.create_agent(description="old", tags=["a"], csatConfig={"enabled": False})
    updated = reg.put(f"/agents/{agent['id']}", {"description": None, "tags": ["b", "c"], "title": "New title",
                                                  "updatedBy": "mallory"}).get_json()["agent"]
    assert "description" not in updated and updated["tags"] == ["b", "c"] and updated["title"] == "New title"
    assert updated["createdAt"] == agent["createdAt"] and updated["createdBy"] == agent["createdBy"]
    assert updated["updatedBy"] == "user-1" and updated["id"] == agent["id"]
    assert updated["maxTokens"] == agent["maxTokens"]  # untouched fields keep their values


def test_scope_user_defaults_scope_id_to_the_caller(reg):
    agent = reg.create_agent(scope="user")
    assert agent["scopeId"] == "user-1"


def test_unknown_sub_agent_is_400(reg):
    body = assert_error(reg.post("/agents", agent_body(subAgentIds=["ghost"])), 400, "VALIDATION_ERROR")
    assert body["error"]["details"]["unknownSubAgentIds"] == ["ghost"]


def test_duplicate_sub_agent_ids_are_400(reg):
    sub = reg.create_sub_agent()
    assert_error(reg.post("/agents", agent_body(subAgentIds=[sub["id"], sub["id"]])), 400, "VALIDATION_ERROR")


def test_tool_config_is_validated_against_its_config_schema(reg):
    tool = reg.create_tool()
    bad = agent_tool(tool, config={"endpoint": 12})
    assert_error(reg.post("/agents", agent_body(tools=[bad])), 400, "VALIDATION_ERROR")


def test_agent_keeps_its_tool_copy_after_the_definition_is_deleted(reg):
    tool = reg.create_tool()
    agent = reg.create_agent(tools=[agent_tool(tool, title="Customised title")])
    assert reg.delete(f"/tool-definitions/{tool['id']}").status_code == 200
    resp = reg.put(f"/agents/{agent['id']}", {"title": "Still saveable"})
    assert resp.status_code == 200
    assert resp.get_json()["agent"]["tools"][0]["title"] == "Customised title"


# --------------------------------------------------------------------------- status transitions


ALLOWED = [("draft", "active"), ("draft", "archived"), ("active", "inactive"), ("inactive", "active"),
           ("inactive", "archived"), ("archived", "inactive")]
REFUSED = [("draft", "inactive"), ("active", "draft"), ("active", "archived"), ("inactive", "draft"),
           ("archived", "active"), ("archived", "draft")]


@pytest.mark.parametrize("old,new", ALLOWED)
def test_allowed_status_transitions(reg, old, new):
    agent = reg.create_agent(status=old)
    resp = reg.put(f"/agents/{agent['id']}", {"status": new})
    assert resp.status_code == 200 and resp.get_json()["agent"]["status"] == new


@pytest.mark.parametrize("old,new", REFUSED)
def test_refused_status_transitions_are_409(reg, old, new):
    agent = reg.create_agent(status=old)
    body = assert_error(reg.put(f"/agents/{agent['id']}", {"status": new}), 409, "CONFLICT")
    assert body["error"]["details"]["from"] == old and body["error"]["details"]["to"] == new
    assert reg.get(f"/agents/{agent['id']}").get_json()["agent"]["status"] == old


def test_archived_agent_cannot_be_default(reg):
    archived = reg.create_agent(status="archived")
    assert_error(reg.put(f"/agents/{archived['id']}", {"isDefault": True}), 409, "CONFLICT")
    assert_error(reg.post("/agents", agent_body(status="archived", isDefault=True)), 409, "CONFLICT")
    default = reg.create_agent(status="inactive", isDefault=True)
    assert_error(reg.put(f"/agents/{default['id']}", {"status": "archived"}), 409, "CONFLICT")


# --------------------------------------------------------------------------- the default agent


def test_default_agent_404_when_none(reg):
    reg.create_agent()
    assert_error(reg.get("/agents/default"), 404, "NOT_FOUND")


def test_setting_default_clears_the_previous_one(reg):
    first = reg.create_agent(isDefault=True)
    assert reg.get("/agents/default").get_json()["agent"]["id"] == first["id"]
    second = reg.create_agent(isDefault=True)
    assert reg.get("/agents/default").get_json()["agent"]["id"] == second["id"]
    third = reg.create_agent()
    reg.put(f"/agents/{third['id']}", {"isDefault": True})
    agents = {a["id"]: a for a in reg.get("/agents").get_json()["agents"]}
    assert [a["id"] for a in agents.values() if a["isDefault"]] == [third["id"]]
    summaries = reg.get("/agents/summary").get_json()["agents"]
    assert [s["id"] for s in summaries if s["isDefault"]] == [third["id"]]
    reg.put(f"/agents/{third['id']}", {"isDefault": False})
    assert_error(reg.get("/agents/default"), 404, "NOT_FOUND")


def test_two_concurrent_make_default_requests_leave_exactly_one_default(app, reg, auth):
    headers = auth("read:agents", "write:agents")
    for _round in range(8):
        a, b = reg.create_agent(), reg.create_agent()
        results = concurrently(app, [
            lambda c, i=a["id"]: c.put(f"/api/v1/agents/{i}", json={"isDefault": True}, headers=headers),
            lambda c, i=b["id"]: c.put(f"/api/v1/agents/{i}", json={"isDefault": True}, headers=headers),
        ])
        assert [r.status_code for r in results] == [200, 200], [r.get_data(as_text=True) for r in results]
        defaults = [x for x in reg.get("/agents").get_json()["agents"] if x["isDefault"]]
        assert len(defaults) == 1 and defaults[0]["id"] in (a["id"], b["id"])
        assert reg.get("/agents/default").get_json()["agent"]["id"] == defaults[0]["id"]


def test_two_concurrent_default_creates_leave_exactly_one_default(app, reg, auth):
    headers = auth("read:agents", "write:agents")
    results = concurrently(app, [
        lambda c: c.post("/api/v1/agents", json=agent_body(isDefault=True), headers=headers),
        lambda c: c.post("/api/v1/agents", json=agent_body(isDefault=True), headers=headers),
    ])
    assert [r.status_code for r in results] == [201, 201]
    assert len([x for x in reg.get("/agents").get_json()["agents"] if x["isDefault"]]) == 1


def test_concurrent_creates_with_one_name_give_one_409(app, reg, auth):
    headers = auth("read:agents", "write:agents")
    body = agent_body()
    results = concurrently(app, [lambda c: c.post("/api/v1/agents", json=body, headers=headers)] * 2)
    assert sorted(r.status_code for r in results) == [201, 409]


# --------------------------------------------------------------------------- summary


def test_summary_has_the_eight_fields_and_optional_ones_when_set(reg):
    plain = reg.create_agent(name="a-plain")
    skill = reg.create_skill()
    rich = reg.create_agent(name="b-rich", description="d", iconName="bot", capabilities=["x"],
                            samplePrompts=["hi"], metadata={"k": "v"},
                            skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])
    summaries = reg.get("/agents/summary").get_json()["agents"]
    always = {"id", "name", "title", "type", "status", "isDefault", "isPublic", "scope"}
    assert set(summaries[0]) == always | {"provider", "model"}
    assert summaries[0]["id"] == plain["id"]
    assert set(summaries[1]) == always | {"provider", "model", "description", "iconName", "capabilities",
                                          "samplePrompts", "metadata", "skills"}
    assert summaries[1]["skills"] == [{"skillId": skill["id"], "skillName": skill["name"], "title": "Summarize",
                                       "category": "writing", "slashCommand": "/summarize", "iconName": "scroll",
                                       "enabled": True, "order": 0}]
    assert summaries[1]["id"] == rich["id"]


def test_summary_follows_updates(reg):
    agent = reg.create_agent(title="Before")
    reg.put(f"/agents/{agent['id']}", {"title": "After", "status": "active"})
    (summary,) = reg.get("/agents/summary").get_json()["agents"]
    assert summary["title"] == "After" and summary["status"] == "active"


# --------------------------------------------------------------------------- system prompt from goal


def test_system_prompt_is_generated_from_goal_and_marked_in_metadata(reg):
    agent = reg.create_agent(title="Travel helper", goal="Plan trips on a budget", metadata={"team": "x"},
                             capabilities=["flights"], responseStyle="concise")
    prompt = agent["systemPrompt"]
    assert prompt.startswith("You are Travel helper.") and "Plan trips on a budget" in prompt
    assert "- flights" in prompt and "concise" in prompt
    generated = agent["metadata"]["systemPromptGenerated"]
    assert generated["source"] == "goal" and generated["template"] == "goal-template-v1"
    assert agent["metadata"]["team"] == "x"
    # deterministic: the same inputs give the same prompt
    twin = reg.create_agent(title="Travel helper", goal="Plan trips on a budget", capabilities=["flights"],
                            responseStyle="concise")
    assert twin["systemPrompt"] == prompt


def test_generated_prompt_follows_the_goal_until_the_caller_writes_one(reg):
    agent = reg.create_agent(goal="First goal")
    changed = reg.put(f"/agents/{agent['id']}", {"goal": "Second goal"}).get_json()["agent"]
    assert "Second goal" in changed["systemPrompt"] and "systemPromptGenerated" in changed["metadata"]
    own = reg.put(f"/agents/{agent['id']}", {"systemPrompt": "My own prompt."}).get_json()["agent"]
    assert own["systemPrompt"] == "My own prompt." and "metadata" not in own
    kept = reg.put(f"/agents/{agent['id']}", {"goal": "Third goal"}).get_json()["agent"]
    assert kept["systemPrompt"] == "My own prompt."


def test_explicit_prompt_wins_over_goal(reg):
    agent = reg.create_agent(goal="Some goal", systemPrompt="Given prompt")
    assert agent["systemPrompt"] == "Given prompt" and "metadata" not in agent


# --------------------------------------------------------------------------- export / import


def _full_agent(reg):
    tool = reg.create_tool()
    sub = reg.create_sub_agent()
    skill = reg.create_skill()
    agent = reg.post("/agents", rich_agent_body(
        tools=[agent_tool(tool)], subAgentIds=[sub["id"]], systemPrompt="", goal="Help with billing",
        skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])).get_json()["agent"]
    return agent, skill


def test_export_import_round_trip(reg):
    agent, skill = _full_agent(reg)
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()
    assert exported == {"agent": agent}
    assert reg.delete(f"/agents/{agent['id']}").status_code == 200
    resp = reg.post("/agents/import", exported)
    assert resp.status_code == 201
    imported = resp.get_json()["agent"]
    assert without_server_fields(imported) == without_server_fields(agent)
    assert imported["id"] != agent["id"]
    assert reg.get(f"/agents/{imported['id']}").get_json()["agent"] == imported


def test_import_of_a_bare_agent_restores_the_exported_skill_snapshot(reg):
    agent, skill = _full_agent(reg)
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()["agent"]
    reg.put("/skills/by-name", {"title": "Changed in the catalog"}, query_string={"name": skill["name"]})
    reg.delete(f"/agents/{agent['id']}")
    imported = reg.post("/agents/import", exported).get_json()["agent"]
    assert imported["skills"] == agent["skills"]


def test_import_name_taken_is_409_unless_overwrite(reg, org_id):
    agent, _ = _full_agent(reg)
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()
    body = assert_error(reg.post("/agents/import", exported), 409, "CONFLICT")
    assert body["error"]["details"]["agentId"] == agent["id"]
    exported["agent"]["title"] = "Replaced title"
    exported["agent"]["createdBy"] = "mallory"
    resp = reg.post("/agents/import", exported, query_string={"overwrite": "true"})
    assert resp.status_code == 200
    replaced = resp.get_json()["agent"]
    assert replaced["id"] == agent["id"] and replaced["title"] == "Replaced title"
    assert replaced["createdBy"] == "user-1" and replaced["createdAt"] == agent["createdAt"]
    assert replaced["orgId"] == org_id
    assert len(reg.get("/agents").get_json()["agents"]) == 1


def test_import_validates_like_create(reg):
    assert_error(reg.post("/agents/import", agent_body(subAgentIds=["ghost"])), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/agents/import", agent_body(temperature=7)), 400, "VALIDATION_ERROR")
    bad_config = {"toolId": "t", "toolName": "t", "enabled": True, "configSchema": {"type": "object",
                  "properties": {"n": {"type": "integer"}}}, "config": {"n": "x"}}
    assert_error(reg.post("/agents/import", agent_body(tools=[bad_config])), 400, "VALIDATION_ERROR")


def test_import_into_another_org_refills_server_fields(client, auth, reg):
    agent = reg.create_agent(goal="Help", tags=["x"])
    exported = reg.get(f"/agents/{agent['id']}/export").get_json()
    other = Registry(client, auth("read:agents", "write:agents", org="org-import-target-" + agent["id"][:8],
                                  user="importer"))
    imported = other.post("/agents/import", exported).get_json()["agent"]
    assert imported["orgId"] != agent["orgId"] and imported["createdBy"] == "importer"
    assert without_server_fields(imported) == without_server_fields(agent)
    assert set(SERVER_FIELDS) <= set(imported)


def test_deleting_an_agent_deletes_its_widgets(reg):
    agent = reg.create_agent()
    widget = reg.create_widget(agent["id"], isDefault=True)
    reg.delete(f"/agents/{agent['id']}")
    assert_error(reg.get(f"/widgets/{widget['id']}"), 404, "NOT_FOUND")


def test_lists_filter_by_status_type_and_default(reg):
    draft = reg.create_agent(name="f-draft")
    active = reg.create_agent(name="f-active", status="active", type="react", isDefault=True)
    names = lambda path, **q: [a["name"] for a in reg.get(path, query_string=q).get_json()["agents"]]  # noqa: E731
    for path in ("/agents", "/agents/summary"):
        assert names(path, status="active") == ["f-active"]
        assert names(path, type="chat") == ["f-draft"]
        assert names(path, isDefault="true") == ["f-active"]
        assert names(path, isDefault="false", status="draft") == ["f-draft"]
        assert names(path, status="archived") == []
        assert names(path) == ["f-active", "f-draft"]
        assert_error(reg.get(path, query_string={"status": "gone"}), 400, "VALIDATION_ERROR")
    assert draft["id"] != active["id"]
