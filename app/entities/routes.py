"""HTTP routes of the entity store (thin: parse, call a service, return)."""

from __future__ import annotations

from flask import request
from flask.views import MethodView

from app.db import db
from app.entities import bulk, query, reads
from app.entities.aggregation_routes import blp as aggregation_blp
from app.entities.schemas import (
    AdminUpsertResultSchema,
    AdminUpsertSchema,
    BulkDeleteSchema,
    BulkRecordsSchema,
    BulkResultSchema,
    BulkUpdateSchema,
    CountRequestSchema,
    DefinitionCreateSchema,
    DefinitionDeleteArgsSchema,
    DefinitionEnvelopeSchema,
    DefinitionInputSchema,
    DefinitionListArgsSchema,
    DefinitionListSchema,
    IdSchema,
    JobAcceptedSchema,
    JobSchema,
    PaginatedResultSchema,
    QueryRequestSchema,
    RecordDeleteArgsSchema,
    RecordInputSchema,
    RecordSchema,
    RelationshipInputSchema,
    RelationshipListArgsSchema,
    RelationshipListSchema,
    RelationshipSchema,
    ViewCreateSchema,
    ViewInputSchema,
    ViewListSchema,
)
from app.entities.services import common, definitions, records, relationships, views
from app.extensions import Blueprint, SuccessSchema
from app.preconditions import etag, if_match, tagged, with_etag
from app.ratelimit import concurrency_limited, may_be_rate_limited, rate_limited
from app.tenancy import current_tenant
from app.wire import SUCCESS, accepted, json_response, preferences, wants_async

READ, WRITE = "read:entities", "write:entities"

blp = Blueprint("entities", __name__, url_prefix="/api/v1/entities",
                description="Entity store: definitions, views, records, relationships, bulk")
admin_blp = Blueprint("entities_admin", __name__, url_prefix="/api/v1/admin/entities",
                      description="Entity store administration")
jobs_blp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs", description="Asynchronous jobs")
blueprints = [blp, admin_blp, jobs_blp, aggregation_blp]
# Bodies checked by their own parsers: bulk per record (the answer lists indexes), query/count by the
# filter parser (the answer names the filter path).
SELF_CHECKED = {"entities.BulkCreate", "entities.BulkUpdate", "entities.BulkDelete", "entities.RecordQuery",
                "entities.RecordCount"}


def _refuse_unstorable() -> None:
    """JSON bodies must be storable (no number too big for a float) — a 400, never a database error.
    (A NUL character anywhere in a request is the parser's one rule, app.jsonbody.)"""
    if request.endpoint not in SELF_CHECKED and request.is_json and request.get_data(cache=True):
        body = request.get_json(silent=True)
        if body is not None:
            common.check_storable(body)


for _blueprint in blueprints:
    _blueprint.before_request(_refuse_unstorable)


# --- definitions ----------------------------------------------------------------------------------

@blp.route("/definitions")
class Definitions(MethodView):
    @blp.arguments(DefinitionListArgsSchema, location="query")
    @blp.response(200, DefinitionListSchema)
    @blp.requires(READ)
    def get(self, args):
        """List entity definitions (optional `module`, `status` = active|inactive)."""
        found = definitions.list_definitions(args.get("module"), args.get("status"))
        return {"definitions": [definitions.definition_to_wire(d) for d in found]}

    @blp.arguments(DefinitionCreateSchema)
    @blp.response(201, IdSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data):
        """Create an entity definition; its schema is checked; the name is unique per org (409)."""
        return {"id": definitions.create_definition(db.session, current_tenant(), data).id}


@blp.route("/definitions/<string:entityName>")
class Definition(MethodView):
    @blp.response(200, DefinitionEnvelopeSchema)
    @blp.requires(READ)
    @blp.conditional
    def get(self, entityName):
        """Get a definition by name (an inactive one is returned when no active one has the name)."""
        found = definitions.find_definition(entityName, include_inactive=True)
        return tagged({"definition": definitions.definition_to_wire(found)}, definitions.etag_of(found))

    @blp.arguments(DefinitionInputSchema)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def put(self, data, entityName):
        """Update a definition (partial); bumps `version`; a stale `version` is 409."""
        updated = definitions.update_definition(db.session, current_tenant(), entityName, data, if_match=if_match())
        return with_etag(SUCCESS, definitions.etag_of(updated))

    @blp.arguments(DefinitionDeleteArgsSchema, location="query")
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def delete(self, args, entityName):
        """Delete a definition: soft by default; `deleteRecords`, `hardDelete` flags."""
        definitions.delete_definition(db.session, current_tenant(), entityName, delete_records=args["deleteRecords"],
                                      hard_delete=args["hardDelete"], if_match=if_match())
        return SUCCESS


@admin_blp.route("/update")
class AdminUpsert(MethodView):
    @admin_blp.arguments(AdminUpsertSchema)
    @admin_blp.response(200, AdminUpsertResultSchema)
    @admin_blp.requires(roles=("admin", "super_admin"))
    @admin_blp.idempotent
    def post(self, data):
        """Create or update definitions by name in the caller's org (role admin)."""
        return definitions.upsert_definitions(db.session, current_tenant(), data["definitions"])


# --- views ----------------------------------------------------------------------------------------

@blp.route("/definitions/<string:entityName>/views")
class Views(MethodView):
    @blp.response(200, ViewListSchema)
    @blp.requires(READ)
    def get(self, entityName):
        """List the views of a definition."""
        definition = definitions.find_definition(entityName)
        return {"views": [views.view_to_wire(v, definition) for v in views.list_views(db.session, definition)]}

    @blp.arguments(ViewCreateSchema)
    @blp.response(201, IdSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data, entityName):
        """Create a view (columns, filters, sort are checked against the definition)."""
        return {"id": views.create_view(db.session, current_tenant(), definitions.find_definition(entityName), data).id}


@blp.route("/definitions/<string:entityName>/views/<string:viewId>")
class View(MethodView):
    @blp.arguments(ViewInputSchema)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def put(self, data, entityName, viewId):
        """Update a view (partial)."""
        views.update_view(db.session, current_tenant(), definitions.find_definition(entityName), viewId, data)
        return SUCCESS

    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def delete(self, entityName, viewId):
        """Delete a view."""
        views.delete_view(db.session, definitions.find_definition(entityName), viewId)
        return SUCCESS


# --- records --------------------------------------------------------------------------------------

@blp.route("/<string:entityName>/records")
class Records(MethodView):
    @blp.arguments(RecordInputSchema)
    @blp.response(201, RecordSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    @blp.conditional
    def post(self, data, entityName):
        """Create a record; `fields` are validated against the definition's schema."""
        record = records.create_record(db.session, current_tenant(), definitions.find_definition(entityName), data)
        return with_etag(records.record_to_wire(record), etag(record.version), 201)


@blp.route("/<string:entityName>/records/query")
class RecordQuery(MethodView):
    @concurrency_limited("records")  # outermost: a refusal costs no body parsing
    @blp.arguments(QueryRequestSchema)
    @blp.response(200, PaginatedResultSchema)
    @blp.requires(READ)
    @may_be_rate_limited("similar")
    def post(self, data, entityName):
        """Query records: filters, $search, sorting, paging, include/exclude, includeLookups.

        `Prefer: count=planned` (the planner's estimate, no counting scan) or `count=estimated` (exact up
        to ENTITY_COUNT_ESTIMATE_ABOVE matches, the estimate beyond) make `totalCount` approximate;
        `Preference-Applied: count=…` then says how it was counted. Without it, `totalCount` is exact."""
        # reads only, no transaction needed: statements in autocommit (a `$similar` page too: its index
        # walk settings are then set at session level, app.entities.similar._walk_settings)
        db.reads_only()
        result = query.query_records(entityName, data["query"], _count_preference())
        return result, 200, _count_applied(result.pop("countMode"))


@blp.route("/<string:entityName>/records/count")
class RecordCount(MethodView):
    @concurrency_limited("records")
    @blp.arguments(CountRequestSchema)
    @blp.doc(responses={"200": {"description": "The number of matching records",
                                "content": {"application/json": {"schema": {"type": "integer"}}}}})
    @blp.requires(READ)
    @may_be_rate_limited("similar")
    def post(self, data, entityName):
        """Count the records matching `filters` (the response is a bare number; `Prefer: count=planned|
        estimated` as for the query)."""
        db.reads_only()
        total, how = query.count_records(entityName, data.get("filters"),
                                         _count_preference())
        return json_response(total, headers=_count_applied(how))


@blp.route("/<string:entityName>/records/<string:recordId>")
class Record(MethodView):
    @blp.response(200, RecordSchema)
    @blp.requires(READ)
    @blp.conditional
    def get(self, entityName, recordId):
        """Get a record (soft-deleted and other orgs' records are 404)."""
        record = reads.get_record(entityName, recordId)
        return tagged(record, etag(record["version"]))

    @blp.arguments(RecordInputSchema)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def put(self, data, entityName, recordId):
        """Update a record: `fields` merge (null removes a key), validated whole; stale `version` is 409."""
        record = records.update_record(db.session, current_tenant(), definitions.find_definition(entityName),
                                       recordId, data, if_match=if_match())
        return with_etag(SUCCESS, etag(record.version))

    @blp.arguments(RecordDeleteArgsSchema, location="query")
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def delete(self, args, entityName, recordId):
        """Delete a record: soft by default (relationships deactivated); `hardDelete=true` removes it."""
        records.delete_record(db.session, current_tenant(), definitions.find_definition(entityName), recordId,
                              hard_delete=args["hardDelete"], if_match=if_match())
        return SUCCESS


# --- bulk -----------------------------------------------------------------------------------------

def _count_preference() -> str:
    """`count=exact|planned|estimated` from Prefer (PostgREST's names); anything else is ignored."""
    return _asked_count() or "exact"


def _asked_count() -> str | None:
    for token in preferences():
        name, _, value = token.partition("=")
        value = value.strip().strip('"')
        if name.strip() == "count" and value in query.COUNT_MODES:
            return value
    return None


def _count_applied(how: str) -> dict[str, str]:
    """`Preference-Applied: count=<exact|planned|estimated>` when the caller stated a count preference:
    `exact` whenever the number is exact (also for `estimated` below the threshold)."""
    return {"Preference-Applied": f"count={how}"} if _asked_count() else {}


def _bulk(entityName: str, operation: str, items: list):
    definition = definitions.find_definition(entityName)
    if wants_async():
        job = bulk.start_job(db.session, current_tenant(), definition, operation, items)
        return accepted({"jobId": job.id}, f"/api/v1/jobs/{job.id}", respond_async=True)
    return bulk.run_bulk(db.session, current_tenant(), definition, operation, items)


def _bulk_route(operation: str, body_schema, key: str, summary: str) -> None:
    """One bulk endpoint (`/records/bulk/<operation>`); the three differ only in body and operation."""

    class BulkView(MethodView):
        @blp.arguments(body_schema)
        @blp.response(200, BulkResultSchema)
        @blp.alt_response(202, schema=JobAcceptedSchema, description="With `Prefer: respond-async`")
        @blp.requires(WRITE)
        @rate_limited("bulk")
        @blp.idempotent
        def post(self, data, entityName):
            return _bulk(entityName, operation, data[key])

    BulkView.post.__doc__ = summary
    BulkView.__name__ = BulkView.__qualname__ = f"Bulk{operation.title()}"
    blp.route(f"/<string:entityName>/records/bulk/{operation}")(BulkView)


_bulk_route("create", BulkRecordsSchema, "records",
            "Create many records, all or nothing (`Prefer: respond-async` → 202 {jobId}).")
_bulk_route("update", BulkUpdateSchema, "records", "Update many records by id (fields merge), all or nothing.")
_bulk_route("delete", BulkDeleteSchema, "recordIds", "Soft-delete many records by id, all or nothing.")


@jobs_blp.route("/<string:jobId>")
class Job(MethodView):
    @jobs_blp.response(200, JobSchema)
    @jobs_blp.requires(READ, WRITE)
    def get(self, jobId):
        """Status of an asynchronous job: pending | running | succeeded | failed, with its result or error."""
        return bulk.job_to_wire(bulk.get_job(jobId))


# --- relationships --------------------------------------------------------------------------------

@blp.route("/<string:entityName>/records/<string:recordId>/relationships")
class Relationships(MethodView):
    @blp.arguments(RelationshipListArgsSchema, location="query")
    @blp.response(200, RelationshipListSchema)
    @blp.requires(READ)
    def get(self, args, entityName, recordId):
        """A record's active relationships (`direction`, `relationshipType`, `targetEntity`)."""
        found = relationships.list_relationships(
            definitions.find_definition(entityName), recordId, direction=args["direction"],
            relationship_type=args.get("relationshipType"), target_entity=args.get("targetEntity"))
        return {"relationships": found}

    @blp.arguments(RelationshipInputSchema)
    @blp.response(201, RelationshipSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data, entityName, recordId):
        """Link this record to another record of the org."""
        return relationships.create_relationship(db.session, current_tenant(), definitions.find_definition(entityName),
                                                recordId, data)


@blp.route("/<string:entityName>/records/<string:recordId>/relationships/<string:relationshipId>")
class Relationship(MethodView):
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def delete(self, entityName, recordId, relationshipId):
        """Delete a relationship of this record."""
        relationships.delete_relationship(db.session, definitions.find_definition(entityName), recordId, relationshipId)
        return SUCCESS
