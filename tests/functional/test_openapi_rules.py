"""The documented OpenAPI schema and the behaviour agree, through HTTP: for bodies on both sides of
each rule the code enforces (cross-field rules, patterns, enums, create-only required fields), the
documented request schema accepts a body exactly when the API does."""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft7Validator

from tests.functional.agents_support import Registry, agent_body, unique
from tests.functional.entities_support import BASE, create_definition

SURVEY = {"questions": [{"question": "Pick one", "type": "choice", "options": ["a", "b"]}], "timeThreshold": 30,
          "closeOnResponse": True}
ONE_OPTION = {**SURVEY, "questions": [{"question": "Pick one", "type": "choice", "options": ["a"]}]}
TOOL = {"toolId": "t1", "toolName": "t1", "enabled": True}


def _json_schema(node, doc):
    """OpenAPI 3.0 → JSON Schema draft 7: component refs inlined into `definitions`, `nullable` as a null branch."""
    if isinstance(node, list):
        return [_json_schema(n, doc) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v, doc) for k, v in node.items() if k != "nullable"}
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/definitions/")
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture(scope="module")
def documented(app):
    doc = app.test_client().get("/api/v1/openapi.json").get_json()
    definitions = {name: _json_schema(schema, doc) for name, schema in doc["components"]["schemas"].items()}

    def accepts(method: str, path: str, body) -> bool:
        request = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
        schema = {**_json_schema(request, doc), "definitions": definitions}
        return Draft7Validator(schema).is_valid(body)

    return doc, accepts


def test_no_nested_object_is_documented_as_any_object(documented):
    doc, _ = documented
    loose = {"type": "object", "nullable": True}

    def walk(node):
        if isinstance(node, dict):
            assert loose not in (node.get("anyOf") or []), node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc["components"])


AGENT_CASES = [
    ("choice question with two options", {"csatConfig": {"enabled": True, "survey": SURVEY}}, True),
    ("choice question with one option", {"csatConfig": {"enabled": True, "survey": ONE_OPTION}}, False),
    ("CSAT enabled without a survey", {"csatConfig": {"enabled": True}}, False),
    ("CSAT disabled without a survey", {"csatConfig": {"enabled": False}}, True),
    ("scope custom without scopeId", {"scope": "custom"}, False),
    ("scope custom with an empty scopeId", {"scope": "custom", "scopeId": ""}, False),
    ("scope team with scopeId", {"scope": "team", "scopeId": "team-1"}, True),
    ("scope user without scopeId", {"scope": "user"}, True),
    ("tool input schema {}", {"tools": [{**TOOL, "inputSchema": {}}]}, True),
    ("tool input schema of type string", {"tools": [{**TOOL, "inputSchema": {"type": "string"}}]}, False),
    ("tool input schema without a type", {"tools": [{**TOOL, "inputSchema": {"properties": {}}}]}, False),
    ("a sub-agent id listed twice", {"subAgentIds": ["s1", "s1"]}, False),
    ("the same tool id twice", {"tools": [TOOL, {**TOOL, "toolName": "t1_copy"}]}, True),
]


@pytest.mark.parametrize("label, over, ok", AGENT_CASES, ids=[c[0] for c in AGENT_CASES])
def test_agent_rules_agree_with_the_document(client, auth, documented, label, over, ok):
    _, accepts = documented
    reg = Registry(client, auth("read:agents", "write:agents"))
    body = agent_body(**copy.deepcopy(over))
    assert accepts("post", "/api/v1/agents", body) is ok, label
    status = reg.post("/agents", body).status_code
    assert (status == 201) is ok and status in (201, 400), (label, status)


@pytest.mark.parametrize("url, ok", [("https://cdn.example.com/widget.css?v=2", True),
                                     ("https://localhost:8443/w.css", True), ("http://cdn.example.com/w.css", False),
                                     ("https://", False), ("https://exa mple.com/w.css", False)])
def test_widget_css_url_agrees_with_the_document(client, auth, documented, url, ok):
    _, accepts = documented
    reg = Registry(client, auth("read:agents", "write:agents"))
    agent = reg.create_agent()
    body = {"widget": {"name": unique("w"), "customCssUrl": url}}
    assert accepts("post", "/api/v1/agents/{agentId}/widgets", body) is ok
    assert (reg.post(f"/agents/{agent['id']}/widgets", body).status_code == 201) is ok


def test_skill_persisted_is_ignored_whatever_its_value(client, auth, documented):
    _, accepts = documented
    reg = Registry(client, auth("read:agents", "write:agents"))
    body = {"name": unique("s"), "title": "S", "category": "c", "persisted": None}
    assert accepts("post", "/api/v1/skills", body)
    assert reg.post("/skills", body).get_json()["skill"]["persisted"] is True


COUNT = {"function": "count"}
ENTITY_CASES = [
    ("post", "/api/v1/entities/definitions", "/definitions", {"displayName": "No name", "schema": {}}, False),
    ("post", "/api/v1/entities/definitions", "/definitions", {"name": "definitions", "schema": {}}, False),
    ("post", "/api/v1/entities/definitions", "/definitions", {"name": "inactive", "isActive": False}, False),
    ("post", "/api/v1/entities/definitions/{entityName}/views", "/definitions/rules/views", {"type": "table"}, False),
    ("post", "/api/v1/entities/definitions/{entityName}/views", "/definitions/rules/views",
     {"name": "v", "sortOrder": "up"}, False),
    ("post", "/api/v1/entities/definitions/{entityName}/views", "/definitions/rules/views",
     {"name": "v", "sortOrder": "desc"}, True),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [{"function": "sum"}]}, False),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [{"function": "percentile", "field": "qty"}]}, False),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [{"function": "count", "percentile": 50}]}, False),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [{"function": "percentile", "field": "qty", "percentile": 90}]}, True),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [COUNT], "groupBy": [""]}, False),
    ("post", "/api/v1/entities/{entityName}/records/aggregate", "/rules/records/aggregate",
     {"aggregates": [COUNT], "limit": 0}, False),
    ("post", "/api/v1/entities/{entityName}/records/bulk/update", "/rules/records/bulk/update",
     {"records": [{"fields": {"qty": 1}}]}, False),
    ("post", "/api/v1/entities/{entityName}/records/bulk/create", "/rules/records/bulk/create",
     {"records": [None]}, False),
    ("post", "/api/v1/admin/entities/update", "/api/v1/admin/entities/update", {"definitions": [None]}, True),
]


@pytest.mark.parametrize("method, documented_path, path, body, ok", ENTITY_CASES)
def test_entity_rules_agree_with_the_document(client, auth, documented, method, documented_path, path, body, ok):
    _, accepts = documented
    headers = auth("read", "write", role="admin")
    create_definition(client, headers, name="rules", schema={"type": "object", "properties": {"qty": {"type": "int"}}})
    assert accepts(method, documented_path, body) is ok
    url = path if path.startswith("/api/") else f"{BASE}{path}"
    status = client.open(url, method=method.upper(), json=body, headers=headers).status_code
    assert (status < 300) is ok and status in (200, 201, 400), status


def test_documented_maxima_are_the_configured_ones(client, make_app, auth):
    """`pageSize` and the aggregate `limit` are documented with this app's settings, which the code
    enforces: an operator who lowers them gets a document that says so (and another app in the same
    process keeps its own document)."""
    def maxima(c):
        schemas = c.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
        return (schemas["QueryParams"]["properties"]["pageSize"]["maximum"],
                schemas["AggregateRequest"]["properties"]["limit"]["maximum"])

    assert maxima(client) == (500, 1000)
    small = make_app(ENTITY_MAX_PAGE_SIZE=40, ENTITY_AGGREGATE_MAX_GROUPS=9).test_client()
    assert maxima(small) == (40, 9)
    assert maxima(client) == (500, 1000)
    headers = auth()
    create_definition(small, headers, "paged", {"type": "object", "properties": {"k": {"type": "string"}}})
    for size, status in ((40, 200), (41, 400)):
        resp = small.post(f"{BASE}/paged/records/query", json={"query": {"pageSize": size}}, headers=headers)
        assert resp.status_code == status, resp.get_json()
    aggregate = {"groupBy": ["k"], "aggregates": [{"field": "k", "function": "count", "alias": "n"}]}
    for limit, status in ((9, 200), (10, 400)):
        resp = small.post(f"{BASE}/paged/records/aggregate", json={**aggregate, "limit": limit}, headers=headers)
        assert resp.status_code == status, resp.get_json()
