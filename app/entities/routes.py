"""HTTP routes of the entity store (thin: parse, call a service, return)."""

from __future__ import annotations

from flask.views import MethodView

from app.db import db
from app.entities import bulk, query, reads
from app.entities import schemas as ex
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
    ListPageArgsSchema,
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
from app.extensions import Blueprint, SuccessSchema, path_param
from app.preconditions import etag, if_match, tagged, with_etag
from app.ratelimit import concurrency_limited, may_be_rate_limited, rate_limited
from app.reqctx import current_request
from app.tenancy import current_tenant
from app.wire import SUCCESS, accepted, json_response, preferences, wants_async

READ, WRITE = "read:entities", "write:entities"

blp = Blueprint("entities", __name__, url_prefix="/api/v1/entities", tag="Entity store",
                description="Entity store: definitions, views, records, relationships, bulk")
admin_blp = Blueprint("entities_admin", __name__, url_prefix="/api/v1/admin/entities",
                      tag="Entity store administration", description="Entity definitions by name (role admin)")
jobs_blp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs", tag="Jobs",
                     description="Asynchronous entity-store jobs (bulk writes sent with `Prefer: respond-async`)")
ENTITY = path_param("entityName", "The definition's `name` (the examples create `tickets`).", ex.EXAMPLE_ENTITY)
VIEW = path_param("viewId", "A view's `id`, from the answer of POST …/views or the view list.")
RECORD = path_param("recordId", "A record's `id`, from the answer of POST …/records or a query.")
RELATIONSHIP = path_param("relationshipId", "A relationship's `id`, from POST …/relationships or the list.")
blueprints = [blp, admin_blp, jobs_blp, aggregation_blp]
# Bodies checked by their own parsers: bulk per record (the answer lists indexes), query/count by the
# filter parser (the answer names the filter path).
SELF_CHECKED = {"entities.BulkCreate", "entities.BulkUpdate", "entities.BulkDelete", "entities.RecordQuery",
                "entities.RecordCount"}


def _refuse_unstorable() -> None:
    """JSON bodies must be storable (no number too big for a float) — a 400, never a database error.
    (A NUL character anywhere in a request is the parser's one rule, app.jsonbody.)"""
    req = current_request()
    # no Content-Type (a GET): `is_json` would be False, after a KeyError inside `headers.get`
    if req.environ.get("CONTENT_TYPE") and req.endpoint not in SELF_CHECKED and req.is_json \
            and req.get_data(cache=True):
        body = req.get_json(silent=True)
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
        """List entity definitions

        A page of the organization's entity definitions with their schemas, views and embeddings
        settings, by name (`{definitions, nextCursor}`); optionally only one `module`, or only
        `status=active` / `status=inactive` ones. Paging: `limit` items (default 100, at most 1000) and
        `nextCursor`, sent back as `cursor` until it is null.

        Errors: 400 VALIDATION_ERROR for another `status`, a `limit` out of range or a foreign `cursor`.

        Example: `GET /api/v1/entities/definitions?module=support` → `{"definitions": [{"name":
        "tickets", "displayName": "Tickets", "version": 1, "schema": {…}, …}], "nextCursor": null}`"""
        found, next_cursor = definitions.list_definitions_page(args.get("module"), args.get("status"),
                                                               limit=args.get("limit"), cursor=args.get("cursor"))
        return {"definitions": [definitions.definition_to_wire(d) for d in found], "nextCursor": next_cursor}

    @blp.arguments(DefinitionCreateSchema, example=ex.DEFINITION_EXAMPLE)
    @blp.response(201, IdSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data):
        """Create an entity definition

        A new kind of record for the organization: its `name` (lower-case, used in every record path),
        display names, and `schema`, a JSON Schema whose properties may use the platform field types
        (`string`, `text`, `email`, `int`, `float`, `currency`, `bool`, `date`, `datetime`, `dropdown` with
        `options`, `multiselect`, `lookup` with `entity`, `json`, …) through `type` or `fieldType`.
        `embeddingsConfig` turns on semantic search over the named fields.

        Errors: 409 CONFLICT when the organization already has an active definition of that name;
        400 VALIDATION_ERROR for an invalid schema, a reserved name or embeddings fields the schema
        lacks.

        Example: the request example creates `tickets` (title, priority, estimate, due, details);
        201 `{"id": "…"}`. The other entity-store examples use it."""
        return {"id": definitions.create_definition(db.session, current_tenant(), data).id}


@blp.route("/definitions/<string:entityName>", parameters=[ENTITY])
class Definition(MethodView):
    @blp.response(200, DefinitionEnvelopeSchema)
    @blp.requires(READ)
    @blp.conditional
    def get(self, entityName):
        """Get an entity definition

        The definition of this name; an inactive (soft-deleted) one is answered when no active one
        has the name.

        Errors: 404 NOT_FOUND when the organization has no definition of that name.

        Example: `GET /api/v1/entities/definitions/tickets` → `{"definition": {"id": "…", "name":
        "tickets", "version": 1, "schema": {…}, "embeddingsConfig": null, …}}`"""
        found = definitions.find_definition(entityName, include_inactive=True)
        return tagged({"definition": definitions.definition_to_wire(found)}, definitions.etag_of(found))

    @blp.arguments(DefinitionInputSchema, example=ex.DEFINITION_UPDATE_EXAMPLE)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def put(self, data, entityName):
        """Update an entity definition

        Replaces the fields the body names and bumps `version`. Send the `version` you read to be
        refused instead of overwriting someone else's change. Turning `embeddingsConfig` on embeds the
        existing records in the background.

        Errors: 404 NOT_FOUND for an unknown name; 409 CONFLICT for a stale `version`; 400
        VALIDATION_ERROR for an invalid schema or embeddings fields the schema lacks.

        Example: the request example changes the description of `tickets` → `{"success": true}`."""
        updated = definitions.update_definition(db.session, current_tenant(), entityName, data, if_match=if_match())
        return with_etag(SUCCESS, definitions.etag_of(updated))

    @blp.arguments(DefinitionDeleteArgsSchema, location="query")
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def delete(self, args, entityName):
        """Delete an entity definition

        Soft by default: the definition becomes inactive and its records stay. `deleteRecords=true`
        also soft-deletes its records; `hardDelete=true` removes the definition, its views and records.

        Errors: 404 NOT_FOUND for an unknown name.

        Example: `DELETE /api/v1/entities/definitions/tickets?deleteRecords=true` → `{"success": true}`"""
        definitions.delete_definition(db.session, current_tenant(), entityName, delete_records=args["deleteRecords"],
                                      hard_delete=args["hardDelete"], if_match=if_match())
        return SUCCESS


@admin_blp.route("/update")
class AdminUpsert(MethodView):
    @admin_blp.arguments(AdminUpsertSchema, example=ex.ADMIN_UPSERT_EXAMPLE)
    @admin_blp.response(200, AdminUpsertResultSchema)
    @admin_blp.requires(roles=("admin", "super_admin"))
    @admin_blp.idempotent
    def post(self, data):
        """Create or update definitions by name

        For each definition of the body, in the caller's organization: update the one of that name,
        or create it. Each is checked on its own; a rejected one is listed in `errors` and the others
        are stored.

        Errors: 403 FORBIDDEN without role admin or super_admin; 400 VALIDATION_ERROR for an empty
        list or more than 500 definitions.

        Example: the request example stores `tickets` with the display name "Support tickets" →
        `{"created": 0, "updated": 1, "errors": []}` (`created: 1` in an organization without it)."""
        return definitions.upsert_definitions(db.session, current_tenant(), data["definitions"])


# --- views ----------------------------------------------------------------------------------------

@blp.route("/definitions/<string:entityName>/views", parameters=[ENTITY])
class Views(MethodView):
    @blp.arguments(ListPageArgsSchema, location="query")
    @blp.response(200, ViewListSchema)
    @blp.requires(READ)
    def get(self, args, entityName):
        """List the views of a definition

        A page of the saved views (columns, filters, sort, page size, layout `config`) of the
        definition, oldest first (`{views, nextCursor}`). Paging: `limit` items (default 100, at most
        1000) and `nextCursor`, sent back as `cursor` until it is null.

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR for a `limit` out of range
        or a foreign `cursor`.

        Example: `GET /api/v1/entities/definitions/tickets/views` → `{"views": [{"id": "…", "name":
        "Open by due date", "type": "table", "columns": ["title", "priority", "due"], …}], "nextCursor":
        null}`"""
        definition = definitions.find_definition(entityName)
        found, next_cursor = views.list_views_page(db.session, definition, limit=args.get("limit"),
                                                   cursor=args.get("cursor"))
        return {"views": [views.view_to_wire(v, definition) for v in found], "nextCursor": next_cursor}

    @blp.arguments(ViewCreateSchema, example=ex.VIEW_EXAMPLE)
    @blp.response(201, IdSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data, entityName):
        """Create a view

        A saved way to look at the records: `type` (table, kanban, …), `columns`, `filters` in the
        query's filter language, `sortBy`/`sortOrder`, `pageSize` and a free-form `config`.
        `isDefault: true` makes it the definition's default view.

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR for columns, filters or
        a sort field the definition does not have.

        Example: the request example saves "Open by due date" for `tickets` → 201 `{"id": "…"}`."""
        return {"id": views.create_view(db.session, current_tenant(), definitions.find_definition(entityName), data).id}


@blp.route("/definitions/<string:entityName>/views/<string:viewId>", parameters=[ENTITY, VIEW])
class View(MethodView):
    @blp.arguments(ViewInputSchema, example=ex.VIEW_UPDATE_EXAMPLE)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def put(self, data, entityName, viewId):
        """Update a view

        Replaces the fields the body names; the others stay.

        Errors: 404 NOT_FOUND for an unknown definition or view; 400 VALIDATION_ERROR as for creating.

        Example: the request example adds the `estimate` column → `{"success": true}`."""
        views.update_view(db.session, current_tenant(), definitions.find_definition(entityName), viewId, data)
        return SUCCESS

    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def delete(self, entityName, viewId):
        """Delete a view

        Removes the view; records are not touched.

        Errors: 404 NOT_FOUND for an unknown definition or view.

        Example: `DELETE /api/v1/entities/definitions/tickets/views/{viewId}` → `{"success": true}`"""
        views.delete_view(db.session, definitions.find_definition(entityName), viewId)
        return SUCCESS


# --- records --------------------------------------------------------------------------------------

@blp.route("/<string:entityName>/records", parameters=[ENTITY])
class Records(MethodView):
    @blp.arguments(RecordInputSchema, example=ex.RECORD_EXAMPLE)
    @blp.response(201, RecordSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    @blp.conditional
    def post(self, data, entityName):
        """Create a record

        A record of the definition: a `name`, `fields` validated against the definition's schema,
        `tags` and free-form `metadata`. The answer is the stored record with its `id` and `version` 1.
        With embeddings on, it is embedded shortly after.

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR naming each field that
        does not match the schema (or is not in it).

        Example: the request example creates the ticket "Printer offline" → 201 `{"id": "…", "name":
        "Printer offline", "fields": {…}, "version": 1, …}`"""
        record = records.create_record(db.session, current_tenant(), definitions.find_definition(entityName), data)
        return with_etag(records.record_to_wire(record), etag(record.version), 201)


@blp.route("/<string:entityName>/records/query", parameters=[ENTITY])
class RecordQuery(MethodView):
    @concurrency_limited("records")  # outermost: a refusal costs no body parsing
    @blp.arguments(QueryRequestSchema, example=ex.QUERY_EXAMPLE)
    @blp.response(200, PaginatedResultSchema)
    @blp.requires(READ)
    @may_be_rate_limited("similar")
    def post(self, data, entityName):
        """Query records

        Filters (`$eq`, `$ne`, `$gt`…, `$in`, `$contains`, `$or`, `$and`, `$not`), full-text `$search`,
        semantic `$similar` (with embeddings on), sorting, paging by `page` or by the previous page's
        `nextCursor`, `include`/`exclude` of fields and `includeLookups` of linked records.

        `Prefer: count=planned` (the planner's estimate, no counting scan) or `count=estimated` (exact up
        to ENTITY_COUNT_ESTIMATE_ABOVE matches, the estimate beyond) make `totalCount` approximate;
        `Preference-Applied: count=…` then says how it was counted. Without it, `totalCount` is exact.

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR naming the filter path
        of an unknown field or operator, or a `pageSize` above the maximum; 503 SERVICE_UNAVAILABLE when
        `$similar` needs an embedder that cannot be reached.

        Example: the request example finds high and normal tickets mentioning "printer", by due date →
        `{"records": [{"id": "…", "name": "Printer offline", "fields": {"title": …}}], "totalCount": 1,
        "currentPage": 1, "pageSize": 20, "totalPages": 1, "hasNextPage": false, …}`"""
        # reads only, no transaction needed: statements in autocommit (a `$similar` page too: its index
        # walk settings are then set at session level, app.entities.similar._walk_settings)
        db.reads_only()
        asked = _asked_count()
        result = query.query_records(entityName, data["query"], asked or "exact")
        return result, 200, _count_applied(result.pop("countMode"), asked)


@blp.route("/<string:entityName>/records/count", parameters=[ENTITY])
class RecordCount(MethodView):
    @concurrency_limited("records")
    @blp.arguments(CountRequestSchema, example=ex.COUNT_EXAMPLE)
    @blp.doc(responses={"200": {"description": "The number of matching records",
                                "content": {"application/json": {"schema": {"type": "integer"}}}}})
    @blp.requires(READ)
    @may_be_rate_limited("similar")
    def post(self, data, entityName):
        """Count records

        The number of records matching `filters` (the filter language of the query), as a bare JSON
        number. `Prefer: count=planned|estimated` as for the query.

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR naming the filter path.

        Example: the request example counts the high-priority tickets → `1`"""
        db.reads_only()
        asked = _asked_count()
        total, how = query.count_records(entityName, data.get("filters"), asked or "exact")
        return json_response(total, headers=_count_applied(how, asked))


@blp.route("/<string:entityName>/records/<string:recordId>", parameters=[ENTITY, RECORD])
class Record(MethodView):
    @blp.response(200, RecordSchema)
    @blp.requires(READ)
    @blp.conditional
    def get(self, entityName, recordId):
        """Get a record

        One record with its fields, tags, metadata and `version`.

        Errors: 404 NOT_FOUND for an unknown definition or record (a soft-deleted record, or one of
        another organization, is unknown too).

        Example: `GET /api/v1/entities/tickets/records/{recordId}` → `{"id": "…", "name": "Printer
        offline", "fields": {"title": "Printer offline", "priority": "high", …}, "version": 1, …}`"""
        record = reads.get_record(entityName, recordId)
        return tagged(record, etag(record["version"]))

    @blp.arguments(RecordInputSchema, example=ex.RECORD_UPDATE_EXAMPLE)
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def put(self, data, entityName, recordId):
        """Update a record

        `fields` are merged into the stored ones (a field set to null is removed) and the result is
        validated whole; the other named properties replace the stored ones; `version` is bumped. Send
        the `version` you read to be refused instead of overwriting someone else's change.

        Errors: 404 NOT_FOUND for an unknown definition or record; 409 CONFLICT for a stale `version`;
        400 VALIDATION_ERROR naming the fields that do not match the schema.

        Example: the request example lowers the priority and the estimate → `{"success": true}`."""
        record = records.update_record(db.session, current_tenant(), definitions.find_definition(entityName),
                                       recordId, data, if_match=if_match())
        return with_etag(SUCCESS, etag(record.version))

    @blp.arguments(RecordDeleteArgsSchema, location="query")
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    @blp.conditional
    def delete(self, args, entityName, recordId):
        """Delete a record

        Soft by default: the record is hidden from reads and its relationships are deactivated;
        `hardDelete=true` removes it and its relationships.

        Errors: 404 NOT_FOUND for an unknown definition or record.

        Example: `DELETE /api/v1/entities/tickets/records/{recordId}` → `{"success": true}`"""
        records.delete_record(db.session, current_tenant(), definitions.find_definition(entityName), recordId,
                              hard_delete=args["hardDelete"], if_match=if_match())
        return SUCCESS


# --- bulk -----------------------------------------------------------------------------------------

def _asked_count() -> str | None:
    """`count=exact|planned|estimated` from Prefer (PostgREST's names; the route counts exactly when
    None); anything else is ignored."""
    for token in preferences():
        name, _, value = token.partition("=")
        value = value.strip().strip('"')
        if name.strip() == "count" and value in query.COUNT_MODES:
            return value
    return None


def _count_applied(how: str, asked: str | None) -> dict[str, str]:
    """`Preference-Applied: count=<exact|planned|estimated>` when the caller stated a count preference
    (`asked`, from `_asked_count`): `exact` whenever the number is exact (also for `estimated` below the
    threshold)."""
    return {"Preference-Applied": f"count={how}"} if asked else {}


def _bulk(entityName: str, operation: str, items: list):
    definition = definitions.find_definition(entityName)
    if wants_async():
        job = bulk.start_job(db.session, current_tenant(), definition, operation, items)
        return accepted({"jobId": job.id}, f"/api/v1/jobs/{job.id}", respond_async=True)
    return bulk.run_bulk(db.session, current_tenant(), definition, operation, items)


def _bulk_route(operation: str, body_schema, key: str, summary: str, example: dict) -> None:
    """One bulk endpoint (`/records/bulk/<operation>`); the three differ only in body and operation."""

    class BulkView(MethodView):
        @blp.arguments(body_schema, example=example)
        @blp.response(200, BulkResultSchema)
        @blp.alt_response(202, schema=JobAcceptedSchema, description="With `Prefer: respond-async`")
        @blp.requires(WRITE)
        @rate_limited("bulk")
        @blp.idempotent
        def post(self, data, entityName):
            return _bulk(entityName, operation, data[key])

    BulkView.post.__doc__ = summary
    BulkView.__name__ = BulkView.__qualname__ = f"Bulk{operation.title()}"
    blp.route(f"/<string:entityName>/records/bulk/{operation}", parameters=[ENTITY])(BulkView)


_BULK_NOTES = """

        All or nothing: every item is checked first, and one invalid item refuses the request (400
        VALIDATION_ERROR listing the failing items by index in `details.records`). At most
        ENTITY_BULK_MAX_RECORDS items. With `Prefer: respond-async` it runs as a job instead: 202
        `{"jobId"}` and a `Location` to follow at GET /api/v1/jobs/{jobId}.

        Errors: 404 NOT_FOUND for an unknown definition; 400 as above; 429 RATE_LIMITED when the
        organization's bulk limit is spent.
"""
_bulk_route("create", BulkRecordsSchema, "records", """Create records in bulk

        Creates every record of `records` (partial records: `name`, `fields`, `tags`, …).""" + _BULK_NOTES + """
        Example: the request example creates two tickets → `{"message": "Created 2 records.", "count": 2}`""",
            ex.BULK_CREATE_EXAMPLE)
_bulk_route("update", BulkUpdateSchema, "records", """Update records in bulk

        Updates each record of `records` by its `id`, as PUT does (`fields` merge); each id at most
        once.""" + _BULK_NOTES + """
        Example: the request example (with the `id` of one of your records) lowers its priority →
        `{"message": "Updated 1 records.", "count": 1}`""", ex.BULK_UPDATE_EXAMPLE)
_bulk_route("delete", BulkDeleteSchema, "recordIds", """Delete records in bulk

        Soft-deletes the records of `recordIds`, each at most once.""" + _BULK_NOTES + """
        Example: the request example (with the `id` of one of your records) → `{"message": "Deleted 1
        records.", "count": 1}`""", ex.BULK_DELETE_EXAMPLE)


@jobs_blp.route("/<string:jobId>", parameters=[path_param(
    "jobId", "The `jobId` of a 202 answer of a bulk operation sent with `Prefer: respond-async`.")])
class Job(MethodView):
    @jobs_blp.response(200, JobSchema)
    @jobs_blp.requires(READ, WRITE)
    def get(self, jobId):
        """Status of an asynchronous job

        A bulk operation accepted with `Prefer: respond-async`: `status` pending, running, succeeded or
        failed, with its `result` (as the synchronous answer would have been) or its `error` (the
        envelope's `{code, message, details}`). Jobs of other organizations are unknown.

        Errors: 404 NOT_FOUND for an unknown job id.

        Example: `GET /api/v1/jobs/{jobId}` → `{"jobId": "…", "status": "succeeded", "operation": "delete",
        "entityName": "tickets", "result": {"message": "Deleted 1 records.", "count": 1}, "error": null, …}`"""
        return bulk.job_to_wire(bulk.get_job(jobId))


# --- relationships --------------------------------------------------------------------------------

@blp.route("/<string:entityName>/records/<string:recordId>/relationships", parameters=[ENTITY, RECORD])
class Relationships(MethodView):
    @blp.arguments(RelationshipListArgsSchema, location="query")
    @blp.response(200, RelationshipListSchema)
    @blp.requires(READ)
    def get(self, args, entityName, recordId):
        """List a record's relationships

        The record's active relationships: `direction` outgoing (from this record), incoming or both
        (default); optionally only one `relationshipType` or `targetEntity`.

        Errors: 404 NOT_FOUND for an unknown definition or record; 400 for another `direction`.

        Example: `GET /api/v1/entities/tickets/records/{recordId}/relationships?direction=outgoing` →
        `{"relationships": [{"id": "…", "fromEntityName": "tickets", "toEntityName": "tickets",
        "relationshipType": "duplicate-of", …}]}`"""
        found = relationships.list_relationships(
            definitions.find_definition(entityName), recordId, direction=args["direction"],
            relationship_type=args.get("relationshipType"), target_entity=args.get("targetEntity"))
        return {"relationships": found}

    @blp.arguments(RelationshipInputSchema, example=ex.RELATIONSHIP_EXAMPLE)
    @blp.response(201, RelationshipSchema)
    @blp.requires(WRITE)
    @blp.idempotent
    def post(self, data, entityName, recordId):
        """Create a relationship

        Links this record to another record of the organization (of any definition), with a
        `relationshipType` of your choosing and optional `fields` on the link.

        Errors: 404 NOT_FOUND for an unknown definition or record (this one or the target).

        Example: the request example (with the `id` of another ticket as `toRecordId`) marks this
        ticket a duplicate of it → 201 `{"id": "…", "fromRecordId": "…", "toRecordId": "…",
        "relationshipType": "duplicate-of", "isActive": true, …}`"""
        return relationships.create_relationship(db.session, current_tenant(), definitions.find_definition(entityName),
                                                recordId, data)


@blp.route("/<string:entityName>/records/<string:recordId>/relationships/<string:relationshipId>",
           parameters=[ENTITY, RECORD, RELATIONSHIP])
class Relationship(MethodView):
    @blp.response(200, SuccessSchema)
    @blp.requires(WRITE)
    def delete(self, entityName, recordId, relationshipId):
        """Delete a relationship

        Removes a relationship of this record.

        Errors: 404 NOT_FOUND for an unknown definition, record or relationship.

        Example: `DELETE /api/v1/entities/tickets/records/{recordId}/relationships/{relationshipId}` →
        `{"success": true}`"""
        relationships.delete_relationship(db.session, definitions.find_definition(entityName), recordId, relationshipId)
        return SUCCESS
