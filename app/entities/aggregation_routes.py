"""HTTP route of record aggregation (registered through `app.entities.routes.blueprints`)."""

from __future__ import annotations

from flask.views import MethodView

from app.entities import aggregation
from app.entities.aggregation_schemas import AGGREGATE_EXAMPLE, AggregateRequestSchema, AggregateResponseSchema
from app.entities.schemas import EXAMPLE_ENTITY
from app.entities.services import definitions
from app.extensions import Blueprint, path_param
from app.ratelimit import concurrency_limited, rate_limited

blp = Blueprint("entity_aggregation", __name__, url_prefix="/api/v1/entities", tag="Entity aggregation",
                description="Entity store: record aggregation")


@blp.route("/<string:entityName>/records/aggregate", parameters=[path_param(
    "entityName", "The definition's `name` (the examples create `tickets`).", EXAMPLE_ENTITY)])
class RecordAggregate(MethodView):
    @concurrency_limited("records")  # outermost: a refusal costs no body parsing
    @blp.arguments(AggregateRequestSchema, example=AGGREGATE_EXAMPLE)
    @blp.response(200, AggregateResponseSchema)
    @blp.requires("read:entities")
    @rate_limited("aggregate")
    def post(self, data, entityName):
        """Aggregate records

        Groups the records matching `filters` by fields (`groupBy`; a date field with a bucket such as
        `created_at:week`, cut in `timezone`; a multiselect gives one group per value) and computes
        `aggregates` (count, sum, avg, min, max, distinct_count, percentile) per group and over all
        (`totals`). `having` filters groups by an aggregate's alias; `sortBy` orders by a group or an
        alias; `limit` caps the groups (`metadata.truncated` says more matched).

        Errors: 404 NOT_FOUND for an unknown definition; 400 VALIDATION_ERROR for a field the
        definition lacks, a function that does not fit the field's type (sum of a text), an unknown
        alias in `sortBy`/`having`, an unknown time zone; 429 RATE_LIMITED when the organization's
        aggregate limit is spent.

        Example: the request example sums the estimated hours of tickets per priority →
        `{"groups": [{"key": {"priority": "high"}, "count": 1, "values": {"count": 1, "hours": 2.5}}],
        "totals": {"count": 1, "hours": 2.5}, "metadata": {"truncated": false, "limit": 10, "totalCount": 1}}`"""
        return aggregation.aggregate_records(definitions.find_definition(entityName), data)
