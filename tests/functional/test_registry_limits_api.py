"""Unbounded JSON blobs cannot lock an org out: every free-form JSON field has a documented size
limit (400 naming the field and the limit), every agent-registry list is paged (`limit` +
`nextCursor`), and a page stops early by bytes, so even a row stored before the limits existed
(inserted here directly in the database) cannot make a list answer 413."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.functional.agents_support import Registry, agent_body, tool_definition_body, unique
from tests.support import assert_error

MB = 1024 * 1024


@pytest.fixture()
def reg(client, auth):
    return Registry(client, auth("read:agents", "write:agents"))


def _blob(size: int) -> dict:
    return {"blob": "x" * size}


def _assert_field_refused(resp, field: str, limit_name: str) -> None:
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    messages = body["error"]["details"]["fields"]
    found = _find(messages, field.split("."))
    assert found, (field, messages)
    assert limit_name in " ".join(found) and "bytes" in " ".join(found), found


def _find(errors, path):
    node = errors
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and part.isdigit() and int(part) in node:
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, list) else None


# --------------------------------------------------------------------------- field limits


def test_a_30_mb_agent_metadata_is_refused_naming_the_field_and_the_limit(reg):
    resp = reg.post("/agents", agent_body(metadata=_blob(30 * MB)))
    _assert_field_refused(resp, "metadata", "JSON_FIELD_MAX_BYTES")
    assert "65536" in resp.get_json()["error"]["details"]["fields"]["metadata"][0]


@pytest.mark.parametrize("field", ["config", "widgetConfig", "contextConfig", "userSuggestedActionsConfig"])
def test_5_mb_agent_objects_are_refused(reg, field):
    _assert_field_refused(reg.post("/agents", agent_body(**{field: _blob(5 * MB)})), field, "JSON_FIELD_MAX_BYTES")


def test_a_5_mb_config_schema_is_refused(reg):
    schema = {"type": "object", "description": "x" * (5 * MB)}
    _assert_field_refused(reg.post("/agents", agent_body(configSchema=schema)), "configSchema",
                          "JSON_SCHEMA_MAX_BYTES")


def test_agent_updates_are_capped_too(reg):
    agent = reg.create_agent()
    _assert_field_refused(reg.put(f"/agents/{agent['id']}", {"metadata": _blob(5 * MB)}), "metadata",
                          "JSON_FIELD_MAX_BYTES")


def test_embedded_tool_config_is_capped(reg):
    tool = {"toolId": "t1", "toolName": "t1", "enabled": True, "config": _blob(5 * MB)}
    _assert_field_refused(reg.post("/agents", agent_body(tools=[tool])), "tools.0.config", "JSON_FIELD_MAX_BYTES")


def test_tool_definition_input_schema_and_default_config_are_capped(reg):
    big_schema = {"type": "object", "properties": {"q": {"type": "string", "description": "x" * (5 * MB)}}}
    resp = reg.post("/tool-definitions", {"toolDefinition": tool_definition_body(inputSchema=big_schema)})
    _assert_field_refused(resp, "toolDefinition.inputSchema", "JSON_SCHEMA_MAX_BYTES")
    resp = reg.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        configSchema={}, defaultConfig=_blob(5 * MB))})
    _assert_field_refused(resp, "toolDefinition.defaultConfig", "JSON_FIELD_MAX_BYTES")


def test_sub_agent_skill_and_widget_metadata_are_capped(reg):
    resp = reg.post("/subagents", {"subAgent": {"name": unique("sub"), "metadata": _blob(5 * MB)}})
    _assert_field_refused(resp, "subAgent.metadata", "JSON_FIELD_MAX_BYTES")
    resp = reg.post("/skills", {"name": unique("sk"), "title": "S", "category": "c", "metadata": _blob(5 * MB)})
    _assert_field_refused(resp, "metadata", "JSON_FIELD_MAX_BYTES")
    agent = reg.create_agent()
    resp = reg.post(f"/agents/{agent['id']}/widgets", {"widget": {"name": "w", "metadata": _blob(5 * MB)}})
    _assert_field_refused(resp, "widget.metadata", "JSON_FIELD_MAX_BYTES")


def test_a_whole_agent_document_is_capped(reg):
    # every field within its own limit, but 20 tools of 60 KB each make a 1.2 MB agent
    tools = [{"toolId": f"t{i}", "toolName": f"t{i}", "enabled": True, "config": _blob(60_000)} for i in range(20)]
    body = assert_error(reg.post("/agents", agent_body(tools=tools)), 400, "VALIDATION_ERROR")
    assert "REGISTRY_MAX_DOCUMENT_BYTES" in body["error"]["message"]
    assert body["error"]["details"]["maxBytes"] == 1 * MB and body["error"]["details"]["bytes"] > 1 * MB


def test_fields_within_the_limits_are_accepted(reg):
    agent = reg.create_agent(metadata=_blob(60_000), config={"k": "v"})
    assert len(agent["metadata"]["blob"]) == 60_000


def test_entity_definition_property_description_metadata_and_view_config_are_capped(client, auth):
    headers = auth("read:entities", "write:entities")
    base = "/api/v1/entities/definitions"
    schema = {"type": "object", "properties": {"title": {"type": "string", "description": "x" * (5 * MB)}}}
    resp = client.post(base, json={"name": "capped", "displayName": "C", "schema": schema}, headers=headers)
    _assert_field_refused(resp, "schema", "JSON_SCHEMA_MAX_BYTES")
    resp = client.post(base, json={"name": "capped", "displayName": "C", "schema": {"type": "object"},
                                   "metadata": _blob(5 * MB)}, headers=headers)
    _assert_field_refused(resp, "metadata", "JSON_FIELD_MAX_BYTES")
    resp = client.post(base, json={"name": "capped", "displayName": "C",
                                   "schema": {"type": "object", "properties": {"title": {"type": "string"}}}},
                       headers=headers)
    assert resp.status_code == 201, resp.get_json()
    resp = client.post(f"{base}/capped/views", json={"name": "v", "config": _blob(5 * MB)}, headers=headers)
    _assert_field_refused(resp, "config", "JSON_FIELD_MAX_BYTES")


def test_the_openapi_document_states_each_limit(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    agent = doc["components"]["schemas"]["Agent"]["properties"]
    assert agent["metadata"]["x-maxBytes"] == 65536 and "65536 bytes" in agent["metadata"]["description"]
    assert agent["configSchema"]["x-maxBytes"] == 256 * 1024
    tool = doc["components"]["schemas"]["ToolDefinition"]["properties"]
    assert tool["inputSchema"]["x-maxBytes"] == 256 * 1024 and tool["defaultConfig"]["x-maxBytes"] == 65536
    params = {p["name"]: p for p in doc["paths"]["/api/v1/agents"]["get"]["parameters"]}
    assert params["limit"]["schema"]["maximum"] == 1000 and "cursor" in params


# --------------------------------------------------------------------------- paging


def _walk(reg, path, **params):
    """Every page of a list: (pages, items)."""
    pages, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        resp = reg.get(path, query_string=query)
        assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
        page = resp.get_json()
        pages.append(page)
        cursor = page["nextCursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100


@pytest.mark.parametrize("path", ["/agents", "/agents/summary"])
def test_agent_lists_page_with_limit_and_next_cursor(reg, path):
    names = sorted(reg.create_agent(name=f"page-{i:02d}")["name"] for i in range(7))
    pages = _walk(reg, path, limit=3)
    assert [len(p["agents"]) for p in pages] == [3, 3, 1]
    seen = [a["name"] for p in pages for a in p["agents"]]
    assert seen == names  # by name, no duplicates, no gaps
    whole = reg.get(path).get_json()
    assert [a["name"] for a in whole["agents"]] == names and whole["nextCursor"] is None


def test_paging_is_stable_under_inserts(reg):
    for i in (1, 3, 5, 7):
        reg.create_agent(name=f"stable-{i}")
    first = reg.get("/agents", query_string={"limit": 2}).get_json()
    assert [a["name"] for a in first["agents"]] == ["stable-1", "stable-3"]
    reg.create_agent(name="stable-0")  # before the cursor: not on a later page
    reg.create_agent(name="stable-4")  # after it: shows up
    pages = _walk(reg, "/agents", limit=2, cursor=first["nextCursor"])
    assert [a["name"] for p in pages for a in p["agents"]] == ["stable-4", "stable-5", "stable-7"]


def test_filters_apply_to_every_page_and_bind_the_cursor(reg):
    for i in range(4):
        reg.create_agent(name=f"f-{i}", type="react" if i % 2 else "chat")
    page = reg.get("/agents", query_string={"limit": 1, "type": "react"}).get_json()
    assert [a["name"] for a in page["agents"]] == ["f-1"]
    nxt = reg.get("/agents", query_string={"limit": 1, "type": "react", "cursor": page["nextCursor"]}).get_json()
    assert [a["name"] for a in nxt["agents"]] == ["f-3"] and nxt["nextCursor"] is None
    # a cursor is for the list and filters it was issued for
    body = assert_error(reg.get("/agents", query_string={"limit": 1, "cursor": page["nextCursor"]}), 400,
                        "VALIDATION_ERROR")
    assert "cursor" in body["error"]["details"]["fields"]
    assert_error(reg.get("/agents/summary", query_string={"cursor": page["nextCursor"], "type": "react"}), 400,
                 "VALIDATION_ERROR")
    assert_error(reg.get("/agents", query_string={"cursor": "forged.cursor"}), 400, "VALIDATION_ERROR")


def test_cursor_of_another_org_is_refused(reg, client, make_token):
    reg.create_agent(name="o-1")
    reg.create_agent(name="o-2")
    cursor = reg.get("/agents", query_string={"limit": 1}).get_json()["nextCursor"]
    other = {"Authorization": f"Bearer {make_token(scopes=('read:agents',), org='another-org')}"}
    assert_error(client.get("/api/v1/agents", query_string={"cursor": cursor}, headers=other), 400,
                 "VALIDATION_ERROR")


@pytest.mark.parametrize("limit", ["0", "1001", "ten"])
def test_a_bad_limit_is_refused(reg, limit):
    body = assert_error(reg.get("/agents", query_string={"limit": limit}), 400)
    assert "limit" in str(body["error"]["details"])


def test_the_other_registry_lists_are_paged_too(reg):
    agent = reg.create_agent()
    for i in range(3):
        reg.create_tool(name=f"tool_{i}")
        reg.create_sub_agent(name=f"sub-{i}")
        reg.create_skill(name=f"skill-{i}")
        reg.create_widget(agent["id"], name=f"widget-{i}")
    for path, key in (("/tool-definitions", "toolDefinitions"), ("/subagents", "subAgents"), ("/skills", "skills"),
                      (f"/agents/{agent['id']}/widgets", "widgets")):
        pages = _walk(reg, path, limit=2)
        assert [len(p[key]) for p in pages] == [2, 1], path
        assert len({item["id"] for p in pages for item in p[key]}) == 3


# --------------------------------------------------------------------------- rows stored before the limits


def _inflate(app, org_id: str, name: str, size: int) -> None:
    """Give an agent a `metadata` of `size` bytes directly in the database (as before the limits)."""
    from app.db import db

    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text("UPDATE product_default.agents SET "
                          "doc = jsonb_set(doc, '{metadata}', jsonb_build_object('blob', repeat('x', :n))), "
                          "summary = jsonb_set(summary, '{metadata}', jsonb_build_object('blob', repeat('x', :n))) "
                          "WHERE org_id = :org AND name = :name"), {"n": size, "org": org_id, "name": name})
        conn.commit()


def test_two_legacy_30_mb_agents_do_not_make_the_lists_unreadable(app, reg, org_id):
    for name in ("big-1", "big-2", "small-1", "small-2"):
        reg.create_agent(name=name)
    _inflate(app, org_id, "big-1", 30 * MB)
    _inflate(app, org_id, "big-2", 30 * MB)
    resp = reg.get("/agents", query_string={"limit": 1})
    assert resp.status_code == 200
    assert [a["name"] for a in resp.get_json()["agents"]] == ["big-1"]
    for path in ("/agents", "/agents/summary"):
        pages = _walk(reg, path)
        # a page stops before the row that would take it past the page budget: each big row comes alone
        assert [[a["name"] for a in p["agents"]] for p in pages] == [["big-1"], ["big-2"], ["small-1", "small-2"]]


def test_a_legacy_row_larger_than_a_response_is_named_not_served(make_app, org_id, auth):
    app = make_app(MAX_RESPONSE_BYTES=200_000)
    reg = Registry(app.test_client(), auth("read:agents", "write:agents"))
    for name in ("a-1", "a-2", "a-3"):
        reg.create_agent(name=name)
    _inflate(app, org_id, "a-2", 300_000)
    for path in ("/agents", "/agents/summary"):
        pages = _walk(reg, path, limit=2)
        assert [a["name"] for p in pages for a in p["agents"]] == ["a-1", "a-3"]
        omitted = [o for p in pages for o in p.get("omitted", [])]
        assert [o["name"] for o in omitted] == ["a-2"] and omitted[0]["bytes"] > 300_000
    # the row can still be repaired: clearing the blob makes it readable again
    agent_id = omitted[0]["id"]
    assert reg.put(f"/agents/{agent_id}", {"metadata": None}).status_code == 200
    assert [a["name"] for a in reg.get("/agents").get_json()["agents"]] == ["a-1", "a-2", "a-3"]


def test_entity_definition_and_view_lists_of_names_are_bounded(client, auth):
    headers = auth("read:entities", "write:entities")
    base = "/api/v1/entities/definitions"
    schema = {"type": "object", "properties": {"f": {"type": "string"}}}
    resp = client.post(base, json={"name": "bounded", "displayName": "B", "schema": schema,
                                   "embeddingsConfig": {"enabled": False, "fields": ["f"] * 501}}, headers=headers)
    assert "embeddingsConfig" in assert_error(resp, 400)["error"]["details"]["fields"]
    resp = client.post(base, json={"name": "bounded", "displayName": "B", "schema": {"type": "object"}},
                       headers=headers)
    assert resp.status_code == 201, resp.get_json()
    body = assert_error(client.post(f"{base}/bounded/views", json={"name": "v", "columns": ["c" * 201]},
                                    headers=headers), 400)
    assert "columns" in body["error"]["details"]["fields"]
    body = assert_error(client.post(f"{base}/bounded/views", json={"name": "v", "sortBy": "s" * 201},
                                    headers=headers), 400)
    assert "sortBy" in body["error"]["details"]["fields"]


def test_tool_definitions_by_ids_that_cannot_fit_are_refused_before_loading(make_app, org_id, auth):
    from app.db import db

    app = make_app(MAX_RESPONSE_BYTES=200_000)
    reg = Registry(app.test_client(), auth("read:agents", "write:agents"))
    small, big = reg.create_tool(), reg.create_tool()
    with app.app_context(), db.engine.connect() as conn:
        conn.execute(text("UPDATE product_default.tool_definitions SET doc = jsonb_set(doc, '{metadata}', "
                          "jsonb_build_object('blob', repeat('x', 300000))) WHERE org_id = :org AND id = :id"),
                     {"org": org_id, "id": big["id"]})
        conn.commit()
    body = assert_error(reg.post("/tool-definitions/by-ids", {"ids": [small["id"], big["id"]]}), 413,
                        "PAYLOAD_TOO_LARGE")
    assert "fewer ids" in body["error"]["message"]
    assert reg.post("/tool-definitions/by-ids", {"ids": [small["id"]]}).get_json()["toolDefinitions"][0]["id"] == \
        small["id"]


def test_react_config_keeps_unknown_fields_but_is_bounded_as_a_whole(reg):
    resp = reg.post("/agents", agent_body(type="react", reactConfig={"maxIterations": 5, "notes": "x" * (5 * MB)}))
    body = assert_error(resp, 400)
    assert "JSON_FIELD_MAX_BYTES" in str(body["error"]["details"]["fields"]["reactConfig"])
    agent = reg.create_agent(type="react", reactConfig={"maxIterations": 5, "notes": "short"})
    assert agent["reactConfig"]["notes"] == "short"
