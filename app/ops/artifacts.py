"""The 15 platform artifacts every organization is provisioned with (version 1 of each), and the
registry that holds their current definitions (`platform.artifacts`).

An artifact document is `{kind, name, artifactVersion, definition}`:
- `database`: the product's schema, migrated to head (definition: `{}`);
- `storage`: the org's blob prefix `orgs/<org>/` inside the container (definition: `{prefix}`);
- `entity`: an entity definition (the body of POST /api/v1/entities/definitions) plus `views`;
- `skill`: a catalog skill (the body of POST /api/v1/skills);
- `agent`: an agent (the body of POST /api/v1/agents) whose `skills` name catalog skills by
  `skillName` (resolved to the org's skill ids when provisioned).
The order below is the provisioning order (skills before the agents that embed them).
"""

from __future__ import annotations

from typing import Any

KINDS = ("database", "storage", "entity", "skill", "agent")


def artifact_id(kind: str, name: str) -> str:
    return f"{kind}.{name}"


def _text(label: str, **extra) -> dict:
    return {"type": "string", "fieldType": "string", "label": label, **extra}


def _entity(name: str, display: str, module: str, properties: dict, required: list[str],
            columns: list[str], description: str) -> dict:
    return {"kind": "entity", "name": name, "artifactVersion": 1, "definition": {
        "name": name, "displayName": display, "module": module, "description": description,
        "schema": {"type": "object", "properties": properties, "required": required},
        "views": [{"name": f"All {display.lower()}", "type": "table", "columns": columns,
                   "isDefault": True}],
    }}


def _skill(name: str, title: str, category: str, slash: str, extension: str, *tools: str) -> dict:
    """A catalog skill; its tools are platform system tools (app.agents.services.tools.SYSTEM_TOOLS)."""
    definition = {"name": name, "title": title, "category": category, "slashCommand": slash,
                  "systemPromptExtension": extension, "enabled": True}
    if tools:
        definition["tools"] = [{"toolId": t, "toolName": t.split(".", 1)[1], "type": "search",
                                "enabled": True, "isSystem": True} for t in tools]
    return {"kind": "skill", "name": name, "artifactVersion": 1, "definition": definition}


def _agent(name: str, title: str, type_: str, prompt: str, skills: list[str], *, default: bool = False,
           description: str = "") -> dict:
    return {"kind": "agent", "name": name, "artifactVersion": 1, "definition": {
        "type": type_, "name": name, "title": title, "description": description, "status": "active",
        "provider": "provider-a", "model": "chat-large", "temperature": 0.3, "maxTokens": 2048,
        "systemPrompt": prompt, "isDefault": default, "isPublic": False, "scope": "org",
        "skills": [{"skillName": s, "enabled": True, "order": i} for i, s in enumerate(skills)],
    }}


BUILTIN: list[dict[str, Any]] = [
    # databases (1)
    {"kind": "database", "name": "product-schema", "artifactVersion": 1, "definition": {}},
    # storage (1)
    {"kind": "storage", "name": "org-files", "artifactVersion": 1, "definition": {"prefix": "orgs"}},
    # entities (5)
    _entity("contacts", "Contacts", "crm", {
        "email": {"type": "string", "fieldType": "email", "label": "Email"},
        "phone": {"type": "string", "fieldType": "phone", "label": "Phone"},
        "company": _text("Company"),
        "status": {"type": "string", "fieldType": "dropdown", "label": "Status",
                   "options": ["lead", "customer", "inactive"]},
    }, [], ["name", "email", "company", "status"], "People the organization works with."),
    _entity("companies", "Companies", "crm", {
        "domain": {"type": "string", "fieldType": "url", "label": "Website"},
        "industry": _text("Industry"),
        "employees": {"type": "integer", "fieldType": "int", "label": "Employees", "minimum": 0},
    }, [], ["name", "domain", "industry"], "Organizations the contacts belong to."),
    _entity("deals", "Deals", "crm", {
        "amount": {"type": "number", "fieldType": "currency", "label": "Amount", "minimum": 0},
        "stage": {"type": "string", "fieldType": "dropdown", "label": "Stage",
                  "options": ["new", "qualified", "proposal", "won", "lost"]},
        "close_date": {"type": "string", "fieldType": "date", "label": "Close date"},
    }, ["stage"], ["name", "stage", "amount", "close_date"], "Sales opportunities."),
    _entity("tasks", "Tasks", "work", {
        "due_date": {"type": "string", "fieldType": "date", "label": "Due"},
        "done": {"type": "boolean", "fieldType": "bool", "label": "Done"},
        "assignee": {"type": "string", "fieldType": "email", "label": "Assignee"},
    }, [], ["name", "due_date", "done", "assignee"], "Things to do."),
    _entity("notes", "Notes", "work", {
        "body": {"type": "string", "fieldType": "text", "label": "Body"},
        "pinned": {"type": "boolean", "fieldType": "bool", "label": "Pinned"},
    }, [], ["name", "pinned"], "Free-form notes."),
    # catalog skills (4)
    _skill("web-search", "Web search", "research", "/search",
           "When facts may be outdated, search the web and cite the sources you used.", "system.web_search"),
    _skill("summarize", "Summarize", "writing", "/summarize",
           "Summarize long material into short, faithful bullet points."),
    _skill("knowledge-base", "Knowledge base", "support", "/kb",
           "Answer from the organization's knowledge base first; say so when it has no answer.",
           "system.knowledge_search", "system.human_handoff"),
    _skill("email-drafting", "Email drafting", "writing", "/draft",
           "Draft clear, polite emails; never send without the user's confirmation."),
    # agents (4)
    _agent("assistant", "Assistant", "chat", "You are the organization's helpful general assistant.",
           ["summarize", "web-search"], default=True, description="General-purpose assistant (default agent)."),
    _agent("support", "Support agent", "chat", "You answer customer questions from the knowledge base.",
           ["knowledge-base"], description="Customer support from the knowledge base."),
    _agent("sales", "Sales assistant", "react", "You help the sales team follow up on deals and contacts.",
           ["email-drafting", "summarize"], description="Follow-ups on deals and contacts."),
    _agent("researcher", "Researcher", "react", "You research topics thoroughly and report with sources.",
           ["web-search", "summarize"], description="Multi-step research with sources."),
]
assert len(BUILTIN) == 15
