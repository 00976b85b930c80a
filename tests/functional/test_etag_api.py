"""ETag, If-Match and If-None-Match on records, definitions, agents, catalog skills, tool definitions,
sub-agents and widgets (app.preconditions), through HTTP
against the real PostgreSQL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.agents import schemas as agent_schemas
from tests.conftest import dispose_database
from tests.functional.agents_support import agent_body
from tests.functional.entities_support import create_definition
from tests.support import assert_error

RECORDS = "/api/v1/entities/items/records"
DEFINITION = "/api/v1/entities/definitions/items"
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "qty": {"type": "int"}}}


@pytest.fixture()
def writer(client, auth):
    headers = auth("read", "write")
    create_definition(client, headers, "items", SCHEMA)
    return headers


def new_record(client, headers, **fields) -> tuple[str, str]:
    made = client.post(RECORDS, json={"fields": fields or {"title": "a"}}, headers=headers)
    assert made.status_code == 201 and made.headers["ETag"] == '"1"'
    return made.get_json()["id"], made.headers["ETag"]


# -- records --------------------------------------------------------------------------------------------

def test_a_record_read_has_its_etag_and_if_none_match_answers_304(client, writer):
    record_id, tag = new_record(client, writer)
    read = client.get(f"{RECORDS}/{record_id}", headers=writer)
    assert read.status_code == 200 and read.headers["ETag"] == tag == '"1"'
    for held in ('"1"', 'W/"1"', '"7", "1"', "*"):  # If-None-Match compares weakly
        same = client.get(f"{RECORDS}/{record_id}", headers=writer | {"If-None-Match": held})
        assert same.status_code == 304 and same.data == b"" and same.headers["ETag"] == '"1"', held
    other = client.get(f"{RECORDS}/{record_id}", headers=writer | {"If-None-Match": '"2"'})
    assert other.status_code == 200 and other.get_json()["version"] == 1


def test_if_match_guards_a_record_update(client, writer):
    record_id, tag = new_record(client, writer)
    updated = client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 1}}, headers=writer | {"If-Match": tag})
    assert updated.status_code == 200 and updated.headers["ETag"] == '"2"'
    stale = client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 2}}, headers=writer | {"If-Match": tag})
    error = assert_error(stale, 412, "PRECONDITION_FAILED")["error"]
    assert error["details"] == {"header": "If-Match", "etag": '"2"'}
    assert "ETag" not in stale.headers
    # a weak tag never matches If-Match (strong comparison)
    assert_error(client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 2}},
                            headers=writer | {"If-Match": 'W/"2"'}), 412, "PRECONDITION_FAILED")
    current = client.get(f"{RECORDS}/{record_id}", headers=writer).get_json()
    assert current["version"] == 2 and current["fields"] == {"title": "a", "qty": 1}
    # any of a list matches; `*` matches any current version; no header: unconditional, as before
    assert client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 3}},
                      headers=writer | {"If-Match": '"9", "2"'}).headers["ETag"] == '"3"'
    assert client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 4}},
                      headers=writer | {"If-Match": "*"}).headers["ETag"] == '"4"'
    assert client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 5}}, headers=writer).headers["ETag"] == '"5"'
    # the body's `version` keeps its 409
    assert_error(client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 6}, "version": 1}, headers=writer),
                 409, "CONFLICT")


def test_if_match_guards_a_record_delete(client, writer):
    record_id, _ = new_record(client, writer)
    client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": 1}}, headers=writer)
    assert_error(client.delete(f"{RECORDS}/{record_id}", headers=writer | {"If-Match": '"1"'}),
                 412, "PRECONDITION_FAILED")
    assert client.get(f"{RECORDS}/{record_id}", headers=writer).status_code == 200
    assert client.delete(f"{RECORDS}/{record_id}", headers=writer | {"If-Match": '"2"'}).status_code == 200
    assert client.get(f"{RECORDS}/{record_id}", headers=writer).status_code == 404


def test_the_lost_update_storm_ends_with_one_winner(make_app, auth):
    """100 callers read version 1, then all PUT with `If-Match: "1"` at once: one 200, 99 412, and the
    record holds exactly the winner's write."""
    storm_app = make_app(DB_POOL_SIZE=25, DB_POOL_TIMEOUT=120)
    headers = auth("read", "write")
    setup = storm_app.test_client()
    create_definition(setup, headers, "items", SCHEMA)
    record_id, _ = new_record(setup, headers)
    start = threading.Barrier(100)

    def writer(n: int):
        client = storm_app.test_client()
        tag = client.get(f"{RECORDS}/{record_id}", headers=headers).headers["ETag"]
        start.wait(120)
        answer = client.put(f"{RECORDS}/{record_id}", json={"fields": {"qty": n}}, headers=headers | {"If-Match": tag})
        return n, answer.status_code, answer.get_json()

    try:
        with ThreadPoolExecutor(100) as pool:
            outcomes = list(pool.map(writer, range(100)))
    finally:
        dispose_database(storm_app)
    statuses = sorted(status for _, status, _ in outcomes)
    assert statuses == [200] + [412] * 99, statuses
    assert all(body["error"]["code"] == "PRECONDITION_FAILED" for _, status, body in outcomes if status == 412)
    (winner,) = [n for n, status, _ in outcomes if status == 200]
    final = setup.get(f"{RECORDS}/{record_id}", headers=headers).get_json()
    assert final["version"] == 2 and final["fields"] == {"title": "a", "qty": winner}


# -- definitions ----------------------------------------------------------------------------------------

def test_definitions_have_etags_and_if_match(client, writer):
    read = client.get(DEFINITION, headers=writer)
    tag = read.headers["ETag"]
    assert read.status_code == 200 and tag == f'"{read.get_json()["definition"]["version"]}"'
    assert client.get(DEFINITION, headers=writer | {"If-None-Match": tag}).status_code == 304
    changed = client.put(DEFINITION, json={"description": "first"}, headers=writer | {"If-Match": tag})
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    assert_error(client.put(DEFINITION, json={"description": "second"}, headers=writer | {"If-Match": tag}),
                 412, "PRECONDITION_FAILED")
    assert client.get(DEFINITION, headers=writer).get_json()["definition"]["description"] == "first"
    # a new default view changes what GET answers (defaultViewId) without a new version: a new ETag
    before = client.get(DEFINITION, headers=writer).headers["ETag"]
    view = client.post(f"{DEFINITION}/views", json={"name": "all", "columns": ["title"], "isDefault": True},
                       headers=writer)
    assert view.status_code == 201, view.get_json()
    after = client.get(DEFINITION, headers=writer)
    assert after.get_json()["definition"]["defaultViewId"] == view.get_json()["id"]
    assert after.headers["ETag"] != before
    assert client.get(DEFINITION, headers=writer | {"If-None-Match": before}).status_code == 200
    assert_error(client.delete(DEFINITION, headers=writer | {"If-Match": before}), 412, "PRECONDITION_FAILED")
    assert client.delete(DEFINITION, headers=writer | {"If-Match": after.headers["ETag"]}).status_code == 200


# -- agents ---------------------------------------------------------------------------------------------

def test_agents_have_etags_and_if_match(client, auth):
    headers = auth("read:agents", "write:agents")
    made = client.post("/api/v1/agents", json=agent_body(), headers=headers)
    assert made.status_code == 201
    url = f"/api/v1/agents/{made.get_json()['agent']['id']}"
    read = client.get(url, headers=headers)
    tag = read.headers["ETag"]
    assert read.status_code == 200 and len(tag) == 34 and tag.startswith('"')
    assert client.get(url, headers=headers | {"If-None-Match": tag}).status_code == 304
    changed = client.put(url, json={"title": "Billing agent"}, headers=headers | {"If-Match": tag})
    assert changed.status_code == 200 and changed.get_json()["agent"]["title"] == "Billing agent"
    # the write's ETag is the one the next read answers (the tag of what GET sends)
    assert changed.headers["ETag"] == client.get(url, headers=headers).headers["ETag"] != tag
    assert_error(client.put(url, json={"title": "Lost"}, headers=headers | {"If-Match": tag}), 412,
                 "PRECONDITION_FAILED")
    assert client.get(url, headers=headers).get_json()["agent"]["title"] == "Billing agent"
    assert_error(client.delete(url, headers=headers | {"If-Match": tag}), 412, "PRECONDITION_FAILED")
    assert client.delete(url, headers=headers | {"If-Match": changed.headers["ETag"]}).status_code == 200
    assert client.get(url, headers=headers).status_code == 404


# -- catalog skills, tool definitions, sub-agents, widgets ---------------------------------------------

def _registry_resource(client, headers, kind: str) -> tuple[str, str, dict, str]:
    """(url of the single resource, url of another GET of it or "", update body, wrapper key)."""
    if kind == "skill":
        made = client.post("/api/v1/skills", json=agent_schemas.SKILL_EXAMPLE, headers=headers)
        assert made.status_code == 201, made.get_json()
        url = f"/api/v1/skills/{made.get_json()['skill']['id']}"
        return url, "/api/v1/skills/by-name?name=order-help", {"title": "Order and refund help"}, "skill"
    if kind == "tool":
        made = client.post("/api/v1/tool-definitions", json=agent_schemas.TOOL_DEFINITION_EXAMPLE, headers=headers)
        assert made.status_code == 201, made.get_json()
        url = f"/api/v1/tool-definitions/{made.get_json()['toolDefinition']['id']}"
        return url, "", {"toolDefinition": {"description": "Find an order"}}, "toolDefinition"
    if kind == "subagent":
        made = client.post("/api/v1/subagents", json=agent_schemas.SUB_AGENT_EXAMPLE, headers=headers)
        assert made.status_code == 201, made.get_json()
        url = f"/api/v1/subagents/{made.get_json()['subAgent']['id']}"
        return url, "", {"subAgent": {"temperature": 0.2}}, "subAgent"
    agent = client.post("/api/v1/agents", json=agent_body(), headers=headers).get_json()["agent"]["id"]
    made = client.post(f"/api/v1/agents/{agent}/widgets", json=agent_schemas.WIDGET_EXAMPLE, headers=headers)
    assert made.status_code == 201, made.get_json()
    widget = made.get_json()["widget"]["id"]
    assert client.post(f"/api/v1/widgets/{widget}/default", json={"agentId": agent}, headers=headers).status_code == 200
    return f"/api/v1/widgets/{widget}", f"/api/v1/agents/{agent}/widgets/default", \
        {"widget": {"greeting": "Hello!"}}, "widget"


@pytest.mark.parametrize("kind", ["skill", "tool", "subagent", "widget"])
def test_registry_documents_have_etags_and_if_match(client, auth, kind):
    headers = auth("read:agents", "write:agents")
    url, other, change, key = _registry_resource(client, headers, kind)
    # by skill name: PUT and DELETE are by name, and the tag is the same document's
    write_url = other if kind == "skill" else url
    read = client.get(url, headers=headers)
    tag = read.headers["ETag"]
    assert read.status_code == 200 and len(tag) == 34 and tag.startswith('"')
    if other:
        assert client.get(other, headers=headers).headers["ETag"] == tag  # one document, one tag
    held = client.get(url, headers=headers | {"If-None-Match": tag})
    assert held.status_code == 304 and held.data == b"" and held.headers["ETag"] == tag
    assert client.get(url, headers=headers | {"If-None-Match": '"other"'}).status_code == 200
    changed = client.put(write_url, json=change, headers=headers | {"If-Match": tag})
    assert changed.status_code == 200, changed.get_json()
    # the write's ETag is the one the next read answers (the tag of what GET sends)
    assert changed.headers["ETag"] == client.get(url, headers=headers).headers["ETag"] != tag
    lost = client.put(write_url, json=change, headers=headers | {"If-Match": tag})
    error = assert_error(lost, 412, "PRECONDITION_FAILED")
    assert error["error"]["details"] == {"header": "If-Match", "etag": changed.headers["ETag"]}
    assert_error(client.delete(write_url, headers=headers | {"If-Match": tag}), 412, "PRECONDITION_FAILED")
    assert client.get(url, headers=headers).status_code == 200  # a refused delete deleted nothing
    # without If-Match the write is unconditional, as before; `*` matches any current version
    assert client.put(write_url, json=change, headers=headers).status_code == 200
    starred = client.put(write_url, json=change, headers=headers | {"If-Match": "*"})
    assert starred.status_code == 200
    current = client.get(url, headers=headers).headers["ETag"]
    assert starred.headers["ETag"] == current  # every write stamps updatedAt: a new tag
    assert client.delete(write_url, headers=headers | {"If-Match": current}).status_code == 200
    assert client.get(url, headers=headers).status_code == 404
    assert key in changed.get_json()


def test_a_widget_losing_its_default_changes_its_etag(client, auth):
    """Another widget becoming the default rewrites this one's document (isDefault false) without an update
    of it: its tag follows the representation, so an If-Match from before is stale."""
    headers = auth("read:agents", "write:agents")
    url, _, _, _ = _registry_resource(client, headers, "widget")
    agent = client.get(url, headers=headers).get_json()["widget"]["agentId"]
    tag = client.get(url, headers=headers).headers["ETag"]
    second = client.post(f"/api/v1/agents/{agent}/widgets", json={"widget": {"name": "second"}}, headers=headers)
    assert second.status_code == 201, second.get_json()
    assert client.post(f"/api/v1/widgets/{second.get_json()['widget']['id']}/default", json={"agentId": agent},
                       headers=headers).status_code == 200
    now = client.get(url, headers=headers)
    assert now.get_json()["widget"]["isDefault"] is False and now.headers["ETag"] != tag
    assert_error(client.put(url, json={"widget": {"greeting": "Hi"}}, headers=headers | {"If-Match": tag}), 412,
                 "PRECONDITION_FAILED")


# -- documentation --------------------------------------------------------------------------------------

def test_the_openapi_document_states_etags_and_preconditions(client):
    paths = client.get("/api/v1/openapi.json").get_json()["paths"]
    for path in ("/api/v1/entities/{entityName}/records/{recordId}", "/api/v1/entities/definitions/{entityName}",
                 "/api/v1/agents/{agentId}", "/api/v1/skills/by-name", "/api/v1/tool-definitions/{toolDefId}",
                 "/api/v1/subagents/{subAgentId}", "/api/v1/widgets/{widgetId}"):
        get, put, delete = (paths[path][m] for m in ("get", "put", "delete"))
        assert any(p["name"] == "If-None-Match" for p in get["parameters"]), path
        assert "304" in get["responses"] and "ETag" in get["responses"]["200"]["headers"], path
        for write in (put, delete):
            assert any(p["name"] == "If-Match" and p["in"] == "header" for p in write["parameters"]), path
            assert "412" in write["responses"], path
        assert "ETag" in put["responses"]["200"]["headers"], path
