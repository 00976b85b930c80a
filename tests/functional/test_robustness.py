"""Hostile input never stalls a worker or answers 500 (issue 12; DESIGN.md §5)."""

from __future__ import annotations

import threading

import pytest

from tests.functional.agents_support import Registry, agent_body, assert_error, tool_definition_body
from tests.functional.entities_support import BASE, create_definition

BOMB = "^(a+)+$"
BOMB_INPUT = "a" * 40 + "!"


def _answers_quickly(call, seconds: float = 10.0):
    """Run `call` in a thread; the test fails (instead of hanging the suite) if it has not answered
    within `seconds` — a backtracking engine needs minutes for the inputs used here."""
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("resp", call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert "resp" in out, "the request did not answer: the pattern backtracks"
    return out["resp"]


# --- 1. caller-supplied regular expressions run on RE2 ---------------------------------------------

def test_backtracking_pattern_in_definition_is_linear(client, auth):
    headers = auth()
    create_definition(client, headers, "words", {"type": "object", "properties": {
        "word": {"type": "string", "pattern": BOMB},
        "extra": {"type": "json", "patternProperties": {"^(x+x+)+y$": {"type": "integer"}}}}})
    resp = _answers_quickly(lambda: client.post(f"{BASE}/words/records", json={"fields": {"word": BOMB_INPUT}},
                                                headers=headers))
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "word" in str(body["error"]["details"])
    resp = _answers_quickly(lambda: client.post(
        f"{BASE}/words/records", json={"fields": {"word": "aaa", "extra": {"x" * 40: "no"}}}, headers=headers))
    assert resp.status_code == 201, resp.get_json()  # the key does not end in y: not matched, no backtracking
    resp = client.post(f"{BASE}/words/records", json={"fields": {"word": "aaa", "extra": {"xxy": "no"}}},
                       headers=headers)
    assert_error(resp, 400, "VALIDATION_ERROR")


@pytest.mark.parametrize("pattern", [r"^(a)\1$", r"^(?=a)a$", r"(?<!x)y", "[unclosed"])
def test_patterns_re2_cannot_run_are_refused_when_saved(client, auth, pattern):
    headers = auth()
    resp = client.post(f"{BASE}/definitions", headers=headers, json={
        "name": "bad", "schema": {"type": "object", "properties": {"w": {"type": "string", "pattern": pattern}}}})
    body = assert_error(resp, 400, "VALIDATION_ERROR")
    assert "schema" in str(body["error"]["details"])
    registry = Registry(client, headers)
    resp = registry.post("/agents", agent_body(configSchema={"type": "object", "patternProperties": {
        pattern: {"type": "string"}}}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = registry.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        configSchema={"type": "object", "properties": {"e": {"type": "string", "pattern": pattern}}},
        defaultConfig={})})
    assert_error(resp, 400, "VALIDATION_ERROR")


def test_backtracking_pattern_in_agent_and_tool_config_schema_is_linear(client, auth):
    registry = Registry(client, auth())
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": BOMB}}}
    resp = _answers_quickly(lambda: registry.post("/agents", agent_body(configSchema=schema,
                                                                       config={"code": BOMB_INPUT})))
    assert_error(resp, 400, "VALIDATION_ERROR")
    agent = registry.create_agent(configSchema=schema, config={"code": "aaaa"})
    resp = _answers_quickly(lambda: registry.put(f"/agents/{agent['id']}", {**agent_body(
        name=agent["name"], configSchema=schema), "config": {"code": BOMB_INPUT}}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    resp = _answers_quickly(lambda: registry.post("/tool-definitions", {"toolDefinition": tool_definition_body(
        configSchema=schema, defaultConfig={"code": BOMB_INPUT})}))
    assert_error(resp, 400, "VALIDATION_ERROR")
    # `format: regex` values are judged by RE2 as well
    resp = registry.post("/agents", agent_body(
        configSchema={"type": "object", "properties": {"re": {"type": "string", "format": "regex"}}},
        config={"re": r"(a)\1"}))
    assert_error(resp, 400, "VALIDATION_ERROR")
