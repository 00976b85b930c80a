"""HTTP route of record aggregation (registered through `app.entities.routes.blueprints`)."""

from __future__ import annotations

from flask.views import MethodView

from app.entities import aggregation
from app.entities.aggregation_schemas import AggregateRequestSchema, AggregateResponseSchema
from app.entities.services import definitions
from app.extensions import Blueprint
from app.ratelimit import concurrency_limited, rate_limited

blp = Blueprint("entity_aggregation", __name__, url_prefix="/api/v1/entities",
                description="Entity store: record aggregation")


@blp.route("/<string:entityName>/records/aggregate")
class RecordAggregate(MethodView):
    @concurrency_limited("records")  # outermost: a refusal costs no body parsing
    @blp.arguments(AggregateRequestSchema)
    @blp.response(200, AggregateResponseSchema)
    @blp.requires("read:entities")
    @rate_limited("aggregate")
    def post(self, data, entityName):
        """Aggregate records: groupBy (date buckets), count/sum/avg/min/max/distinct_count/percentile, having."""
        return aggregation.aggregate_records(definitions.find_definition(entityName), data)
