"""Ids of the agent registry are made by the server, so none can spell a sibling route's word
(`/api/v1/agents/summary`, `default`, `by-name`, `import`; `/skills/by-name`, `/skills/categories`; …)
and every stored document stays reachable at its own URL. Through HTTP against the real PostgreSQL."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.functional.agents_support import agent_body

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
ROUTE_WORDS = ("summary", "default", "by-name", "import")


@pytest.fixture()
def headers(auth):
    return auth("read:agents", "write:agents")


@pytest.mark.parametrize("word", ROUTE_WORDS)
def test_an_id_sent_on_create_is_ignored_and_the_agent_stays_reachable(client, headers, word):
    made = client.post("/api/v1/agents", json=agent_body(id=word), headers=headers)
    assert made.status_code == 201, made.get_json()
    agent_id = made.get_json()["agent"]["id"]
    assert agent_id != word and UUID.match(agent_id)
    assert client.get(f"/api/v1/agents/{agent_id}", headers=headers).get_json()["agent"]["id"] == agent_id


@pytest.mark.parametrize("word", ROUTE_WORDS)
def test_an_imported_agent_gets_a_new_id_whatever_its_export_said(client, headers, word):
    exported = {**agent_body(), "id": word, "orgId": "another-org"}
    made = client.post("/api/v1/agents/import", json=exported, headers=headers)
    assert made.status_code == 201, made.get_json()
    agent_id = made.get_json()["agent"]["id"]
    assert agent_id != word and UUID.match(agent_id)
    assert client.get(f"/api/v1/agents/{agent_id}", headers=headers).status_code == 200
    # the sibling routes still answer as themselves
    assert client.get("/api/v1/agents/summary", headers=headers).status_code == 200


@pytest.mark.parametrize("path, key, body", [
    ("/api/v1/skills", "skill", {"name": "order-help", "title": "Order help", "category": "support",
                                 "id": "by-name"}),
    ("/api/v1/tool-definitions", "toolDefinition", {"toolDefinition": {
        "name": "lookup_order", "id": "by-ids", "inputSchema": {"type": "object", "properties": {}}}}),
    ("/api/v1/subagents", "subAgent", {"subAgent": {"name": "researcher", "id": "summary"}}),
])
def test_catalog_ids_are_server_made_too(client, headers, path, key, body):
    made = client.post(path, json=body, headers=headers)
    assert made.status_code == 201, made.get_json()
    assert UUID.match(made.get_json()[key]["id"])


def test_no_sibling_route_word_can_be_a_server_made_id(app):
    """Every literal segment that sits where an id goes (`/agents/<agentId>` beside `/agents/summary`) is
    not a UUID, the only shape the registry gives ids (app.wire.new_id): they can never collide."""
    id_routes = [r.rule for r in app.url_map.iter_rules() if r.rule.startswith("/api/v1/")]
    words = set()
    for rule in id_routes:
        head, _, last = rule.rpartition("/")
        if "<" in last or not any(other.startswith(head + "/<") and other.count("/") == rule.count("/")
                                  for other in id_routes):
            continue
        words.add(last)
    assert {"summary", "default", "by-name", "import"} <= words
    assert not [word for word in words if UUID.match(word)]
    assert UUID.match(str(uuid.uuid4()))
