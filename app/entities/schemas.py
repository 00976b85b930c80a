"""Wire shapes of the entity store (camelCase field names, as clients send and read them)."""

from __future__ import annotations

from flask import current_app
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, pre_load, validate, validates
from marshmallow import fields as ma

from app.extensions import ExactDumpSchema
from app.fields import FastLoad, QueryInt, StrictInt
from app.jsonbody import BoundedJson

ENTITY_NAME = r"^[a-z][a-z0-9_-]{0,63}$"
VIEW_TYPES = ("table", "kanban", "calendar", "gallery", "list", "timeline")


class SortOrderField(ma.Field):
    """`sortOrder`: 1 (asc) or -1 (desc) on the wire; "asc"/"desc" accepted too."""

    VALUES = [1, -1, "1", "-1", "asc", "desc"]

    def __init__(self, **kwargs):
        values = self.VALUES + ([None] if kwargs.get("allow_none") else [])
        kwargs.setdefault("metadata", {"enum": values, "description": "1 (ascending) or -1 (descending)"})
        super().__init__(**kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        mapping = {1: 1, -1: -1, "1": 1, "-1": -1, "asc": 1, "desc": -1}
        if isinstance(value, bool) or not isinstance(value, int | str) or value not in mapping:
            raise ValidationError("must be 1 (ascending) or -1 (descending)")
        return mapping[value]

    def _serialize(self, value, attr, obj, **kwargs):
        return value


class AnyJson(ma.Raw):
    """Any JSON value (documented as such in OpenAPI)."""


class AuditedSchema(Schema):
    createdAt = ma.String()
    updatedAt = ma.String()
    createdBy = ma.String(allow_none=True)
    updatedBy = ma.String(allow_none=True)


# --- definitions ----------------------------------------------------------------------------------

class EmbeddingsConfigSchema(Schema):
    class Meta:
        unknown = RAISE

    enabled = ma.Boolean(required=True)
    fields = ma.List(ma.String(validate=validate.Length(max=200)), load_default=list,
                     validate=validate.Length(max=500),
                     metadata={"description": "fields feeding the embedding text; empty = name only"})
    model = ma.String(allow_none=True)
    dimensions = StrictInt(allow_none=True, validate=validate.Range(min=1, max=16000))


class DefinitionInputSchema(Schema):
    """Partial EntityDefinition (create and update). Server-managed fields are ignored."""

    class Meta:
        unknown = EXCLUDE

    name = ma.String(validate=[validate.Regexp(ENTITY_NAME, error="lower-case letters, digits, _ and -; "
                                                                        "starting with a letter; at most 64"),
                               validate.NoneOf(["definitions"], error="'definitions' is reserved")],
                     metadata={"not": {"enum": ["definitions"]}})
    displayName = ma.String(validate=validate.Length(min=1, max=200))
    module = ma.String(allow_none=True, validate=validate.Length(max=100))
    description = ma.String(allow_none=True, validate=validate.Length(max=10000))
    schema = BoundedJson("JSON_SCHEMA_MAX_BYTES", metadata={
        "description": "JSON Schema of a record's fields (platform field types via `fieldType` or `type`)"})
    defaultViewId = ma.String(allow_none=True, validate=validate.Length(max=200))
    metadata = BoundedJson(allow_none=True)
    isActive = ma.Boolean()
    embeddingsConfig = ma.Nested(EmbeddingsConfigSchema, allow_none=True)
    version = StrictInt(metadata={"description": "on update: the version you read; stale → 409"})
    # registry provenance: honoured on the admin upsert only
    artifactVersion = StrictInt(allow_none=True)
    forkedFromVersion = StrictInt(allow_none=True)
    source = ma.String(allow_none=True, validate=validate.Length(max=100))

    @pre_load
    def unwrap(self, data, **_kwargs):
        """`{definition: {...}}` is accepted as well as the bare object."""
        if isinstance(data, dict) and set(data) == {"definition"} and isinstance(data["definition"], dict):
            return data["definition"]
        return data


class DefinitionCreateSchema(DefinitionInputSchema):
    """Partial EntityDefinition on create: `name` is required and a definition starts active."""

    name = ma.String(required=True, validate=DefinitionInputSchema._declared_fields["name"].validators,
                     metadata=DefinitionInputSchema._declared_fields["name"].metadata)
    isActive = ma.Boolean(metadata={"enum": [True], "description": "a definition is created active"})


class DefinitionSchema(AuditedSchema):
    id = ma.String(required=True)
    name = ma.String(required=True)
    displayName = ma.String()
    module = ma.String(allow_none=True)
    description = ma.String(allow_none=True)
    schema = ma.Dict()
    defaultViewId = ma.String(allow_none=True)
    metadata = ma.Dict(allow_none=True)
    isActive = ma.Boolean()
    version = ma.Integer()
    embeddingsConfig = ma.Dict(allow_none=True)
    artifactVersion = ma.Integer(allow_none=True)
    forkedFromVersion = ma.Integer(allow_none=True)
    product = ma.String(allow_none=True)
    source = ma.String(allow_none=True)
    orgId = ma.String()


class DefinitionEnvelopeSchema(Schema):
    definition = ma.Nested(DefinitionSchema, required=True)


class DefinitionListSchema(Schema):
    definitions = ma.List(ma.Nested(DefinitionSchema), required=True)
    nextCursor = ma.String(allow_none=True, required=True,
                           metadata={"description": "send it back as `cursor` for the next page; null on the last"})


class ListPageArgsSchema(Schema):
    """Paging of the definition and view lists: `limit` items after `cursor` (a previous page's
    nextCursor), as the agent registry's lists page."""

    class Meta:
        unknown = EXCLUDE

    limit = QueryInt(validate=validate.Range(min=1), metadata={
        "maximum_setting": "ENTITY_LIST_MAX_LIMIT",
        "description": "items per page: default ENTITY_LIST_DEFAULT_LIMIT (100), at most ENTITY_LIST_MAX_LIMIT "
                       "(1000); a page also ends before ENTITY_LIST_MAX_BYTES (8 MiB)"})
    cursor = ma.String(validate=validate.Length(min=1, max=4000),
                       metadata={"description": "the `nextCursor` of the previous page"})

    @validates("limit")
    def _within_the_bound(self, value, **_):
        bound = int(current_app.config["ENTITY_LIST_MAX_LIMIT"])
        if value > bound:
            raise ValidationError(f"Must be between 1 and {bound} (ENTITY_LIST_MAX_LIMIT).")


class DefinitionListArgsSchema(ListPageArgsSchema):
    module = ma.String()
    status = ma.String(validate=validate.OneOf(["active", "inactive"]))


class DefinitionDeleteArgsSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    deleteRecords = ma.Boolean(load_default=False)
    hardDelete = ma.Boolean(load_default=False)


class AdminUpsertSchema(Schema):
    class Meta:
        unknown = RAISE

    definitions = ma.List(AnyJson(allow_none=True), required=True, validate=validate.Length(min=1, max=500),
                          metadata={"description": "EntityDefinition objects; each is checked on its own and a "
                                                   "rejected one (anything not a valid definition) is listed in "
                                                   "`errors`"})


class AdminUpsertResultSchema(Schema):
    created = ma.Integer(required=True)
    updated = ma.Integer(required=True)
    errors = ma.List(ma.String(), required=True)


class IdSchema(Schema):
    id = ma.String(required=True)


# --- views ----------------------------------------------------------------------------------------

class ViewInputSchema(Schema):
    """Partial EntityView."""

    class Meta:
        unknown = EXCLUDE

    name = ma.String(validate=validate.Length(min=1, max=200))
    type = ma.String(validate=validate.OneOf(VIEW_TYPES))
    description = ma.String(allow_none=True, validate=validate.Length(max=10000))
    columns = ma.List(ma.String(validate=validate.Length(max=200)), validate=validate.Length(max=500))
    filters = BoundedJson()
    sortBy = ma.String(allow_none=True, validate=validate.Length(max=200))
    sortOrder = SortOrderField()
    pageSize = StrictInt(allow_none=True, validate=validate.Range(min=1),
                         metadata={"maximum_setting": "ENTITY_MAX_PAGE_SIZE",  # the record query's bound
                                   "description": "at most ENTITY_MAX_PAGE_SIZE (default 500)"})
    isDefault = ma.Boolean()
    config = BoundedJson()

    @validates("pageSize")
    def _page_size_within_the_query_bound(self, value, **_kwargs):
        """A view's page size is one its record query can serve: the same ENTITY_MAX_PAGE_SIZE."""
        bound = int(current_app.config["ENTITY_MAX_PAGE_SIZE"])
        if value is not None and value > bound:
            raise ValidationError(f"Must be between 1 and {bound} (ENTITY_MAX_PAGE_SIZE).")

    @pre_load
    def unwrap(self, data, **_kwargs):
        if isinstance(data, dict) and set(data) == {"view"} and isinstance(data["view"], dict):
            return data["view"]
        return data


class ViewCreateSchema(ViewInputSchema):
    """Partial EntityView on create: `name` is required."""

    name = ma.String(required=True, validate=validate.Length(min=1, max=200))


class ViewSchema(AuditedSchema):
    id = ma.String(required=True)
    entityId = ma.String()
    entityName = ma.String()
    name = ma.String()
    type = ma.String()
    description = ma.String(allow_none=True)
    columns = ma.List(ma.String())
    filters = ma.Dict()
    sortBy = ma.String(allow_none=True)
    sortOrder = ma.Integer()
    pageSize = ma.Integer(allow_none=True)
    isDefault = ma.Boolean()
    config = ma.Dict()


class ViewListSchema(Schema):
    views = ma.List(ma.Nested(ViewSchema), required=True)
    nextCursor = ma.String(allow_none=True, required=True,
                           metadata={"description": "send it back as `cursor` for the next page; null on the last"})


# --- records --------------------------------------------------------------------------------------

class RecordInputSchema(Schema):
    """Partial EntityRecord. Server-managed fields (id, entityId, createdAt, …) are ignored."""

    class Meta:
        unknown = EXCLUDE

    name = ma.String(validate=validate.Length(max=1000))
    fields = ma.Dict(metadata={"description": "validated against the definition's schema"})
    tags = ma.List(ma.String(validate=validate.Length(min=1, max=200)), validate=validate.Length(max=100))
    metadata = ma.Dict(allow_none=True)
    isActive = ma.Boolean()
    version = StrictInt(metadata={"description": "on update: the version you read; stale → 409"})


class RecordSchema(AuditedSchema, ExactDumpSchema):
    id = ma.String(required=True)
    entityId = ma.String(required=True)
    name = ma.String()
    fields = ma.Dict()
    tags = ma.List(ma.String())
    metadata = ma.Dict(allow_none=True)
    isActive = ma.Boolean()
    version = ma.Integer()
    distance = ma.Float(metadata={"description": "only on semantic searches ($similar)"})
    lookups = ma.Dict(metadata={"description": "resolved lookup fields (includeLookups)"})


class RecordDeleteArgsSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    hardDelete = ma.Boolean(load_default=False)


class LookupIncludeSchema(Schema):
    class Meta:
        unknown = RAISE

    field = ma.String(required=True, metadata={"description": "a lookup or multilookup field"})
    fields = ma.List(ma.String(), metadata={"description": "fields of the referenced records to "
                                                                   "return; all when omitted"})


class QueryParamsSchema(FastLoad):
    class Meta:
        unknown = RAISE

    page = StrictInt(allow_none=True, validate=validate.Range(min=1, max=1_000_000),
                     metadata={"description": "1 when neither page nor cursor is given"})
    cursor = ma.String(allow_none=True, validate=validate.Length(max=4000),
                       metadata={"description": "a `nextCursor` of the previous page, in place of `page`"})
    pageSize = StrictInt(load_default=20, validate=validate.Range(min=1),
                         metadata={"maximum_setting": "ENTITY_MAX_PAGE_SIZE",  # the app's value (app.extensions)
                                   "description": "at most ENTITY_MAX_PAGE_SIZE (default 500)"})
    filters = ma.Dict(load_default=dict, allow_none=True)
    sortBy = ma.String(allow_none=True)
    sortOrder = SortOrderField(allow_none=True)
    include = ma.List(ma.String(), allow_none=True)
    exclude = ma.List(ma.String(), allow_none=True)
    includeLookups = ma.List(ma.Nested(LookupIncludeSchema), allow_none=True)


class QueryRequestSchema(FastLoad):
    """The record query body. Its `load` (and the count body's) takes the fast lane derived from the
    schema (app.fields.FastLoad): marshmallow's load is ~0.1 ms of a record query's fixed cost."""

    class Meta:
        unknown = RAISE

    query = ma.Nested(QueryParamsSchema, load_default=lambda: QueryParamsSchema().load({}))


class PaginatedResultSchema(ExactDumpSchema):
    records = ma.List(ma.Nested(RecordSchema), required=True)
    totalCount = ma.Integer(required=True)
    currentPage = ma.Integer(required=True)
    pageSize = ma.Integer(required=True)
    totalPages = ma.Integer(required=True)
    hasNextPage = ma.Boolean(required=True)
    hasPreviousPage = ma.Boolean(required=True)
    nextCursor = ma.String(allow_none=True, metadata={
        "description": "keyset cursor of the next page (send as `query.cursor`); null on the last page or for "
                       "relevance-ordered results ($similar, ranked $search)"})


class CountRequestSchema(FastLoad):
    class Meta:
        unknown = RAISE

    filters = ma.Dict(load_default=dict, allow_none=True)


# --- bulk and jobs --------------------------------------------------------------------------------

class BulkRecordsSchema(Schema):
    class Meta:
        unknown = RAISE

    records = ma.List(AnyJson(metadata={"type": "object"}), required=True, validate=validate.Length(min=1),
                      metadata={"description": "Partial EntityRecord objects; each is checked, all or nothing"})


class BulkUpdateSchema(BulkRecordsSchema):
    records = ma.List(AnyJson(metadata={"type": "object", "required": ["id"],
                                        "properties": {"id": {"type": "string", "minLength": 1}}}),
                      required=True, validate=validate.Length(min=1),
                      metadata={"description": "Partial EntityRecord objects with the `id` of an existing "
                                               "record, each id once; each is checked, all or nothing"})


class BulkDeleteSchema(Schema):
    class Meta:
        unknown = RAISE

    recordIds = ma.List(ma.String(validate=validate.Length(min=1, max=64)), required=True,
                        validate=validate.Length(min=1),
                        metadata={"uniqueItems": True, "description": "ids of existing records, each once"})


class BulkResultSchema(Schema):
    message = ma.String(required=True)
    count = ma.Integer(required=True)


class JobAcceptedSchema(Schema):
    jobId = ma.String(required=True)


class JobSchema(Schema):
    jobId = ma.String(required=True)
    status = ma.String(required=True, metadata={"description": "pending | running | succeeded | failed"})
    operation = ma.String()
    entityName = ma.String()
    result = ma.Nested(BulkResultSchema, allow_none=True)
    error = ma.Dict(allow_none=True, metadata={"description": "{code, message, details?} when failed"})
    createdAt = ma.String()
    startedAt = ma.String(allow_none=True)
    finishedAt = ma.String(allow_none=True)


# --- relationships --------------------------------------------------------------------------------

class RelationshipInputSchema(Schema):
    """CreateRelationshipRequest."""

    class Meta:
        unknown = RAISE

    toEntityName = ma.String(required=True, validate=validate.Length(min=1, max=64))
    toRecordId = ma.String(required=True, validate=validate.Length(min=1, max=64))
    relationshipType = ma.String(required=True, validate=validate.Length(min=1, max=100))
    fields = BoundedJson(allow_none=True)


class RelationshipListArgsSchema(Schema):
    """ListRelationshipsParams."""

    class Meta:
        unknown = EXCLUDE

    relationshipType = ma.String()
    targetEntity = ma.String()
    direction = ma.String(load_default="both", validate=validate.OneOf(["outgoing", "incoming", "both"]))


class RelationshipSchema(Schema):
    id = ma.String(required=True)
    fromEntityName = ma.String(required=True)
    fromRecordId = ma.String(required=True)
    toEntityName = ma.String(required=True)
    toRecordId = ma.String(required=True)
    relationshipType = ma.String(required=True)
    fields = ma.Dict(allow_none=True)
    createdAt = ma.String()
    isActive = ma.Boolean()


class RelationshipListSchema(Schema):
    relationships = ma.List(ma.Nested(RelationshipSchema), required=True)


# --- request examples (OpenAPI; Swagger UI's "Try it out" sends them as they are) ----------------------
# One story a reader can run in order in a fresh organization: the `tickets` definition, a view, records,
# queries, bulk writes, a relationship. An id the server makes cannot be an example: EXAMPLE_ID stands for
# "paste the id you got" in the bodies of operations whose path needs such an id anyway.
EXAMPLE_ENTITY = "tickets"
EXAMPLE_ID = "3f2c8a5e-7d1b-4c9e-8f60-2a4b6c8d0e1f"
TICKET_SCHEMA = {"type": "object", "required": ["title"], "properties": {
    "title": {"type": "string", "maxLength": 200},
    "priority": {"type": "dropdown", "options": ["low", "normal", "high"]},
    "estimate": {"type": "float"},
    "due": {"type": "date"},
    "details": {"type": "text"}}}
DEFINITION_EXAMPLE = {"name": EXAMPLE_ENTITY, "displayName": "Tickets", "module": "support",
                      "description": "Customer support tickets", "schema": TICKET_SCHEMA}
DEFINITION_UPDATE_EXAMPLE = {"description": "Customer support tickets, by priority"}
VIEW_EXAMPLE = {"name": "Open by due date", "type": "table", "columns": ["title", "priority", "due"],
                "filters": {"priority": {"$ne": "low"}}, "sortBy": "due", "sortOrder": 1}
VIEW_UPDATE_EXAMPLE = {"columns": ["title", "priority", "estimate", "due"]}
RECORD_EXAMPLE = {"name": "Printer offline", "tags": ["hardware"], "fields": {
    "title": "Printer offline", "priority": "high", "estimate": 2.5, "due": "2026-12-01",
    "details": "The printer on floor 2 shows offline since the network change."}}
RECORD_UPDATE_EXAMPLE = {"fields": {"priority": "normal", "estimate": 1.5}}
QUERY_EXAMPLE = {"query": {"filters": {"priority": {"$in": ["high", "normal"]}, "$search": "printer"},
                           "sortBy": "due", "sortOrder": 1, "page": 1, "pageSize": 20,
                           "include": ["title", "priority", "due"]}}
COUNT_EXAMPLE = {"filters": {"priority": "high"}}
BULK_CREATE_EXAMPLE = {"records": [{"name": "VPN drops", "fields": {"title": "VPN drops", "priority": "normal"}},
                                   {"name": "New laptop", "fields": {"title": "New laptop", "priority": "low"}}]}
BULK_UPDATE_EXAMPLE = {"records": [{"id": EXAMPLE_ID, "fields": {"priority": "low"}}]}
BULK_DELETE_EXAMPLE = {"recordIds": [EXAMPLE_ID]}
RELATIONSHIP_EXAMPLE = {"toEntityName": EXAMPLE_ENTITY, "toRecordId": EXAMPLE_ID, "relationshipType": "duplicate-of"}
ADMIN_UPSERT_EXAMPLE = {"definitions": [{"name": EXAMPLE_ENTITY, "displayName": "Support tickets",
                                         "module": "support", "schema": TICKET_SCHEMA}]}
