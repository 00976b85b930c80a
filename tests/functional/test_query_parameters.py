"""Unknown query parameters (app.extensions: every query schema refuses what it does not declare), through
HTTP against the real PostgreSQL: a typo such as `?limt=5` is a 400 naming it, never a silent full answer."""

from __future__ import annotations

import pytest

from tests.functional.agents_support import agent_body
from tests.functional.entities_support import BASE, create_definition, create_record
from tests.support import assert_error

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}}


@pytest.fixture()
def headers(auth):
    return auth("read", "write", "read:agents", "write:agents")


def unknown(response, *names: str) -> dict:
    error = assert_error(response, 400, "VALIDATION_ERROR")["error"]
    assert error["details"]["location"] == "query"
    assert sorted(error["details"]["fields"]) == sorted(names)
    for name in names:
        assert f"'{name}'" in error["message"]
    return error


def test_a_typo_in_a_paging_parameter_is_400_naming_it_and_what_the_operation_takes(client, headers):
    error = unknown(client.get("/api/v1/tool-definitions?limt=5", headers=headers), "limt")
    assert error["message"] == "Unknown query parameter 'limt'; this operation takes: cursor, limit."
    assert client.get("/api/v1/tool-definitions?limit=5", headers=headers).status_code == 200


def test_several_unknown_parameters_are_named_together(client, headers):
    error = unknown(client.get("/api/v1/agents?limt=5&stauts=active&status=active", headers=headers),
                    "limt", "stauts")
    assert error["message"].startswith("Unknown query parameters 'limt', 'stauts'; this operation takes: ")
    assert "isDefault" in error["message"] and "type" in error["message"]


def test_a_typo_in_a_destructive_flag_changes_nothing(client, headers):
    create_definition(client, headers, "items", SCHEMA)
    create_record(client, headers, "items", {"fields": {"title": "keep me"}})
    unknown(client.delete(f"{BASE}/definitions/items?hardDelet=true", headers=headers), "hardDelet")
    assert client.get(f"{BASE}/definitions/items", headers=headers).status_code == 200
    assert client.delete(f"{BASE}/definitions/items?hardDelete=true&deleteRecords=true",
                         headers=headers).status_code == 200


@pytest.mark.parametrize("url", [
    f"{BASE}/definitions?modul=crm",
    f"{BASE}/definitions/items/views?limt=1",
    "/api/v1/skills/by-name?name=x&nam=y",
    "/api/v1/analytics/summary?form=2026-01-01",
    "/api/v1/analytics/series?intervall=week",
    "/api/v1/subagents?curser=x",
])
def test_declared_query_schemas_refuse_unknown_parameters(client, headers, url):
    create_definition(client, headers, "items", SCHEMA)
    name = url.split("?")[1].split("=")[0] if url.count("=") == 1 else url.split("&")[1].split("=")[0]
    unknown(client.get(url, headers=headers), name)


def test_known_parameters_and_operations_without_a_query_schema_are_unchanged(client, headers):
    made = client.post("/api/v1/agents", json=agent_body(), headers=headers)
    agent_id = made.get_json()["agent"]["id"]
    assert client.get("/api/v1/agents?status=draft&limit=10", headers=headers).status_code == 200
    assert client.get(f"{BASE}/definitions?status=active&limit=10", headers=headers).status_code == 200
    assert client.get(f"/api/v1/agents/{agent_id}", headers=headers).status_code == 200
    assert client.get("/api/v1/me", headers=headers).status_code == 200
    # the health probes are not API clients: a parameter (a monitor's cache buster) is ignored
    assert client.get("/health?verbose=1").status_code == 200


def test_an_operation_without_query_parameters_refuses_any(client, headers):
    """An operation that declares no query parameter answers the same 400 for one sent (it would otherwise
    be ignored): `?x=1` on GET /api/v1/me, the envelope naming it and saying the operation takes none."""
    response = client.get("/api/v1/me?x=1", headers=headers)
    error = unknown(response, "x")
    assert error["message"] == "Unknown query parameter 'x'; this operation takes: none."
    body = response.get_json()
    assert body["metadata"]["success"] is False and isinstance(body["metadata"]["timestamp"], int)


@pytest.mark.parametrize("method,url,names", [
    ("get", "/api/v1/me?x=1&y=2", ("x", "y")),
    ("get", f"{BASE}/definitions/items?limit=1", ("limit",)),
    ("put", f"{BASE}/definitions/items?dryRun=true", ("dryRun",)),
    ("post", "/api/v1/agents?draft=1", ("draft",)),
])
def test_operations_without_query_parameters_refuse_unknown_ones(client, headers, method, url, names):
    create_definition(client, headers, "items", SCHEMA)
    body = {"description": "changed"} if method == "put" else agent_body() if method == "post" else None
    unknown(getattr(client, method)(url, json=body, headers=headers), *names)
    # nothing changed: the definition keeps its description, no agent was created
    assert client.get(f"{BASE}/definitions/items", headers=headers).get_json()["definition"].get(
        "description") != "changed"
    assert client.get("/api/v1/agents", headers=headers).get_json()["agents"] == []


def test_a_method_view_refuses_unknown_parameters_per_method(client, headers):
    """A route class's methods each refuse what they do not declare: GET agent by id takes none."""
    agent_id = client.post("/api/v1/agents", json=agent_body(), headers=headers).get_json()["agent"]["id"]
    unknown(client.get(f"/api/v1/agents/{agent_id}?anything=1", headers=headers), "anything")

