"""Agent registry access rules: tenant isolation, product isolation and scopes, for every resource."""

from __future__ import annotations

import pytest

from tests.functional.agents_support import Registry, agent_body, skill_body, tool_definition_body
from tests.support import assert_error


@pytest.fixture()
def owner(client, auth):
    """A fully populated registry in this test's org and the default product."""
    reg = Registry(client, auth("read:agents", "write:agents"))
    tool = reg.create_tool()
    skill = reg.create_skill()
    sub = reg.create_sub_agent()
    agent = reg.create_agent(isDefault=True, subAgentIds=[sub["id"]],
                             skills=[{"skillId": skill["id"], "enabled": True, "order": 0}])
    widget = reg.create_widget(agent["id"], isDefault=True)
    return {"reg": reg, "tool": tool, "skill": skill, "sub": sub, "agent": agent, "widget": widget}


def _reads(o):
    return [f"/agents/{o['agent']['id']}", f"/agents/{o['agent']['id']}/export", f"/skills/{o['skill']['id']}",
            f"/tool-definitions/{o['tool']['id']}", f"/subagents/{o['sub']['id']}", f"/widgets/{o['widget']['id']}",
            f"/agents/{o['agent']['id']}/widgets", f"/agents/{o['agent']['id']}/widgets/default", "/agents/default",
            f"/agents/by-name?name={o['agent']['name']}"]


def _lists(o):
    return {"/agents": "agents", "/agents/summary": "agents", "/skills": "skills",
            "/tool-definitions": "toolDefinitions", "/subagents": "subAgents"}


def _writes(o):
    agent, widget = o["agent"]["id"], o["widget"]["id"]
    return [
        ("put", f"/agents/{agent}", {"title": "hijack"}),
        ("delete", f"/agents/{agent}", None),
        ("put", f"/skills/by-name?name={o['skill']['name']}", {"title": "hijack"}),
        ("delete", f"/skills/by-name?name={o['skill']['name']}", None),
        ("put", f"/tool-definitions/{o['tool']['id']}", {"toolDefinition": {"title": "hijack"}}),
        ("delete", f"/tool-definitions/{o['tool']['id']}", None),
        ("put", f"/subagents/{o['sub']['id']}", {"subAgent": {"title": "hijack"}}),
        ("delete", f"/subagents/{o['sub']['id']}?force=true", None),
        ("post", f"/agents/{agent}/widgets", {"widget": {"name": "hijack"}}),
        ("put", f"/widgets/{widget}", {"widget": {"greeting": "hijack"}}),
        ("post", f"/widgets/{widget}/default", {"agentId": agent}),
        ("delete", f"/widgets/{widget}", None),
    ]


def _call(reg, method, path, body):
    return getattr(reg, method)(path, body) if body is not None else getattr(reg, method)(path)


def _assert_untouched(o):
    reg = o["reg"]
    assert reg.get(f"/agents/{o['agent']['id']}").get_json()["agent"] == o["agent"]
    assert reg.get(f"/skills/{o['skill']['id']}").get_json()["skill"] == o["skill"]
    assert reg.get(f"/tool-definitions/{o['tool']['id']}").get_json()["toolDefinition"] == o["tool"]
    assert reg.get(f"/subagents/{o['sub']['id']}").get_json()["subAgent"] == o["sub"]
    assert reg.get(f"/widgets/{o['widget']['id']}").get_json()["widget"] == o["widget"]


@pytest.mark.parametrize("who", ["other-org", "other-product"])
def test_another_tenant_sees_nothing_and_changes_nothing(client, auth, owner, who):
    kwargs = {"org": "org-intruder-" + owner["agent"]["id"][:8]} if who == "other-org" else {"product": "other"}
    intruder = Registry(client, auth("read:agents", "write:agents", **kwargs))
    for path in _reads(owner):
        assert_error(intruder.get(path), 404, "NOT_FOUND")
    for path, key in _lists(owner).items():
        assert intruder.get(path).get_json() == {key: [], "nextCursor": None}, path
    assert intruder.get("/skills/categories").get_json() == []
    ids = intruder.post("/tool-definitions/by-ids", {"ids": [owner["tool"]["id"]]}).get_json()
    assert ids == {"toolDefinitions": []}
    for method, path, body in _writes(owner):
        assert_error(_call(intruder, method, path, body), 404, "NOT_FOUND")
    # a sub-agent of another tenant is an unknown reference
    refs = agent_body(subAgentIds=[owner["sub"]["id"]])
    assert_error(intruder.post("/agents", refs), 400, "VALIDATION_ERROR")
    # skill and tool ids of another tenant are only ids here: nothing of the owner's documents is copied
    skills = agent_body(skills=[{"skillId": owner["skill"]["id"], "enabled": True, "order": 0}])
    attached = intruder.post("/agents", skills).get_json()["agent"]["skills"]
    assert attached == [{"skillId": owner["skill"]["id"], "enabled": True, "order": 0, "tools": []}]
    tool = {"toolId": owner["tool"]["id"], "toolName": "t", "enabled": True}
    assert intruder.post("/agents", agent_body(tools=[tool])).get_json()["agent"]["tools"] == [tool]
    _assert_untouched(owner)


@pytest.mark.parametrize("who", ["other-org", "other-product"])
def test_names_and_defaults_are_per_tenant(client, auth, owner, who):
    kwargs = {"org": "org-neighbour-" + owner["agent"]["id"][:8]} if who == "other-org" else {"product": "other"}
    neighbour = Registry(client, auth("read:agents", "write:agents", **kwargs))
    mine = neighbour.create_agent(name=owner["agent"]["name"], isDefault=True)
    assert neighbour.post("/skills", skill_body(name=owner["skill"]["name"])).status_code == 201
    assert neighbour.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        name=owner["tool"]["name"])}).status_code == 201
    neighbour.create_sub_agent(name=owner["sub"]["name"])
    assert neighbour.get("/agents/default").get_json()["agent"]["id"] == mine["id"]
    assert owner["reg"].get("/agents/default").get_json()["agent"]["id"] == owner["agent"]["id"]
    if who == "other-product":
        assert mine["product"] == "other"
    _assert_untouched(owner)


def test_read_only_token_cannot_write(client, auth, owner):
    reader = Registry(client, auth("read:agents"))
    for path in _reads(owner):
        assert reader.get(path).status_code == 200, path
    for path in _lists(owner):
        assert reader.get(path).status_code == 200, path
    assert reader.post("/tool-definitions/by-ids", {"ids": []}).status_code == 200
    creates = [("post", "/agents", agent_body()), ("post", "/agents/import", agent_body()),
               ("post", "/skills", skill_body()),
               ("post", "/tool-definitions", {"toolDefinition": tool_definition_body()}),
               ("post", "/subagents", {"subAgent": {"name": "s", "provider": "p", "model": "m"}})]
    for method, path, body in _writes(owner) + creates:
        assert_error(_call(reader, method, path, body), 403, "FORBIDDEN")
    _assert_untouched(owner)


def test_write_only_token_cannot_read(client, auth, owner):
    writer = Registry(client, auth("write:agents"))
    for path in _reads(owner) + list(_lists(owner)) + ["/skills/categories"]:
        assert_error(writer.get(path), 403, "FORBIDDEN")


@pytest.mark.parametrize("scopes", [("read:entities", "write:entities"), ("write:image-gen",)])
def test_unrelated_scopes_are_forbidden(client, auth, owner, scopes):
    other = Registry(client, auth(*scopes))
    assert_error(other.get("/agents"), 403, "FORBIDDEN")
    assert_error(other.post("/agents", agent_body()), 403, "FORBIDDEN")


def test_generic_scopes_and_admin_role_are_accepted(client, auth, owner):
    generic = Registry(client, auth("read", "write"))
    assert generic.get("/agents").status_code == 200
    assert generic.post("/agents", agent_body()).status_code == 201
    admin = Registry(client, auth("nothing", role="admin"))
    assert admin.post("/skills", skill_body()).status_code == 201


def test_no_token_is_401(client, owner):
    assert_error(client.get("/api/v1/agents"), 401, "UNAUTHORIZED")
    assert_error(client.post("/api/v1/subagents", json={}), 401, "UNAUTHORIZED")


REGISTRY_ROUTES = {
    "/api/v1/agents": {"get", "post"}, "/api/v1/agents/summary": {"get"}, "/api/v1/agents/default": {"get"},
    "/api/v1/agents/by-name": {"get"}, "/api/v1/agents/import": {"post"},
    "/api/v1/agents/{agentId}": {"get", "put", "delete"}, "/api/v1/agents/{agentId}/export": {"get"},
    "/api/v1/skills": {"get", "post"}, "/api/v1/skills/{skillId}": {"get"},
    "/api/v1/skills/by-name": {"put", "delete"}, "/api/v1/skills/categories": {"get"},
    "/api/v1/tool-definitions": {"get", "post"}, "/api/v1/tool-definitions/by-ids": {"post"},
    "/api/v1/tool-definitions/{toolDefId}": {"get", "put", "delete"},
    "/api/v1/subagents": {"get", "post"}, "/api/v1/subagents/{subAgentId}": {"get", "put", "delete"},
    "/api/v1/agents/{agentId}/widgets": {"get", "post"}, "/api/v1/agents/{agentId}/widgets/default": {"get"},
    "/api/v1/widgets/{widgetId}": {"get", "put", "delete"}, "/api/v1/widgets/{widgetId}/default": {"post"},
}


def test_openapi_documents_every_registry_route(client):
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]
    for path, methods in REGISTRY_ROUTES.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))


def test_nul_characters_are_refused_not_crashing(client, auth, owner):
    reg = owner["reg"]
    assert_error(reg.post("/agents", agent_body(title="bad\x00title")), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/agents", agent_body(metadata={"k\x00": "v"})), 400, "VALIDATION_ERROR")
    assert_error(reg.post("/tool-definitions/by-ids", {"ids": ["a\x00"]}), 400, "VALIDATION_ERROR")
    assert_error(reg.get("/agents/by-name", query_string={"name": "a\x00"}), 400, "VALIDATION_ERROR")
    # a NUL in the path: the same rule (app.jsonbody), the same answer as a body or a query parameter
    assert_error(reg.get("/agents/a%00b"), 400, "VALIDATION_ERROR")
    assert_error(reg.put("/widgets/a%00b", {"widget": {"greeting": "x"}}), 400, "VALIDATION_ERROR")
