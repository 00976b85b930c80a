"""Helpers for the agent registry tests: valid bodies and short-hands for the HTTP calls."""

from __future__ import annotations

import copy
import threading
import uuid

SERVER_FIELDS = ("id", "orgId", "product", "createdAt", "updatedAt", "createdBy", "updatedBy")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def agent_body(**over) -> dict:
    body = {"name": unique("agent"), "title": "Support agent", "type": "chat", "provider": "provider-x",
            "model": "large-chat"}
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


def rich_agent_body(**over) -> dict:
    """An agent that uses every nested config (tool and skill references are added by the caller)."""
    body = agent_body(
        description="Answers billing questions", systemPrompt="You answer billing questions.",
        goal="Resolve billing questions", tags=["billing", "tier-1"], isPublic=True,
        csatConfig={"enabled": True, "survey": {
            "questions": [{"id": "q1", "question": "How did we do?", "type": "rating", "scale": 5,
                           "required": True},
                          {"question": "Anything else?", "type": "text", "required": False},
                          {"question": "Pick one", "type": "choice", "options": ["a", "b"], "required": True}],
            "timeThreshold": 120, "closeOnResponse": True}},
        handoffConfig={"enabled": True, "triggerKeywords": ["human", "agent"], "queueId": "billing-queue",
                       "handoffMessage": "Connecting you to a person."},
        widgetConfig={"theme": {"primaryColor": "#123456"}}, userSuggestedActionsConfig={"enabled": True},
        contextConfig={"maxMessages": 20},
        configSchema={"type": "object", "properties": {"region": {"type": "string", "enum": ["eu", "us"]},
                                                        "retries": {"type": "integer", "minimum": 0}},
                      "required": ["region"]},
        config={"region": "eu", "retries": 2}, iconName="credit-card", capabilities=["refunds", "invoices"],
        samplePrompts=["Where is my invoice?"], responseStyle="concise", personalityTraits=["friendly"],
        fallbackMessage="Sorry, I cannot help with that.", responseDelay=250, maxConcurrency=5,
        sessionTimeout=1800, sourceTemplateId="tmpl-1", sourceTemplateVersion="2.1.0", scope="team",
        scopeId="team-7", isFavorite=True, lastUsedAt="2026-11-20T08:00:00Z", usageCount=42, artifactVersion=3,
        metadata={"owner": "billing"}, version="2.0.0", temperature=0.2, maxTokens=4096)
    body.update(over)
    return copy.deepcopy(body)


def tool_definition_body(**over) -> dict:
    body = {"name": unique("lookup_invoice").replace("-", "_"), "title": "Look up invoice",
            "description": "Find an invoice by number", "type": "api", "category": "billing",
            "inputSchema": {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]},
            "outputSchema": {"type": "object", "properties": {"amount": {"type": "number"}}},
            "configSchema": {"type": "object", "properties": {"endpoint": {"type": "string", "format": "uri"}}},
            "defaultConfig": {"endpoint": "https://billing.example.com/api"}}
    body.update(over)
    return body


def agent_tool(tool_def: dict, **over) -> dict:
    tool = {"toolId": tool_def["id"], "toolName": tool_def["name"], "title": tool_def.get("title"),
            "type": tool_def.get("type"), "inputSchema": tool_def.get("inputSchema"),
            "configSchema": tool_def.get("configSchema"), "config": tool_def.get("defaultConfig"),
            "enabled": True, "order": 0}
    tool.update(over)
    return {k: v for k, v in tool.items() if v is not None}


def skill_body(**over) -> dict:
    body = {"name": unique("summarize"), "title": "Summarize", "category": "writing",
            "description": "Summarises long text", "slashCommand": "/summarize", "iconName": "scroll",
            "systemPromptExtension": "Summarise in three bullet points.", "artifactVersion": 1}
    body.update(over)
    return body


def without_server_fields(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in SERVER_FIELDS}


class Registry:
    """Short-hands for the registry routes with one set of headers."""

    def __init__(self, client, headers):
        self.client, self.headers = client, headers

    def get(self, path, **kw):
        return self.client.get(f"/api/v1{path}", headers=self.headers, **kw)

    def post(self, path, json=None, **kw):
        return self.client.post(f"/api/v1{path}", json=json, headers=self.headers, **kw)

    def put(self, path, json=None, **kw):
        return self.client.put(f"/api/v1{path}", json=json, headers=self.headers, **kw)

    def delete(self, path, **kw):
        return self.client.delete(f"/api/v1{path}", headers=self.headers, **kw)

    def create_agent(self, **over) -> dict:
        resp = self.post("/agents", agent_body(**over))
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return resp.get_json()["agent"]

    def create_tool(self, **over) -> dict:
        resp = self.post("/tool-definitions", {"toolDefinition": tool_definition_body(**over)})
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return resp.get_json()["toolDefinition"]

    def create_skill(self, **over) -> dict:
        resp = self.post("/skills", skill_body(**over))
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return resp.get_json()["skill"]

    def create_sub_agent(self, **over) -> dict:
        body = {"name": unique("researcher"), "provider": "provider-x", "model": "small-chat"}
        body.update(over)
        resp = self.post("/subagents", {"subAgent": body})
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return resp.get_json()["subAgent"]

    def create_widget(self, agent_id: str, **over) -> dict:
        body = {"name": unique("widget")}
        body.update(over)
        resp = self.post(f"/agents/{agent_id}/widgets", {"widget": body})
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return resp.get_json()["widget"]


def concurrently(app, calls):
    """Run each call (client -> response) in its own thread, released together."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(index, call):
        client = app.test_client()
        barrier.wait()
        results[index] = call(client)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
