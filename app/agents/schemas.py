"""Wire shapes of the agent registry (camelCase field names, as clients send and read them).

Input schemas validate types, enums, ranges and nested required fields; cross-record rules
(references, uniqueness, transitions, the default invariants) live in the services. Update
routes load the same schemas with every top-level field optional (`partial_of`): a PUT replaces
the top-level fields it names, and a nested object it names is replaced whole.

Response schemas document the OpenAPI shapes; reads return the stored JSON documents directly.
"""

from __future__ import annotations

import functools

from flask import current_app
from marshmallow import INCLUDE, Schema, ValidationError, fields, pre_load, validate, validates, validates_schema

from app.fields import (
    SERVER_FIELDS,
    NulFree,
    QueryInt,
    StrictBool,
    StrictFloat,
    StrictInt,
    UtcTimestamp,
    check_config,
    check_json_schema,
    check_object_schema,
    check_open_object,
    free_json,
    json_schema,
    machine_name,
    schema_object,
    string_list,
    text,
)

AGENT_TYPES = ("chat", "react")
AGENT_SUB_TYPES = ("chat", "react", "workflow", "document")
AGENT_STATUSES = ("draft", "active", "inactive", "archived")
AGENT_SCOPES = ("org", "team", "user", "custom")
CSAT_QUESTION_TYPES = ("rating", "text", "yes_no", "choice")
SUB_AGENT_STATUSES = ("active", "inactive")
WIDGET_POSITIONS = ("bottom-right", "bottom-left", "top-right", "top-left")
THEME_MODES = ("light", "dark", "auto")
HEX_COLOUR = validate.Regexp(r"^#(?:[0-9A-Fa-f]{3}|[0-9A-Fa-f]{6}|[0-9A-Fa-f]{8})$",
                             error="Must be a hex colour such as #2563EB.")
# an https URL: a host name, optional port, optional path/query (one regex, so OpenAPI states the same rule)
HTTPS_URL = validate.Regexp(r"^https://[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                            r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
                            r"(?:[/?#][\x21-\x7e]*)?$", error="Must be an https URL.")
# an icon name (no "/"), or an https URL: one pattern, so the OpenAPI document states the rule exactly
LAUNCHER_ICON = validate.Regexp(r"^(?:[^/]*|" + HTTPS_URL.regex.pattern[1:-1] + r")$",
                                error="Must be an icon name or an https URL.")
ORIGIN = validate.Regexp(r"^(?:https?://(?:\*\.)?[A-Za-z0-9.-]+(?::\d{1,5})?|\*)$",
                         error="Must be an origin such as https://example.com (no path), or *.")
TEMPERATURE = validate.Range(min=0, max=2)
MAX_TOKENS = validate.Range(min=1, max=1_000_000)


@functools.cache
def _patch_class(schema_cls: type[Schema]) -> type[Schema]:
    # a named subclass, so the OpenAPI document gets a distinct `...Patch` component
    # cross-field rules (OPENAPI_EXTRA) apply to the merged document, not to a partial update body
    return type(schema_cls.__name__.removesuffix("Schema") + "PatchSchema", (schema_cls,), {"OPENAPI_EXTRA": None})


def partial_of(schema_cls: type[Schema]) -> Schema:
    """The schema with every top-level field optional; nested objects stay fully validated."""
    return _patch_class(schema_cls)(partial=tuple(schema_cls._declared_fields))


class _Input(NulFree):
    """Input: server-managed fields are dropped, anything else unknown is an error."""

    class Meta:
        unknown = "raise"

    @pre_load
    def _drop_server_fields(self, data, **_):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in SERVER_FIELDS}
        return data


def _unwrap(key: str):
    """pre_load hook: accept `{key: {...}}` as well as the bare object."""

    def hook(self, data, **_):
        if isinstance(data, dict) and set(data) == {key} and isinstance(data[key], dict):
            data = data[key]
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in SERVER_FIELDS}
        return data

    return pre_load(hook)


class _Audited(Schema):
    """Server-filled fields of a stored registry document (output only)."""

    id = fields.String(dump_only=True)
    createdAt = fields.String(dump_only=True)
    updatedAt = fields.String(dump_only=True)
    createdBy = fields.String(dump_only=True)
    updatedBy = fields.String(dump_only=True)


class OmittedSchema(Schema):
    """A stored document too large to serve in a list (stored before the size limits existed)."""

    id = fields.String(required=True)
    name = fields.String(required=True)
    bytes = fields.Integer(required=True, metadata={"description": "its size as JSON"})


def _page_fields() -> dict:
    """What every registry list carries beside its items (app.agents.services.paging)."""
    return {
        "nextCursor": fields.String(required=True, allow_none=True, metadata={
            "description": "send as `cursor` for the next page; null on the last page"}),
        "omitted": fields.List(fields.Nested(OmittedSchema), metadata={
            "description": "only when this page skipped documents too large to be served in a list (stored "
                           "before the size limits); delete them or shrink them with a PUT"}),
    }


def _envelopes(key: str, many_key: str, output: type[Schema]) -> tuple[type[Schema], type[Schema]]:
    """`{key: output}` and `{many_key: [output], nextCursor, omitted?}` response schemas."""
    name = output.__name__.removesuffix("Schema")
    return (Schema.from_dict({key: fields.Nested(output, required=True)}, name=f"{name}EnvelopeSchema"),
            Schema.from_dict({many_key: fields.List(fields.Nested(output), required=True), **_page_fields()},
                             name=f"{name}ListSchema"))


def _bodies(key: str, input_fields: type[Schema]) -> tuple[type[Schema], type[Schema]]:
    """`{key: input}` request schemas for create (full) and update (top-level fields optional)."""
    name = input_fields.__name__.removesuffix("Fields")
    return (NulFree.from_dict({key: fields.Nested(input_fields, required=True)}, name=f"{name}BodySchema"),
            NulFree.from_dict({key: fields.Nested(partial_of(input_fields), required=True)},
                              name=f"{name}PatchBodySchema"))


# --------------------------------------------------------------------------- tools


# what `check_object_schema` enforces beyond JSON Schema validity: empty, or a schema of type object
OBJECT_SCHEMA_RULE = {"anyOf": [{"maxProperties": 0},
                                {"required": ["type"], "properties": {"type": {"type": "string", "enum": ["object"]}}}],
                      "description": "A JSON Schema of type object (the arguments), or {}"}


class AgentToolSchema(Schema):
    """AgentTool: a self-contained (usually customised) copy of a tool definition, embedded in an agent."""

    toolId = text(64, min_length=1, required=True,
                  metadata={"description": "any id: the tool definition it was copied from, or a custom tool's id"})
    toolName = text(128, min_length=1, required=True)
    title = text(200, allow_none=True)
    description = text(4000, allow_none=True)
    type = text(40, allow_none=True, metadata={"description": "e.g. document, search, api, extraction"})
    inputSchema = schema_object(validate=check_object_schema, allow_none=True, metadata=OBJECT_SCHEMA_RULE)
    outputSchema = json_schema(allow_none=True)
    configSchema = json_schema(allow_none=True)
    config = free_json(allow_none=True)
    mergeConfig = free_json(allow_none=True, metadata={"description": "MergeConfig (free-form object)"})
    enabled = StrictBool(required=True)
    isSystem = StrictBool(allow_none=True)
    order = StrictInt(validate=validate.Range(min=0), allow_none=True)

    @validates_schema
    def _config_matches_schema(self, data, **_):
        check_config(data, schema_key="configSchema", config_key="config")


class AgentSkillToolSchema(Schema):
    toolId = text(64, min_length=1, required=True)
    toolName = text(128, min_length=1, required=True)
    title = text(200, allow_none=True)
    description = text(4000, allow_none=True)
    type = text(40, allow_none=True)
    inputSchema = json_schema(allow_none=True)
    configSchema = json_schema(allow_none=True)
    config = free_json(allow_none=True)
    enabled = StrictBool(required=True)


class AgentSkillSchema(Schema):
    """AgentSkill: a snapshot of a catalog skill, which the caller may customise. A skillId new to the
    agent that names a catalog skill starts from a copy of it; the fields sent override the copy."""

    skillId = text(64, min_length=1, required=True,
                   metadata={"description": "a catalog skill's id (copied on attach), or any id for a "
                                            "custom or imported skill; unique within the agent"})
    skillName = text(128, allow_none=True)
    title = text(200, allow_none=True)
    description = text(4000, allow_none=True)
    category = text(100, allow_none=True)
    slashCommand = text(64, allow_none=True)
    iconName = text(100, allow_none=True)
    systemPromptExtension = text(20000, allow_none=True)
    tools = fields.List(fields.Nested(AgentSkillToolSchema), validate=validate.Length(max=100), allow_none=True,
                        metadata={"description": "the skill's tools; each is merged over the copied tool "
                                                 "with the same toolId"})
    enabled = StrictBool(required=True)
    order = StrictInt(required=True, validate=validate.Range(min=0))


# --------------------------------------------------------------------------- CSAT / handoff / react


class CSATQuestionSchema(Schema):
    OPENAPI_EXTRA = {"anyOf": [  # a choice question needs at least two options
        {"not": {"required": ["type"]}},
        {"properties": {"type": {"enum": ["rating", "text", "yes_no"]}}},
        {"required": ["options"], "properties": {"options": {"type": "array", "minItems": 2}}}]}

    id = text(64, allow_none=True)
    question = text(500, min_length=1, required=True)
    type = fields.String(load_default="rating", validate=validate.OneOf(CSAT_QUESTION_TYPES))
    options = string_list(20, 200, allow_none=True)
    scale = StrictInt(validate=validate.Range(min=2, max=10), allow_none=True)
    required = StrictBool(load_default=True)

    @validates_schema
    def _choice_has_options(self, data, **_):
        if data.get("type") == "choice" and len(data.get("options") or []) < 2:
            raise ValidationError("A choice question needs at least two options.", field_name="options")


class CSATSurveySchema(Schema):
    questions = fields.List(fields.Nested(CSATQuestionSchema), required=True,
                            validate=validate.Length(min=1, max=20))
    timeThreshold = StrictFloat(required=True, validate=validate.Range(min=0),
                                metadata={"description": "seconds of inactivity before the survey is shown"})
    closeOnResponse = StrictBool(required=True)


class CSATConfigSchema(Schema):
    OPENAPI_EXTRA = {"anyOf": [  # enabled needs a survey
        {"properties": {"enabled": {"enum": [False]}}},
        {"required": ["survey"], "properties": {"survey": {"type": "object"}}}]}

    enabled = StrictBool(required=True)
    survey = fields.Nested(CSATSurveySchema, allow_none=True)

    @validates_schema
    def _enabled_needs_survey(self, data, **_):
        if data.get("enabled") and not data.get("survey"):
            raise ValidationError("A survey is required when CSAT is enabled.", field_name="survey")


class HandoffConfigSchema(Schema):
    enabled = StrictBool(required=True)
    triggerKeywords = string_list(100, 200, required=True)
    queueId = text(200, allow_none=True)
    handoffMessage = text(2000, required=True)


class ReactAgentConfigSchema(Schema):
    """ReactAgentConfig; further (not shown) fields are kept as sent."""

    OPENAPI_EXTRA = {"description": "ReactAgentConfig; further fields are kept as sent. The whole object is at "
                                    "most JSON_FIELD_MAX_BYTES (64 KiB by default) as compact JSON."}

    class Meta:
        unknown = INCLUDE

    provider = text(100, min_length=1, allow_none=True)
    model = text(200, min_length=1, allow_none=True)
    temperature = StrictFloat(validate=TEMPERATURE, allow_none=True)
    maxTokens = StrictInt(validate=MAX_TOKENS, allow_none=True)
    maxIterations = StrictInt(validate=validate.Range(min=1, max=100), allow_none=True)
    reasoningPrompt = text(20000, allow_none=True)

    @pre_load
    def _bounded(self, data, **_):
        if isinstance(data, dict):  # the fields kept as sent are free-form: the whole object is bounded
            check_open_object(data)
        return data


# --------------------------------------------------------------------------- agent


class AgentInputSchema(_Input):
    """Partial Agent (create, update, import). Server-managed fields are ignored."""

    _unwrap_agent = _unwrap("agent")
    OPENAPI_EXTRA = {"anyOf": [  # scope team or custom needs a scopeId
        {"not": {"required": ["scope"]}},
        {"properties": {"scope": {"enum": ["org", "user"]}}},
        {"required": ["scopeId"], "properties": {"scopeId": {"type": "string", "minLength": 1}}}]}

    type = fields.String(required=True, validate=validate.OneOf(AGENT_TYPES))
    subType = fields.String(validate=validate.OneOf(AGENT_SUB_TYPES),
                            metadata={"description": "defaults to `type`"})
    name = machine_name(required=True)
    title = text(200, min_length=1, required=True)
    description = text(4000, allow_none=True)
    status = fields.String(load_default="draft", validate=validate.OneOf(AGENT_STATUSES))
    version = text(64, min_length=1, load_default="1.0.0")
    provider = text(100, min_length=1, required=True)
    model = text(200, min_length=1, required=True)
    temperature = StrictFloat(load_default=0.7, validate=TEMPERATURE)
    maxTokens = StrictInt(load_default=2048, validate=MAX_TOKENS)
    systemPrompt = text(100_000, load_default="",
                        metadata={"description": "generated from `goal` when empty"})
    goal = text(4000, allow_none=True)
    tags = string_list(50, 64, allow_none=True)
    isDefault = StrictBool(load_default=False)
    isPublic = StrictBool(load_default=False)
    tools = fields.List(fields.Nested(AgentToolSchema), validate=validate.Length(max=100), allow_none=True)
    subAgentIds = fields.List(fields.String(validate=validate.Length(min=1, max=64)),
                              validate=validate.Length(max=50), allow_none=True,
                              metadata={"uniqueItems": True, "description": "ids of sub-agents of the org"})
    skills = fields.List(fields.Nested(AgentSkillSchema), validate=validate.Length(max=100), allow_none=True,
                         metadata={"description": "each skillId at most once"})
    csatConfig = fields.Nested(CSATConfigSchema, load_default=lambda: {"enabled": False})
    handoffConfig = fields.Nested(HandoffConfigSchema, load_default=lambda: {
        "enabled": False, "triggerKeywords": [], "handoffMessage": ""})
    widgetConfig = free_json(allow_none=True, metadata={"description": "WidgetConfig (free-form object)"})
    reactConfig = fields.Nested(ReactAgentConfigSchema, allow_none=True)
    userSuggestedActionsConfig = free_json(allow_none=True)
    contextConfig = free_json(allow_none=True)
    configSchema = schema_object(load_default=dict, validate=check_json_schema)
    config = free_json(allow_none=True, metadata={"description": "validated against configSchema"})
    iconName = text(100, allow_none=True)
    capabilities = string_list(50, 200, allow_none=True)
    samplePrompts = string_list(20, 1000, allow_none=True)
    responseStyle = text(200, allow_none=True)
    personalityTraits = string_list(20, 100, allow_none=True)
    fallbackMessage = text(2000, allow_none=True)
    responseDelay = StrictFloat(validate=validate.Range(min=0, max=60_000), allow_none=True,
                                metadata={"description": "milliseconds"})
    maxConcurrency = StrictInt(validate=validate.Range(min=1, max=10_000), allow_none=True)
    sessionTimeout = StrictFloat(validate=validate.Range(min=0), allow_none=True,
                                 metadata={"description": "seconds"})
    sourceTemplateId = text(64, allow_none=True)
    sourceTemplateVersion = text(64, allow_none=True)
    scope = fields.String(load_default="org", validate=validate.OneOf(AGENT_SCOPES))
    scopeId = text(128, allow_none=True)
    isFavorite = StrictBool(load_default=False)
    lastUsedAt = UtcTimestamp(allow_none=True)
    usageCount = StrictInt(load_default=0, validate=validate.Range(min=0))
    artifactVersion = StrictInt(validate=validate.Range(min=0), allow_none=True)
    metadata = free_json(allow_none=True)

    @validates_schema
    def _config_matches_schema(self, data, **_):
        check_config(data, schema_key="configSchema", config_key="config")


class AgentSchema(AgentInputSchema, _Audited):
    """Agent as returned (documentation of the stored document)."""

    orgId = fields.String(dump_only=True)
    product = fields.String(dump_only=True)


AgentEnvelopeSchema, AgentListSchema = _envelopes("agent", "agents", AgentSchema)


class AgentSkillSummarySchema(Schema):
    skillId = fields.String(required=True)
    skillName = fields.String()
    title = fields.String()
    category = fields.String()
    slashCommand = fields.String()
    iconName = fields.String()
    enabled = fields.Boolean(required=True)
    order = fields.Integer(required=True)


class AgentSummarySchema(Schema):
    id = fields.String(required=True)
    name = fields.String(required=True)
    title = fields.String(required=True)
    type = fields.String(required=True)
    status = fields.String(required=True)
    isDefault = fields.Boolean(required=True)
    isPublic = fields.Boolean(required=True)
    scope = fields.String(required=True)
    description = fields.String()
    iconName = fields.String()
    provider = fields.String()
    model = fields.String()
    capabilities = fields.List(fields.String())
    samplePrompts = fields.List(fields.String())
    skills = fields.List(fields.Nested(AgentSkillSummarySchema))
    metadata = free_json()


AgentSummaryListSchema = Schema.from_dict(
    {"agents": fields.List(fields.Nested(AgentSummarySchema), required=True), **_page_fields()},
    name="AgentSummaryListSchema")


class PageQuerySchema(NulFree):
    """Paging of a registry list: `limit` items (by name) after `cursor` (a previous page's nextCursor)."""

    limit = QueryInt(validate=validate.Range(min=1), metadata={
        "maximum_setting": "REGISTRY_LIST_MAX_LIMIT",
        "description": "items per page: default REGISTRY_LIST_DEFAULT_LIMIT (100), at most REGISTRY_LIST_MAX_LIMIT "
                       "(1000); a page also ends before REGISTRY_LIST_MAX_BYTES (8 MiB)"})
    cursor = fields.String(validate=validate.Length(min=1, max=4000),
                           metadata={"description": "the `nextCursor` of the previous page"})

    @validates("limit")
    def _within_the_bound(self, value, **_):
        bound = int(current_app.config["REGISTRY_LIST_MAX_LIMIT"])
        if value > bound:
            raise ValidationError(f"Must be between 1 and {bound} (REGISTRY_LIST_MAX_LIMIT).")


class AgentFilterQuerySchema(PageQuerySchema):
    """Optional filters of the agent lists (all given filters must match), and paging."""

    status = fields.String(validate=validate.OneOf(AGENT_STATUSES))
    type_ = fields.String(data_key="type", validate=validate.OneOf(AGENT_TYPES))
    is_default = fields.Boolean(data_key="isDefault")


class ByNameQuerySchema(NulFree):
    name = fields.String(required=True, validate=validate.Length(min=1, max=128),
                         metadata={"example": "order-help", "description": "the machine name (the examples "
                                                                          "create an agent and a skill `order-help`)"})


class ImportQuerySchema(Schema):
    overwrite = fields.Boolean(load_default=False)


class ForceQuerySchema(Schema):
    force = fields.Boolean(load_default=False)


# --------------------------------------------------------------------------- catalog skills


class SkillInputSchema(_Input):
    """Partial catalog Skill; accepts `{skill: {...}}` or the bare object."""

    _unwrap_skill = _unwrap("skill")

    name = machine_name(required=True)
    title = text(200, min_length=1, required=True)
    category = text(100, min_length=1, required=True)
    description = text(4000, allow_none=True)
    slashCommand = fields.String(allow_none=True, validate=validate.Regexp(
        r"^/[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", error="Must look like /command."))
    iconName = text(100, allow_none=True)
    tools = fields.List(fields.Nested(AgentToolSchema), validate=validate.Length(max=100), allow_none=True)
    systemPromptExtension = text(20000, allow_none=True)
    configSchema = json_schema(allow_none=True)
    enabled = StrictBool(load_default=True)
    artifactVersion = StrictInt(validate=validate.Range(min=0), allow_none=True)
    metadata = free_json(allow_none=True)
    persisted = fields.Raw(load_only=True, allow_none=True, metadata={"description": "ignored; always true on output"})


class SkillSchema(SkillInputSchema, _Audited):
    persisted = fields.Boolean(dump_only=True)


SkillEnvelopeSchema, SkillListSchema = _envelopes("skill", "skills", SkillSchema)


CATEGORIES_SCHEMA = {"type": "array", "items": {"type": "string"},
                     "description": "distinct categories of the catalog skills, sorted"}


# --------------------------------------------------------------------------- tool definitions


class ToolDefinitionFields(_Input):
    """ToolDefinition: a tool template (function-calling style) that agents customise into AgentTools."""

    name = fields.String(required=True, validate=validate.Regexp(
        r"^[A-Za-z][A-Za-z0-9_-]{0,63}$",
        error="Must start with a letter; letters, digits, '_' and '-' only (at most 64)."),
        metadata={"description": "function name the model calls"})
    title = text(200, min_length=1, allow_none=True, metadata={"description": "defaults to name"})
    description = text(4000, load_default="")
    type = fields.String(load_default="function", validate=validate.Regexp(
        r"^[a-z][a-z0-9_-]{0,39}$", error="Lower-case word such as api, search, document, extraction."))
    category = text(100, allow_none=True)
    version = text(64, min_length=1, load_default="1.0.0")
    inputSchema = schema_object(validate=check_object_schema,
                              load_default=lambda: {"type": "object", "properties": {}},
                              metadata={**OBJECT_SCHEMA_RULE,
                                        "description": "JSON Schema of the arguments (type object)"})
    outputSchema = json_schema(allow_none=True)
    configSchema = json_schema(load_default=dict)
    defaultConfig = free_json(load_default=dict, metadata={"description": "validated against configSchema"})
    isSystem = StrictBool(load_default=False)
    enabled = StrictBool(load_default=True)
    tags = string_list(50, 64, allow_none=True)
    metadata = free_json(allow_none=True)

    @validates_schema
    def _config_matches_schema(self, data, **_):
        check_config(data, schema_key="configSchema", config_key="defaultConfig")


class ToolDefinitionSchema(ToolDefinitionFields, _Audited):
    """ToolDefinition as returned."""


ToolDefinitionBodySchema, ToolDefinitionPatchBodySchema = _bodies("toolDefinition", ToolDefinitionFields)
ToolDefinitionEnvelopeSchema, ToolDefinitionListSchema = _envelopes("toolDefinition", "toolDefinitions",
                                                                    ToolDefinitionSchema)


ToolDefinitionsByIdsSchema = Schema.from_dict(
    {"toolDefinitions": fields.List(fields.Nested(ToolDefinitionSchema), required=True)},
    name="ToolDefinitionsByIdsSchema")


class ByIdsSchema(NulFree):
    ids = fields.List(fields.String(validate=validate.Length(min=1, max=64)), required=True,
                      validate=validate.Length(max=500))


# --------------------------------------------------------------------------- sub-agents


class SubAgentFields(_Input):
    """SubAgent: a focused helper agent an agent can delegate to (`agent.subAgentIds`). Only `name`
    is required."""

    name = machine_name(required=True)
    title = text(200, min_length=1, allow_none=True, metadata={"description": "defaults to name"})
    description = text(4000, load_default="")
    systemPrompt = text(100_000, load_default="")
    provider = text(100, min_length=1, allow_none=True,
                    metadata={"description": "absent: the delegating agent's provider"})
    model = text(200, min_length=1, allow_none=True,
                 metadata={"description": "absent: the delegating agent's model"})
    temperature = StrictFloat(load_default=0.7, validate=TEMPERATURE)
    maxTokens = StrictInt(load_default=2048, validate=MAX_TOKENS)
    tools = fields.List(fields.Nested(AgentToolSchema), load_default=list, validate=validate.Length(max=100))
    status = fields.String(load_default="active", validate=validate.OneOf(SUB_AGENT_STATUSES))
    tags = string_list(50, 64, allow_none=True)
    metadata = free_json(allow_none=True)


class SubAgentSchema(SubAgentFields, _Audited):
    """SubAgent as returned."""


SubAgentBodySchema, SubAgentPatchBodySchema = _bodies("subAgent", SubAgentFields)
SubAgentEnvelopeSchema, SubAgentListSchema = _envelopes("subAgent", "subAgents", SubAgentSchema)


# --------------------------------------------------------------------------- widgets


class WidgetThemeSchema(Schema):
    mode = fields.String(load_default="light", validate=validate.OneOf(THEME_MODES))
    primaryColor = fields.String(load_default="#2563EB", validate=HEX_COLOUR)
    backgroundColor = fields.String(load_default="#FFFFFF", validate=HEX_COLOUR)
    textColor = fields.String(load_default="#111827", validate=HEX_COLOUR)
    fontFamily = text(200, allow_none=True)
    borderRadius = StrictInt(load_default=12, validate=validate.Range(min=0, max=48))


class WidgetFields(_Input):
    """AgentWidget: how one agent's embeddable chat widget looks and where it may be embedded."""

    name = text(128, min_length=1, required=True)
    isDefault = StrictBool(load_default=False)
    enabled = StrictBool(load_default=True)
    title = text(200, allow_none=True, metadata={"description": "header title; absent = the agent's title"})
    greeting = text(2000, load_default="")
    placeholder = text(200, load_default="Type a message…")
    position = fields.String(load_default="bottom-right", validate=validate.OneOf(WIDGET_POSITIONS))
    theme = fields.Nested(WidgetThemeSchema, load_default=lambda: WidgetThemeSchema().load({}))
    launcherIcon = fields.String(validate=[validate.Length(max=2048), LAUNCHER_ICON], load_default="chat",
                                 metadata={"description": "icon name, or an https URL of an image"})
    customCssUrl = fields.String(allow_none=True, validate=HTTPS_URL)
    allowedOrigins = fields.List(fields.String(validate=ORIGIN), load_default=list,
                                 validate=validate.Length(max=100),
                                 metadata={"description": "origins allowed to embed the widget; empty = none"})
    autoOpen = StrictBool(load_default=False)
    showBranding = StrictBool(load_default=True)
    metadata = free_json(allow_none=True)

    @pre_load
    def _drop_agent_id(self, data, **_):
        # agentId comes from the path (create) or stays the widget's agent (update)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k != "agentId"}
        return data


class WidgetSchema(WidgetFields, _Audited):
    agentId = fields.String(dump_only=True)


WidgetBodySchema, WidgetPatchBodySchema = _bodies("widget", WidgetFields)
WidgetEnvelopeSchema, WidgetListSchema = _envelopes("widget", "widgets", WidgetSchema)


class SetDefaultWidgetSchema(NulFree):
    agentId = fields.String(required=True, validate=validate.Length(min=1, max=64))


# --------------------------------------------------------------------------- request examples
# One story a reader can run in order in a fresh organization (OpenAPI; Swagger UI's "Try it out" sends
# them as they are): a tool definition, a catalog skill and an agent named `order-help`, a sub-agent, a
# widget. EXAMPLE_ID stands for "paste the id you got" where an id the server makes is needed.
EXAMPLE_ID = "3f2c8a5e-7d1b-4c9e-8f60-2a4b6c8d0e1f"
ORDER_INPUT = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}
TOOL_DEFINITION_EXAMPLE = {"toolDefinition": {
    "name": "lookup_order", "description": "Find an order by its number", "type": "api", "inputSchema": ORDER_INPUT,
    "configSchema": {"type": "object", "properties": {"endpoint": {"type": "string", "format": "uri"}}},
    "defaultConfig": {"endpoint": "https://orders.example.com"}}}
TOOL_DEFINITION_UPDATE_EXAMPLE = {"toolDefinition": {"description": "Find an order by its number or tracking code"}}
BY_IDS_EXAMPLE = {"ids": [EXAMPLE_ID, "unknown-id"]}
SKILL_EXAMPLE = {"name": "order-help", "title": "Order help", "category": "support", "slashCommand": "/order",
                 "tools": [{"toolId": "lookup-order", "toolName": "lookup_order", "enabled": True}]}
SKILL_UPDATE_EXAMPLE = {"title": "Order and refund help"}
SUB_AGENT_EXAMPLE = {"subAgent": {"name": "researcher", "title": "Researcher",
                                  "description": "Looks up shipping rules", "model": "small-chat"}}
SUB_AGENT_UPDATE_EXAMPLE = {"subAgent": {"temperature": 0.2}}
AGENT_EXAMPLE = {"name": "order-help", "title": "Order help", "type": "chat", "provider": "provider-a",
                 "model": "large-chat", "goal": "Answer questions about orders and refunds", "isDefault": True,
                 "temperature": 0.3,
                 "tools": [{"toolId": "lookup-order", "toolName": "lookup_order", "type": "api", "enabled": True,
                            "inputSchema": ORDER_INPUT}]}
AGENT_UPDATE_EXAMPLE = {"status": "active", "temperature": 0.2}
AGENT_IMPORT_EXAMPLE = {**AGENT_EXAMPLE, "name": "order-help-imported", "title": "Order help (imported)",
                        "isDefault": False}
WIDGET_EXAMPLE = {"widget": {"name": "website", "greeting": "Hi! How can I help with your order?",
                             "allowedOrigins": ["https://shop.example.com"], "theme": {"primaryColor": "#0F766E"}}}
WIDGET_UPDATE_EXAMPLE = {"widget": {"greeting": "Hello! Ask me about your order."}}
SET_DEFAULT_WIDGET_EXAMPLE = {"agentId": EXAMPLE_ID}
