"""Agent registry reads: the API against the same reads done directly in SQL.

Setup: one org with 1 000 agents created through the API (realistic nested configs: 4 tools with
JSON Schemas, 2–3 attached catalog skills with tools, CSAT survey, handoff, configSchema +
config, widget/context configs, sub-agents, capabilities, sample prompts, a generated system
prompt), plus the catalog skills, tool definitions and sub-agents they reference.

Measured through the WSGI test client in one process (auth + tenancy + routing + response
included), interleaved with the SQL baseline: psycopg on the same database, `SELECT doc` /
`SELECT summary` with the same WHERE and ORDER BY, rows fetched and JSON-decoded by psycopg
(what an application reading the table directly would get). A second baseline fetches the same
columns cast to text (`doc::text`), i.e. without the decode, which is what the API itself does.
"""

from __future__ import annotations

import os
import random
import time

from sqlalchemy import create_engine, text

from bench.common import bench_app, bench_database_url, bench_token, summary, table, timed, write_result

ORG = "bench-agents"
AGENTS = 1000
SCHEMA = "product_default"
TABLES = ("agent_widgets", "agents", "skills", "tool_definitions", "sub_agents")


def _reset(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for name in TABLES:
            conn.execute(text(f"DELETE FROM {SCHEMA}.{name} WHERE org_id = :org"), {"org": ORG})
    engine.dispose()


def _ok(resp, status=201):
    assert resp.status_code == status, resp.get_data(as_text=True)[:500]
    return resp.get_json()


def _tool_definition(i: int) -> dict:
    return {"name": f"tool_{i}", "title": f"Tool {i}", "description": f"Calls backend operation {i}",
            "type": random.choice(["api", "search", "document", "extraction"]), "category": f"cat-{i % 4}",
            "inputSchema": {"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "description": "What to look for", "maxLength": 2000},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
                "filters": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "outputSchema": {"type": "object", "properties": {
                "results": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "score": {"type": "number"}, "snippet": {"type": "string"}}}}}},
            "configSchema": {"type": "object", "properties": {
                "endpoint": {"type": "string", "format": "uri"}, "timeoutMs": {"type": "integer", "minimum": 100}}},
            "defaultConfig": {"endpoint": f"https://svc-{i}.internal.example.com/v1", "timeoutMs": 5000}}


def _agent_tool(tool: dict, order: int) -> dict:
    return {"toolId": tool["id"], "toolName": tool["name"], "title": tool["title"],
            "description": tool["description"], "type": tool["type"], "inputSchema": tool["inputSchema"],
            "outputSchema": tool["outputSchema"], "configSchema": tool["configSchema"],
            "config": dict(tool["defaultConfig"]), "mergeConfig": {"strategy": "append"}, "enabled": True,
            "order": order}


def _agent(i: int, tools: list[dict], skills: list[dict], subs: list[dict]) -> dict:
    return {
        "name": f"agent-{i:04d}", "title": f"Agent {i}", "type": "react" if i % 5 == 0 else "chat",
        "subType": random.choice(["chat", "workflow", "document"]), "status": random.choice(["draft", "active"]),
        "description": f"Handles customer conversations for queue {i % 17}, escalates billing disputes.",
        "provider": "provider-x", "model": "large-chat", "temperature": 0.3, "maxTokens": 4096,
        "goal": "Resolve customer questions about orders, billing and shipping quickly and politely.",
        "tags": ["support", f"queue-{i % 17}", "tier-1"], "isPublic": i % 3 == 0,
        "tools": [_agent_tool(t, n) for n, t in enumerate(random.sample(tools, 4))],
        "subAgentIds": [s["id"] for s in random.sample(subs, 2)],
        "skills": [{"skillId": s["id"], "enabled": True, "order": n}
                   for n, s in enumerate(random.sample(skills, random.choice([2, 3])))],
        "csatConfig": {"enabled": True, "survey": {"questions": [
            {"id": "q1", "question": "How satisfied are you with this conversation?", "type": "rating", "scale": 5},
            {"id": "q2", "question": "Did we solve your problem?", "type": "yes_no"},
            {"id": "q3", "question": "What could we do better?", "type": "text", "required": False}],
            "timeThreshold": 300, "closeOnResponse": True}},
        "handoffConfig": {"enabled": True, "triggerKeywords": ["human", "agent", "representative", "complaint"],
                          "queueId": f"queue-{i % 17}", "handoffMessage": "Let me connect you with a colleague."},
        "widgetConfig": {"theme": {"primaryColor": "#2563EB", "mode": "light"}, "position": "bottom-right",
                         "greeting": "Hi! How can I help?"},
        "userSuggestedActionsConfig": {"enabled": True, "maxActions": 3},
        "contextConfig": {"maxMessages": 30, "includeUserProfile": True, "summarizeAfter": 20},
        "configSchema": {"type": "object", "required": ["region"], "properties": {
            "region": {"type": "string", "enum": ["eu", "us", "apac"]},
            "escalationThreshold": {"type": "number", "minimum": 0, "maximum": 1},
            "languages": {"type": "array", "items": {"type": "string"}}}},
        "config": {"region": random.choice(["eu", "us", "apac"]), "escalationThreshold": 0.7,
                   "languages": ["en", "de", "fr"]},
        "iconName": "headset", "capabilities": ["order status", "refunds", "shipping", "invoices"],
        "samplePrompts": ["Where is my order?", "I want a refund", "Change my shipping address"],
        "responseStyle": "friendly", "personalityTraits": ["patient", "precise"],
        "fallbackMessage": "I am not sure; let me find someone who knows.", "responseDelay": 300,
        "maxConcurrency": 50, "sessionTimeout": 1800, "scope": "org", "usageCount": i * 7,
        "metadata": {"owner": "support-team", "costCenter": f"cc-{i % 9}"},
    }


def seed(client, headers) -> list[str]:
    random.seed(7)
    tools = [_ok(client.post("/api/v1/tool-definitions", json={"toolDefinition": _tool_definition(i)},
                             headers=headers))["toolDefinition"] for i in range(20)]
    skills = []
    for i in range(12):
        body = {"name": f"skill-{i}", "title": f"Skill {i}", "category": f"category-{i % 4}",
                "description": "Adds a focused capability", "slashCommand": f"/skill{i}", "iconName": "sparkles",
                "systemPromptExtension": "When this skill is active, follow its procedure step by step. " * 3,
                "tools": [_agent_tool(t, n) for n, t in enumerate(random.sample(tools, 2))], "artifactVersion": 1}
        skills.append(_ok(client.post("/api/v1/skills", json=body, headers=headers))["skill"])
    subs = [_ok(client.post("/api/v1/subagents", headers=headers, json={"subAgent": {
        "name": f"sub-{i}", "provider": "provider-x", "model": "small-chat", "systemPrompt": "Research."}}))
        ["subAgent"] for i in range(6)]
    ids = []
    for i in range(AGENTS):
        ids.append(_ok(client.post("/api/v1/agents", json=_agent(i, tools, skills, subs), headers=headers))
                   ["agent"]["id"])
    return ids


def main() -> str:
    url = bench_database_url()
    _reset(url)
    app = bench_app()
    client = app.test_client()
    headers = {"Authorization": f"Bearer {bench_token(ORG, scopes=('read:agents', 'write:agents'))}"}
    started = time.perf_counter()
    ids = seed(client, headers)
    seed_seconds = time.perf_counter() - started

    load_before = os.getloadavg()[0]
    engine = create_engine(url)
    raw = engine.raw_connection()
    cursor = raw.cursor()
    rng = random.Random(11)

    def sql(query: str, *params):
        def run():
            cursor.execute(query, params)
            return cursor.fetchall()
        return run

    def api(path_fn):
        def run():
            resp = client.get(path_fn(), headers=headers)
            assert resp.status_code == 200
            return resp.data
        return run

    one_id = lambda: rng.choice(ids)  # noqa: E731
    by_id = f"SELECT {{}} FROM {SCHEMA}.agents WHERE org_id = %s AND id = %s"
    listing = f"SELECT {{}} FROM {SCHEMA}.agents WHERE org_id = %s ORDER BY name"
    cases = [
        ("GET /agents/{id}", api(lambda: f"/api/v1/agents/{one_id()}"),
         lambda: sql(by_id.format("doc"), ORG, one_id())(),
         lambda: sql(by_id.format("doc::text"), ORG, one_id())(), 400),
        ("GET /agents/summary", api(lambda: "/api/v1/agents/summary?limit=1000"),
         sql(listing.format("summary"), ORG), sql(listing.format("summary::text"), ORG), 40),
        ("GET /agents", api(lambda: "/api/v1/agents?limit=1000"),
         sql(listing.format("doc"), ORG), sql(listing.format("doc::text"), ORG), 20),
    ]
    rows = []
    for label, api_fn, sql_fn, sql_text_fn, n in cases:
        api_samples, sql_samples, text_samples = [], [], []
        for _ in range(5):  # interleave rounds so all three see the same machine state
            api_samples += timed(api_fn, n // 5, warmup=3)
            sql_samples += timed(sql_fn, n // 5, warmup=3)
            text_samples += timed(sql_text_fn, n // 5, warmup=3)
        a, s, t = summary(api_samples), summary(sql_samples), summary(text_samples)
        rows.append([label, a["p50"], a["p99"], s["p50"], s["p99"], t["p50"], t["p99"],
                     a["p50"] / s["p50"], a["p99"] / s["p99"], a["p50"] / t["p50"], a["n"]])
    raw.close()
    engine.dispose()

    summary_bytes = len(client.get("/api/v1/agents/summary?limit=1000", headers=headers).data)
    list_bytes = len(client.get("/api/v1/agents?limit=1000", headers=headers).data)
    one_bytes = len(client.get(f"/api/v1/agents/{ids[0]}", headers=headers).data)
    body = table(["read", "API p50 ms", "API p99 ms", "SQL p50 ms", "SQL p99 ms", "SQL text p50 ms",
                  "SQL text p99 ms", "API/SQL p50", "API/SQL p99", "API/SQL text p50", "n"], rows)
    body += "\n\n" + table(["response", "bytes", "bytes per agent"], [
        ["GET /agents/summary (1 000 agents)", summary_bytes, summary_bytes / AGENTS],
        ["GET /agents (1 000 agents)", list_bytes, list_bytes / AGENTS],
        ["GET /agents/{id}", one_bytes, one_bytes],
    ])
    notes = (f"Seeding 1 000 agents through POST /api/v1/agents (reference checks, skill snapshots, config "
             f"validation, prompt generation) took {seed_seconds:.1f} s ({seed_seconds / AGENTS * 1000:.1f} ms "
             "per agent). The API returns the stored JSONB as text without decoding it. \"SQL\" decodes the "
             "JSONB into Python objects (a typical direct reader); \"SQL text\" fetches the same column as "
             "text, like the API does, so API/SQL text is what the HTTP layer (auth, tenancy, routing, "
             f"response) adds. Load average (1 min) when measuring started: {load_before:.1f} on "
             f"{os.cpu_count()} cores (the machine is shared; compare ratios, not absolute times).")
    return write_result("agents", "Agent registry benchmark", body, notes)


if __name__ == "__main__":
    main()
