"""Agent registry routes: agents, catalog skills, tool definitions, sub-agents, widgets.

Thin MethodViews: marshmallow validates the body, a service does the work. Reads return the
stored JSON documents as they are (`_json`), so the response schemas here document the shapes
without re-serialising 1 000 nested agents per request.
"""

from __future__ import annotations

from flask.views import MethodView

from app.agents import schemas as s
from app.agents.services import agents, skills, subagents, tools, widgets
from app.agents.services.common import dumps
from app.db import db
from app.extensions import Blueprint, SuccessSchema
from app.preconditions import if_match, tagged, with_etag
from app.tenancy import current_tenant
from app.wire import json_text

# Path variables keep the spec's names (agentId, toolDefId, …) so the OpenAPI paths match it.

READ, WRITE = "read:agents", "write:agents"

agents_blp = Blueprint("agents", __name__, url_prefix="/api/v1/agents", description="Agent registry: agents")
skills_blp = Blueprint("skills", __name__, url_prefix="/api/v1/skills", description="Agent registry: catalog skills")
tools_blp = Blueprint("tool-definitions", __name__, url_prefix="/api/v1/tool-definitions",
                      description="Agent registry: tool definitions")
subagents_blp = Blueprint("subagents", __name__, url_prefix="/api/v1/subagents",
                          description="Agent registry: sub-agents")
widgets_blp = Blueprint("widgets", __name__, url_prefix="/api/v1", description="Agent registry: widgets")
blueprints = [agents_blp, skills_blp, tools_blp, subagents_blp, widgets_blp]


_json = json_text  # agent documents are JSON text in the database: the measured fast path (app.wire)


# --------------------------------------------------------------------------- agents


@agents_blp.route("")
class Agents(MethodView):
    @agents_blp.arguments(s.AgentFilterQuerySchema, location="query")
    @agents_blp.response(200, s.AgentListSchema)
    @agents_blp.requires(READ)
    def get(self, filters):
        """A page of the agents of the caller's org (`{agents, nextCursor}`), by name; optional filters status,
        type, isDefault; `limit` and `cursor` page."""
        return _json(agents.list_agents(**filters))

    @agents_blp.arguments(s.AgentInputSchema)
    @agents_blp.response(201, s.AgentEnvelopeSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.idempotent
    def post(self, data):
        """Create an agent (bare Partial Agent or `{agent}`); missing fields get documented defaults."""
        return _json(agents.create_agent(db.session, current_tenant(), data), 201)


@agents_blp.route("/summary")
class AgentSummaries(MethodView):
    @agents_blp.arguments(s.AgentFilterQuerySchema, location="query")
    @agents_blp.response(200, s.AgentSummaryListSchema)
    @agents_blp.requires(READ)
    def get(self, filters):
        """A page of AgentSummary (`{agents, nextCursor}`), by name; same filters and paging as the list."""
        return _json(agents.list_summaries(**filters))


@agents_blp.route("/default")
class DefaultAgent(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self):
        """The org's default agent; 404 when none is set."""
        return _json(agents.get_default_agent())


@agents_blp.route("/by-name")
class AgentByName(MethodView):
    @agents_blp.arguments(s.ByNameQuerySchema, location="query")
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self, query):
        """The agent with this machine name."""
        return _json(agents.get_agent_by_name(query["name"]))


@agents_blp.route("/import")
class AgentImport(MethodView):
    @agents_blp.arguments(s.ImportQuerySchema, location="query")
    @agents_blp.arguments(s.AgentInputSchema)
    @agents_blp.response(201, s.AgentEnvelopeSchema, description="imported as a new agent")
    @agents_blp.alt_response(200, schema=s.AgentEnvelopeSchema, description="replaced the agent of that name")
    @agents_blp.requires(WRITE)
    @agents_blp.idempotent
    def post(self, query, data):
        """Import an exported Agent; a taken name is 409 unless `?overwrite=true` replaces that agent."""
        body, created = agents.import_agent(db.session, current_tenant(), data, overwrite=query["overwrite"])
        return _json(body, 201 if created else 200)


@agents_blp.route("/<string:agentId>")
class AgentById(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    @agents_blp.conditional
    def get(self, agentId):
        """One agent."""
        body = agents.get_agent(agentId)
        return tagged(_json(body), agents.etag_of_text(body))

    @agents_blp.arguments(s.partial_of(s.AgentInputSchema))
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.conditional
    def put(self, data, agentId):
        """Update an agent: named top-level fields replace the stored ones (null clears an optional one)."""
        tenant = current_tenant()
        body = agents.update_agent(db.session, tenant, agentId, data, if_match=if_match())
        return with_etag(_json(body), agents.etag_of(db.session, tenant.org_id, agentId))

    @agents_blp.response(200, SuccessSchema)
    @agents_blp.requires(WRITE)
    @agents_blp.conditional
    def delete(self, agentId):
        """Delete an agent and its widgets."""
        return agents.delete_agent(db.session, current_tenant(), agentId, if_match=if_match())


@agents_blp.route("/<string:agentId>/export")
class AgentExport(MethodView):
    @agents_blp.response(200, s.AgentEnvelopeSchema)
    @agents_blp.requires(READ)
    def get(self, agentId):
        """The full agent (`{agent}`); POST it unchanged to /agents/import."""
        return _json(agents.export_agent(agentId))


# --------------------------------------------------------------------------- catalog skills


@skills_blp.route("")
class Skills(MethodView):
    @skills_blp.arguments(s.PageQuerySchema, location="query")
    @skills_blp.response(200, s.SkillListSchema)
    @skills_blp.requires(READ)
    def get(self, page):
        """A page of the org's catalog skills (`{skills, nextCursor}`), by name."""
        return _json(skills.list_skills(**page))

    @skills_blp.arguments(s.SkillInputSchema)
    @skills_blp.response(201, s.SkillEnvelopeSchema)
    @skills_blp.requires(WRITE)
    @skills_blp.idempotent
    def post(self, data):
        """Create a catalog skill (bare or `{skill}`); the name is unique in the org."""
        return _json(skills.create_skill(db.session, current_tenant(), data), 201)


@skills_blp.route("/categories")
class SkillCategories(MethodView):
    @skills_blp.response(200, s.CATEGORIES_SCHEMA)
    @skills_blp.requires(READ)
    def get(self):
        """Distinct skill categories of the caller's catalog, sorted: a bare `string[]`, as the spec says."""
        return _json(dumps(skills.categories()))


@skills_blp.route("/by-name")
class SkillByName(MethodView):
    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(READ)
    def get(self, query):
        """The catalog skill with this name (`{skill}`); 404 when the org has none of that name."""
        return _json(skills.get_skill_by_name(query["name"]))

    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.arguments(s.partial_of(s.SkillInputSchema))
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(WRITE)
    def put(self, query, data):
        """Update the catalog skill with this name (agents keep their snapshots)."""
        return _json(skills.update_skill(db.session, current_tenant(), query["name"], data))

    @skills_blp.arguments(s.ByNameQuerySchema, location="query")
    @skills_blp.response(200, SuccessSchema)
    @skills_blp.requires(WRITE)
    def delete(self, query):
        """Delete the catalog skill with this name (agents keep their snapshots)."""
        return skills.delete_skill(db.session, current_tenant(), query["name"])


@skills_blp.route("/<string:skillId>")
class SkillById(MethodView):
    @skills_blp.response(200, s.SkillEnvelopeSchema)
    @skills_blp.requires(READ)
    def get(self, skillId):
        """One catalog skill."""
        return _json(skills.get_skill(skillId))


# --------------------------------------------------------------------------- tool definitions


@tools_blp.route("")
class ToolDefinitions(MethodView):
    @tools_blp.arguments(s.PageQuerySchema, location="query")
    @tools_blp.response(200, s.ToolDefinitionListSchema)
    @tools_blp.requires(READ)
    def get(self, page):
        """A page of the org's tool definitions (`{toolDefinitions, nextCursor}`), by name."""
        return _json(tools.list_tool_definitions(**page))

    @tools_blp.arguments(s.ToolDefinitionBodySchema)
    @tools_blp.response(201, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(WRITE)
    @tools_blp.idempotent
    def post(self, body):
        """Create a tool definition from `{toolDefinition}`."""
        return _json(tools.create_tool_definition(db.session, current_tenant(), body["toolDefinition"]), 201)


@tools_blp.route("/by-ids")
class ToolDefinitionsByIds(MethodView):
    @tools_blp.arguments(s.ByIdsSchema)
    @tools_blp.response(200, s.ToolDefinitionsByIdsSchema)
    @tools_blp.requires(READ)
    def post(self, body):
        """The tool definitions with these ids, in request order; unknown ids are absent. 413 when they would
        not fit in one response (ask for fewer ids)."""
        return _json(tools.tool_definitions_by_ids(body["ids"]))


@tools_blp.route("/<string:toolDefId>")
class ToolDefinitionById(MethodView):
    @tools_blp.response(200, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(READ)
    def get(self, toolDefId):
        """One tool definition."""
        return _json(tools.get_tool_definition(toolDefId))

    @tools_blp.arguments(s.ToolDefinitionPatchBodySchema)
    @tools_blp.response(200, s.ToolDefinitionEnvelopeSchema)
    @tools_blp.requires(WRITE)
    def put(self, body, toolDefId):
        """Update a tool definition from `{toolDefinition}` (named fields replace the stored ones)."""
        return _json(tools.update_tool_definition(db.session, current_tenant(), toolDefId, body["toolDefinition"]))

    @tools_blp.response(200, SuccessSchema)
    @tools_blp.requires(WRITE)
    def delete(self, toolDefId):
        """Delete a tool definition (agents keep their customised copies)."""
        return tools.delete_tool_definition(db.session, current_tenant(), toolDefId)


# --------------------------------------------------------------------------- sub-agents


@subagents_blp.route("")
class SubAgents(MethodView):
    @subagents_blp.arguments(s.PageQuerySchema, location="query")
    @subagents_blp.response(200, s.SubAgentListSchema)
    @subagents_blp.requires(READ)
    def get(self, page):
        """A page of the org's sub-agents (`{subAgents, nextCursor}`), by name."""
        return _json(subagents.list_sub_agents(**page))

    @subagents_blp.arguments(s.SubAgentBodySchema)
    @subagents_blp.response(201, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(WRITE)
    @subagents_blp.idempotent
    def post(self, body):
        """Create a sub-agent from `{subAgent}`."""
        return _json(subagents.create_sub_agent(db.session, current_tenant(), body["subAgent"]), 201)


@subagents_blp.route("/<string:subAgentId>")
class SubAgentById(MethodView):
    @subagents_blp.response(200, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(READ)
    def get(self, subAgentId):
        """One sub-agent."""
        return _json(subagents.get_sub_agent(subAgentId))

    @subagents_blp.arguments(s.SubAgentPatchBodySchema)
    @subagents_blp.response(200, s.SubAgentEnvelopeSchema)
    @subagents_blp.requires(WRITE)
    def put(self, body, subAgentId):
        """Update a sub-agent from `{subAgent}`."""
        return _json(subagents.update_sub_agent(db.session, current_tenant(), subAgentId, body["subAgent"]))

    @subagents_blp.arguments(s.ForceQuerySchema, location="query")
    @subagents_blp.response(200, SuccessSchema)
    @subagents_blp.requires(WRITE)
    def delete(self, query, subAgentId):
        """Delete a sub-agent; 409 while agents reference it, unless `?force=true` removes the references."""
        return subagents.delete_sub_agent(db.session, current_tenant(), subAgentId, force=query["force"])


# --------------------------------------------------------------------------- widgets


@widgets_blp.route("/agents/<string:agentId>/widgets")
class AgentWidgets(MethodView):
    @widgets_blp.arguments(s.PageQuerySchema, location="query")
    @widgets_blp.response(200, s.WidgetListSchema)
    @widgets_blp.requires(READ)
    def get(self, page, agentId):
        """A page of the agent's widgets (`{widgets, nextCursor}`), by name."""
        return _json(widgets.list_widgets(agentId, **page))

    @widgets_blp.arguments(s.WidgetBodySchema)
    @widgets_blp.response(201, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(WRITE)
    @widgets_blp.idempotent
    def post(self, body, agentId):
        """Create a widget for the agent from `{widget}`."""
        return _json(widgets.create_widget(db.session, current_tenant(), agentId, body["widget"]), 201)


@widgets_blp.route("/agents/<string:agentId>/widgets/default")
class AgentDefaultWidget(MethodView):
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(READ)
    def get(self, agentId):
        """The agent's default widget; 404 when it has none."""
        return _json(widgets.get_default_widget(agentId))


@widgets_blp.route("/widgets/<string:widgetId>")
class WidgetById(MethodView):
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(READ)
    def get(self, widgetId):
        """One widget."""
        return _json(widgets.get_widget(widgetId))

    @widgets_blp.arguments(s.WidgetPatchBodySchema)
    @widgets_blp.response(200, s.WidgetEnvelopeSchema)
    @widgets_blp.requires(WRITE)
    def put(self, body, widgetId):
        """Update a widget from `{widget}`."""
        return _json(widgets.update_widget(db.session, current_tenant(), widgetId, body["widget"]))

    @widgets_blp.response(200, SuccessSchema)
    @widgets_blp.requires(WRITE)
    def delete(self, widgetId):
        """Delete a widget."""
        return widgets.delete_widget(db.session, current_tenant(), widgetId)


@widgets_blp.route("/widgets/<string:widgetId>/default")
class WidgetDefault(MethodView):
    @widgets_blp.arguments(s.SetDefaultWidgetSchema)
    @widgets_blp.response(200, SuccessSchema)
    @widgets_blp.requires(WRITE)
    def post(self, body, widgetId):
        """Make this widget its agent's only default (`{agentId}` must be the widget's agent)."""
        return widgets.make_default_widget(db.session, current_tenant(), widgetId, body["agentId"])
