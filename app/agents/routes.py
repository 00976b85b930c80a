"""Agent registry routes: agents, catalog skills, tool definitions, sub-agents, widgets.

Thin MethodViews: marshmallow validates the body, a service does the work. Reads return the
stored JSON documents as they are (`_json`), so the response schemas here document the shapes
without re-serialising 1 000 nested agents per request.
"""

from __future__ import annotations

import json

from flask.views import MethodView

from app.agents import schemas as s
from app.agents.services import agents, documents, skills, subagents, tools, widgets
from app.agents.services.common import dumps
from app.db import db
from app.extensions import Blueprint, SuccessSchema, path_param
from app.preconditions import if_match, tagged, with_etag
from app.tenancy import current_tenant
from app.wire import json_text

# Path variables keep the product contract's names (agentId, toolDefId, …), so the documented paths are
# the ones clients already call.

READ, WRITE = "read:agents", "write:agents"

agents_blp = Blueprint("agents", __name__, url_prefix="/api/v1/agents", tag="Agents",
                       description="Agent registry: agents")
skills_blp = Blueprint("skills", __name__, url_prefix="/api/v1/skills", tag="Skills",
                       description="Agent registry: catalog skills")
tools_blp = Blueprint("tool-definitions", __name__, url_prefix="/api/v1/tool-definitions", tag="Tool definitions",
                      description="Agent registry: tool definitions")
subagents_blp = Blueprint("subagents", __name__, url_prefix="/api/v1/subagents", tag="Sub-agents",
                          description="Agent registry: sub-agents")
widgets_blp = Blueprint("widgets", __name__, url_prefix="/api/v1", tag="Widgets",
                        description="Agent registry: widgets")
AGENT_ID = path_param("agentId", "An agent's `id`, from the answer of POST /api/v1/agents or a list.")
SKILL_ID = path_param("skillId", "A catalog skill's `id`, from the answer of POST /api/v1/skills or the list.")
TOOL_ID = path_param("toolDefId", "A tool definition's `id`, from POST /api/v1/tool-definitions or the list.")
SUB_AGENT_ID = path_param("subAgentId", "A sub-agent's `id`, from POST /api/v1/subagents or the list.")
WIDGET_ID = path_param("widgetId", "A widget's `id`, from POST /api/v1/agents/{agentId}/widgets or the list.")

blueprints = [agents_blp, skills_blp, tools_blp, subagents_blp, widgets_blp]


_json = json_text  # agent documents are JSON text in the database: the measured fast path (app.wire)


def _tagged(body: str):
    """A single document's read: its ETag (the md5 of these bytes), 304 for a current If-None-Match."""
    return tagged(_json(body), documents.etag_of_text(body))


def _written(body: str, store, tenant, object_id: str | None = None):
    """A write's answer with the document's new ETag (computed by PostgreSQL: the tag the next GET answers).
    `object_id` None: read from the answer (a skill is addressed by a name the write may change)."""
    if object_id is None:
        (doc,) = json.loads(body).values()
        object_id = doc["id"]
    return with_etag(_json(body), store.etag_of(db.session, tenant.org_id, object_id))


# --------------------------------------------------------------------------- agents


@agents_blp.route("")
class Agents(MethodView):
    @agents_blp.arguments(s.AgentFilterQuerySchema, location="query")
    @agents_blp.response(200, s.AgentListSchema)
    @agents_blp.requires(READ)
    def get(self, filters):
        """List agents

        A page of the organization's agents (`{agents, nextCursor}`): full documents, by name; optional
        filters `status`, `type`, `isDefault` apply to every page. Paging: `limit` items (default 100, at
        most 1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 400 VALIDATION_ERROR for a `limit` out of range, an unknown filter value, or a `cursor`
        that came from another list, other filters or another organization.

        Example: `GET /api/v1/agents?status=active&limit=20` → `{"agents": [{"id": "…", "name":
        "order-help", …}], "nextCursor": null}`"""
        return _json(agents.list_agents(**filters))

    @agents_blp.arguments(s.AgentInputSchema, example=s.AGENT_EXAMPLE)
    @agents_blp.response(201, s.AgentEnvelopeSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.idempotent
    def post(self, data):
        """Create an agent

        The body is a partial agent, bare or as `{agent}`; fields left out get their documented
        defaults, and the system prompt is generated from `goal` when none is given. Tools and skills
        are self-contained copies: a skill is snapshotted from the catalog when attached. `isDefault:
        true` makes it the organization's only default agent.

        Errors: 409 CONFLICT when the organization has an agent of that `name`; 400 VALIDATION_ERROR
        naming each invalid field (unknown `subAgentIds`, an invalid tool `inputSchema`, a skill
        attached twice, a document above its byte limit).

        Example: the request example creates the default agent `order-help` with one tool → 201
        `{"agent": {"id": "…", "name": "order-help", "status": "draft", "version": "1.0.0", …}}`"""
        return _json(agents.create_agent(db.session, current_tenant(), data), 201)


@agents_blp.route("/summary")
class AgentSummaries(MethodView):
    @agents_blp.arguments(s.AgentFilterQuerySchema, location="query")
    @agents_blp.response(200, s.AgentSummaryListSchema)
    @agents_blp.requires(READ)
    def get(self, filters):
        """List agent summaries

        A page of AgentSummary (`{agents, nextCursor}`): id, name, title, type, status, flags and the
        attached skills, without prompts and tools; the filters and paging of the agent list.

        Errors: 400 VALIDATION_ERROR as for the agent list.

        Example: `GET /api/v1/agents/summary?type=chat` → `{"agents": [{"id": "…", "name": "order-help",
        "title": "Order help", "type": "chat", "status": "draft", "isDefault": true, …}], "nextCursor": null}`"""
        return _json(agents.list_summaries(**filters))


@agents_blp.route("/default")
class DefaultAgent(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self):
        """Get the default agent

        The organization's default agent (`isDefault: true`; at most one).

        Errors: 404 NOT_FOUND when no agent is the default.

        Example: `GET /api/v1/agents/default` → `{"agent": {"id": "…", "name": "order-help", "isDefault":
        true, …}}`"""
        return _json(agents.get_default_agent())


@agents_blp.route("/by-name")
class AgentByName(MethodView):
    @agents_blp.arguments(s.ByNameQuerySchema, location="query")
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self, query):
        """Get an agent by name

        The agent with this machine name (`name`, unique in the organization).

        Errors: 404 NOT_FOUND when the organization has no agent of that name; 400 without `name`.

        Example: `GET /api/v1/agents/by-name?name=order-help` → `{"agent": {"id": "…", "name":
        "order-help", …}}`"""
        return _json(agents.get_agent_by_name(query["name"]))


@agents_blp.route("/import")
class AgentImport(MethodView):
    @agents_blp.arguments(s.ImportQuerySchema, location="query")
    @agents_blp.arguments(s.AgentInputSchema, example=s.AGENT_IMPORT_EXAMPLE)
    @agents_blp.response(201, s.AgentEnvelopeSchema, description="imported as a new agent")
    @agents_blp.alt_response(200, schema=s.AgentEnvelopeSchema, description="replaced the agent of that name")
    @agents_blp.requires(WRITE)
    @agents_blp.idempotent
    def post(self, query, data):
        """Import an agent

        Creates an agent from an exported one (the answer of GET /agents/{agentId}/export, as it is):
        ids and audit fields of the export are replaced. Works across organizations, since tools and
        skills are copies; only `subAgentIds` must exist in the importing organization.

        Errors: 409 CONFLICT when the name is taken, unless `overwrite=true` replaces that agent (200);
        400 VALIDATION_ERROR as for creating.

        Example: the request example imports `order-help-imported` → 201 `{"agent": {"id": "…", "name":
        "order-help-imported", …}}`"""
        body, created = agents.import_agent(db.session, current_tenant(), data, overwrite=query["overwrite"])
        return _json(body, 201 if created else 200)


@agents_blp.route("/<string:agentId>", parameters=[AGENT_ID])
class AgentById(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    @agents_blp.conditional
    def get(self, agentId):
        """Get an agent

        The full agent document.

        Errors: 404 NOT_FOUND for an unknown id (or an agent of another organization).

        Example: `GET /api/v1/agents/{agentId}` → `{"agent": {"id": "…", "name": "order-help", "tools":
        [{"toolId": "lookup-order", …}], …}}`"""
        body = agents.get_agent(agentId)
        return tagged(_json(body), agents.etag_of_text(body))

    @agents_blp.arguments(s.partial_of(s.AgentInputSchema), example=s.AGENT_UPDATE_EXAMPLE)
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.conditional
    def put(self, data, agentId):
        """Update an agent

        The top-level fields the body names replace the stored ones (a list such as `tools` is
        replaced whole; null clears an optional field); the others stay. The answer is the stored agent.

        Errors: 404 NOT_FOUND for an unknown id; 409 CONFLICT for a `name` another agent has; 400
        VALIDATION_ERROR naming each invalid field.

        Example: the request example activates the agent (draft → active) with a lower temperature →
        `{"agent": {"status": "active", "temperature": 0.2, …}}`"""
        tenant = current_tenant()
        body = agents.update_agent(db.session, tenant, agentId, data, if_match=if_match())
        return with_etag(_json(body), agents.etag_of(db.session, tenant.org_id, agentId))

    @agents_blp.response(200, SuccessSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.conditional
    def delete(self, agentId):
        """Delete an agent

        Removes the agent and its widgets.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `DELETE /api/v1/agents/{agentId}` → `{"success": true}`"""
        return agents.delete_agent(db.session, current_tenant(), agentId, if_match=if_match())


@agents_blp.route("/<string:agentId>/export", parameters=[AGENT_ID])
class AgentExport(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self, agentId):
        """Export an agent

        The full agent (`{agent}`), self-contained: POST it unchanged to /api/v1/agents/import, in this
        or another organization.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `GET /api/v1/agents/{agentId}/export` → `{"agent": {"name": "order-help", "tools": […],
        "skills": […], …}}`"""
        return _json(agents.export_agent(agentId))


# --------------------------------------------------------------------------- catalog skills


@skills_blp.route("")
class Skills(MethodView):
    @skills_blp.arguments(s.PageQuerySchema, location="query")
    @skills_blp.response(200, s.SkillListSchema)
    @skills_blp.requires(READ)
    def get(self, page):
        """List catalog skills

        A page of the organization's catalog skills (`{skills, nextCursor}`), by name. Paging: `limit`
        items (default 100, at most 1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 400 VALIDATION_ERROR for a `limit` out of range or a foreign `cursor`.

        Example: `GET /api/v1/skills?limit=50` → `{"skills": [{"id": "…", "name": "order-help", "category":
        "support", …}], "nextCursor": null}`"""
        return _json(skills.list_skills(**page))

    @skills_blp.arguments(s.SkillInputSchema, example=s.SKILL_EXAMPLE)
    @skills_blp.response(201, s.SkillEnvelopeSchema)
    @skills_blp.requires(WRITE)
    @skills_blp.idempotent
    def post(self, data):
        """Create a catalog skill

        A skill of the organization's catalog, bare or as `{skill}`: `name` (unique in the organization),
        `title`, `category`, an optional `slashCommand` such as `/order`, its `tools` and a
        `systemPromptExtension`. Agents attach a snapshot of it.

        Errors: 409 CONFLICT when the organization has a skill of that name; 400 VALIDATION_ERROR naming
        each invalid field (a `slashCommand` not like `/command`, an invalid tool `inputSchema`).

        Example: the request example creates `order-help` in category `support` → 201 `{"skill": {"id":
        "…", "name": "order-help", "persisted": true, …}}`"""
        return _json(skills.create_skill(db.session, current_tenant(), data), 201)


@skills_blp.route("/categories")
class SkillCategories(MethodView):
    @skills_blp.response(200, s.CATEGORIES_SCHEMA)
    @skills_blp.requires(READ)
    def get(self):
        """List skill categories

        The distinct categories of the organization's catalog skills, sorted, as a bare JSON array of
        strings (no wrapper object).

        Errors: none beyond authentication.

        Example: `GET /api/v1/skills/categories` → `["support"]`"""
        return _json(dumps(skills.categories()))


@skills_blp.route("/by-name")
class SkillByName(MethodView):
    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(READ)
    @skills_blp.conditional
    def get(self, query):
        """Get a catalog skill by name

        The catalog skill with this name (`{skill}`).

        Errors: 404 NOT_FOUND when the organization has no skill of that name; 400 without `name`.

        Example: `GET /api/v1/skills/by-name?name=order-help` → `{"skill": {"id": "…", "name": "order-help",
        …}}`"""
        return _tagged(skills.get_skill_by_name(query["name"]))

    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.arguments(s.partial_of(s.SkillInputSchema), example=s.SKILL_UPDATE_EXAMPLE)
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(WRITE)
    @skills_blp.conditional
    def put(self, query, data):
        """Update a catalog skill by name

        The fields the body names replace the stored ones. Agents that attached the skill keep their
        snapshot; re-attach it to take the change.

        Errors: 404 NOT_FOUND when the organization has no skill of that name; 409 CONFLICT for a new
        `name` another skill has; 400 VALIDATION_ERROR naming each invalid field.

        Example: `PUT /api/v1/skills/by-name?name=order-help` with the request example →
        `{"skill": {"title": "Order and refund help", …}}`"""
        tenant = current_tenant()
        body = skills.update_skill(db.session, tenant, query["name"], data, if_match=if_match())
        return _written(body, skills.store, tenant)

    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.response(200, SuccessSchema)
    @skills_blp.requires(WRITE)
    @skills_blp.conditional
    def delete(self, query):
        """Delete a catalog skill by name

        Removes the skill from the catalog; agents that attached it keep their snapshot.

        Errors: 404 NOT_FOUND when the organization has no skill of that name.

        Example: `DELETE /api/v1/skills/by-name?name=order-help` → `{"success": true}`"""
        return skills.delete_skill(db.session, current_tenant(), query["name"], if_match=if_match())


@skills_blp.route("/<string:skillId>", parameters=[SKILL_ID])
class SkillById(MethodView):
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(READ)
    @skills_blp.conditional
    def get(self, skillId):
        """Get a catalog skill

        The catalog skill with this id.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `GET /api/v1/skills/{skillId}` → `{"skill": {"id": "…", "name": "order-help", …}}`"""
        return _tagged(skills.get_skill(skillId))


# --------------------------------------------------------------------------- tool definitions


@tools_blp.route("")
class ToolDefinitions(MethodView):
    @tools_blp.arguments(s.PageQuerySchema, location="query")
    @tools_blp.response(200, s.ToolDefinitionListSchema)
    @tools_blp.requires(READ)
    def get(self, page):
        """List tool definitions

        A page of the organization's tool definitions (`{toolDefinitions, nextCursor}`), by name. Paging:
        `limit` items (default 100, at most 1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 400 VALIDATION_ERROR for a `limit` out of range or a foreign `cursor`.

        Example: `GET /api/v1/tool-definitions` → `{"toolDefinitions": [{"id": "…", "name": "lookup_order",
        …}], "nextCursor": null}`"""
        return _json(tools.list_tool_definitions(**page))

    @tools_blp.arguments(s.ToolDefinitionBodySchema, example=s.TOOL_DEFINITION_EXAMPLE)
    @tools_blp.response(201, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(WRITE)
    @tools_blp.idempotent
    def post(self, body):
        """Create a tool definition

        A tool template of the organization, from `{toolDefinition}`: the function `name` the model
        calls, its `inputSchema` (a JSON Schema of type object), an optional `outputSchema`, and a
        `configSchema` with a `defaultConfig` that must validate against it. Agents use customised
        copies of it.

        Errors: 400 VALIDATION_ERROR naming each invalid field (an `inputSchema` not of type object, a
        JSON Schema that is not valid, a `defaultConfig` its `configSchema` refuses).

        Example: the request example creates `lookup_order` → 201 `{"toolDefinition": {"id": "…", "name":
        "lookup_order", "version": "1.0.0", …}}`"""
        return _json(tools.create_tool_definition(db.session, current_tenant(), body["toolDefinition"]), 201)


@tools_blp.route("/by-ids")
class ToolDefinitionsByIds(MethodView):
    @tools_blp.arguments(s.ByIdsSchema, example=s.BY_IDS_EXAMPLE)
    @tools_blp.response(200, s.ToolDefinitionsByIdsSchema)
    @tools_blp.requires(READ)
    def post(self, body):
        """Get tool definitions by ids

        The tool definitions with these ids, in the order asked; unknown ids are left out (no error).

        Errors: 413 PAYLOAD_TOO_LARGE when they would not fit in one response (ask for fewer ids); 400
        VALIDATION_ERROR for an empty or too long list.

        Example: the request example asks for two ids nobody has → `{"toolDefinitions": []}`; with the
        id of `lookup_order` among them → that one."""
        return _json(tools.tool_definitions_by_ids(body["ids"]))


@tools_blp.route("/<string:toolDefId>", parameters=[TOOL_ID])
class ToolDefinitionById(MethodView):
    @tools_blp.response(200, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(READ)
    @tools_blp.conditional
    def get(self, toolDefId):
        """Get a tool definition

        The tool definition with this id.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `GET /api/v1/tool-definitions/{toolDefId}` → `{"toolDefinition": {"id": "…", "name":
        "lookup_order", …}}`"""
        return _tagged(tools.get_tool_definition(toolDefId))

    @tools_blp.arguments(s.ToolDefinitionPatchBodySchema, example=s.TOOL_DEFINITION_UPDATE_EXAMPLE)
    @tools_blp.response(200, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(WRITE)
    @tools_blp.conditional
    def put(self, body, toolDefId):
        """Update a tool definition

        From `{toolDefinition}`: the fields it names replace the stored ones. Agents keep their copies.

        Errors: 404 NOT_FOUND for an unknown id; 400 VALIDATION_ERROR as for creating.

        Example: the request example changes the description → `{"toolDefinition": {"description":
        "Find an order by its number or tracking code", …}}`"""
        tenant = current_tenant()
        written = tools.update_tool_definition(db.session, tenant, toolDefId, body["toolDefinition"],
                                               if_match=if_match())
        return _written(written, tools.store, tenant, toolDefId)

    @tools_blp.response(200, SuccessSchema)
    @tools_blp.requires(WRITE)
    @tools_blp.conditional
    def delete(self, toolDefId):
        """Delete a tool definition

        Removes the tool definition; agents keep their customised copies of it.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `DELETE /api/v1/tool-definitions/{toolDefId}` → `{"success": true}`"""
        return tools.delete_tool_definition(db.session, current_tenant(), toolDefId, if_match=if_match())


# --------------------------------------------------------------------------- sub-agents


@subagents_blp.route("")
class SubAgents(MethodView):
    @subagents_blp.arguments(s.PageQuerySchema, location="query")
    @subagents_blp.response(200, s.SubAgentListSchema)
    @subagents_blp.requires(READ)
    def get(self, page):
        """List sub-agents

        A page of the organization's sub-agents (`{subAgents, nextCursor}`), by name. Paging: `limit`
        items (default 100, at most 1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 400 VALIDATION_ERROR for a `limit` out of range or a foreign `cursor`.

        Example: `GET /api/v1/subagents` → `{"subAgents": [{"id": "…", "name": "researcher", …}],
        "nextCursor": null}`"""
        return _json(subagents.list_sub_agents(**page))

    @subagents_blp.arguments(s.SubAgentBodySchema, example=s.SUB_AGENT_EXAMPLE)
    @subagents_blp.response(201, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(WRITE)
    @subagents_blp.idempotent
    def post(self, body):
        """Create a sub-agent

        From `{subAgent}`: an agent another agent can delegate to (listed in its `subAgentIds`). Only
        `name` is required; a missing `provider` or `model` means the delegating agent's.

        Errors: 409 CONFLICT when the organization has a sub-agent of that name; 400 VALIDATION_ERROR
        naming each invalid field.

        Example: the request example creates `researcher` → 201 `{"subAgent": {"id": "…", "name":
        "researcher", "status": "active", …}}`"""
        return _json(subagents.create_sub_agent(db.session, current_tenant(), body["subAgent"]), 201)


@subagents_blp.route("/<string:subAgentId>", parameters=[SUB_AGENT_ID])
class SubAgentById(MethodView):
    @subagents_blp.response(200, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(READ)
    @subagents_blp.conditional
    def get(self, subAgentId):
        """Get a sub-agent

        The sub-agent with this id.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `GET /api/v1/subagents/{subAgentId}` → `{"subAgent": {"id": "…", "name": "researcher", …}}`"""
        return _tagged(subagents.get_sub_agent(subAgentId))

    @subagents_blp.arguments(s.SubAgentPatchBodySchema, example=s.SUB_AGENT_UPDATE_EXAMPLE)
    @subagents_blp.response(200, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(WRITE)
    @subagents_blp.conditional
    def put(self, body, subAgentId):
        """Update a sub-agent

        From `{subAgent}`: the fields it names replace the stored ones.

        Errors: 404 NOT_FOUND for an unknown id; 409 CONFLICT for a `name` another sub-agent has; 400
        VALIDATION_ERROR naming each invalid field.

        Example: the request example lowers the temperature → `{"subAgent": {"temperature": 0.2, …}}`"""
        tenant = current_tenant()
        written = subagents.update_sub_agent(db.session, tenant, subAgentId, body["subAgent"], if_match=if_match())
        return _written(written, subagents.store, tenant, subAgentId)

    @subagents_blp.arguments(s.ForceQuerySchema, location="query")
    @subagents_blp.response(200, SuccessSchema)
    @subagents_blp.requires(WRITE)
    @subagents_blp.conditional
    def delete(self, query, subAgentId):
        """Delete a sub-agent

        Removes the sub-agent. While agents list it in `subAgentIds` it is kept and the answer names
        them, unless `force=true`, which also removes it from those agents.

        Errors: 404 NOT_FOUND for an unknown id; 409 CONFLICT listing the agents that reference it.

        Example: `DELETE /api/v1/subagents/{subAgentId}?force=true` → `{"success": true}`"""
        return subagents.delete_sub_agent(db.session, current_tenant(), subAgentId, force=query["force"],
                                          if_match=if_match())


# --------------------------------------------------------------------------- widgets


@widgets_blp.route("/agents/<string:agentId>/widgets", parameters=[AGENT_ID])
class AgentWidgets(MethodView):
    @widgets_blp.arguments(s.PageQuerySchema, location="query")
    @widgets_blp.response(200, s.WidgetListSchema)
    @widgets_blp.requires(READ)
    def get(self, page, agentId):
        """List an agent's widgets

        A page of the agent's widgets (`{widgets, nextCursor}`), by name. Paging: `limit` items (default
        100, at most 1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 404 NOT_FOUND for an unknown agent; 400 VALIDATION_ERROR for a `limit` out of range or a
        foreign `cursor`.

        Example: `GET /api/v1/agents/{agentId}/widgets` → `{"widgets": [{"id": "…", "name": "website",
        …}], "nextCursor": null}`"""
        return _json(widgets.list_widgets(agentId, **page))

    @widgets_blp.arguments(s.WidgetBodySchema, example=s.WIDGET_EXAMPLE)
    @widgets_blp.response(201, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(WRITE)
    @widgets_blp.idempotent
    def post(self, body, agentId):
        """Create a widget

        A chat widget for the agent, from `{widget}`: its `name`, `greeting`, the `allowedOrigins` that
        may embed it, `theme`, `position`, launcher and CSAT settings.

        Errors: 404 NOT_FOUND for an unknown agent; 400 VALIDATION_ERROR naming each invalid field (an
        origin that is not `https://host[:port]`, a colour that is not `#rgb`/`#rrggbb`).

        Example: the request example creates the `website` widget for shop.example.com → 201
        `{"widget": {"id": "…", "agentId": "…", "name": "website", "isDefault": false, …}}`"""
        return _json(widgets.create_widget(db.session, current_tenant(), agentId, body["widget"]), 201)


@widgets_blp.route("/agents/<string:agentId>/widgets/default", parameters=[AGENT_ID])
class AgentDefaultWidget(MethodView):
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(READ)
    @widgets_blp.conditional
    def get(self, agentId):
        """Get an agent's default widget

        The agent's default widget (made so by POST /widgets/{widgetId}/default).

        Errors: 404 NOT_FOUND for an unknown agent, or when the agent has no default widget.

        Example: `GET /api/v1/agents/{agentId}/widgets/default` → `{"widget": {"name": "website",
        "isDefault": true, …}}`"""
        return _tagged(widgets.get_default_widget(agentId))


@widgets_blp.route("/widgets/<string:widgetId>", parameters=[WIDGET_ID])
class WidgetById(MethodView):
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(READ)
    @widgets_blp.conditional
    def get(self, widgetId):
        """Get a widget

        The widget with this id.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `GET /api/v1/widgets/{widgetId}` → `{"widget": {"id": "…", "name": "website", …}}`"""
        return _tagged(widgets.get_widget(widgetId))

    @widgets_blp.arguments(s.WidgetPatchBodySchema, example=s.WIDGET_UPDATE_EXAMPLE)
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(WRITE)
    @widgets_blp.conditional
    def put(self, body, widgetId):
        """Update a widget

        From `{widget}`: the fields it names replace the stored ones.

        Errors: 404 NOT_FOUND for an unknown id; 400 VALIDATION_ERROR naming each invalid field.

        Example: the request example changes the greeting → `{"widget": {"greeting": "Hello! Ask me about
        your order.", …}}`"""
        tenant = current_tenant()
        written = widgets.update_widget(db.session, tenant, widgetId, body["widget"], if_match=if_match())
        return _written(written, widgets.store, tenant, widgetId)

    @widgets_blp.response(200, SuccessSchema)
    @widgets_blp.requires(WRITE)
    @widgets_blp.conditional
    def delete(self, widgetId):
        """Delete a widget

        Removes the widget.

        Errors: 404 NOT_FOUND for an unknown id.

        Example: `DELETE /api/v1/widgets/{widgetId}` → `{"success": true}`"""
        return widgets.delete_widget(db.session, current_tenant(), widgetId, if_match=if_match())


@widgets_blp.route("/widgets/<string:widgetId>/default", parameters=[WIDGET_ID])
class WidgetDefault(MethodView):
    @widgets_blp.arguments(s.SetDefaultWidgetSchema, example=s.SET_DEFAULT_WIDGET_EXAMPLE)
    @widgets_blp.response(200, SuccessSchema)
    @widgets_blp.requires(WRITE)
    def post(self, body, widgetId):
        """Make a widget the default

        Makes this widget its agent's only default widget. `agentId` must be the widget's agent.

        Errors: 404 NOT_FOUND for an unknown widget; 400 VALIDATION_ERROR when `agentId` is not the
        widget's agent.

        Example: the request example, with the `id` of the widget's agent as `agentId` →
        `{"success": true}`"""
        return widgets.make_default_widget(db.session, current_tenant(), widgetId, body["agentId"])
