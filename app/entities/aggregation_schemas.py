"""Wire shapes of record aggregation: AggregateRequest, AggregateField, AggregateResponse (the names clients use)."""

from __future__ import annotations

from marshmallow import RAISE, Schema, validate
from marshmallow import fields as ma

from app.entities.schemas import AnyJson, SortOrderField
from app.fields import StrictFloat, StrictInt

FUNCTIONS = ("count", "sum", "avg", "min", "max", "distinct_count", "percentile")  # the aggregation service's


class AggregateFieldSchema(Schema):
    class Meta:
        unknown = RAISE

    OPENAPI_EXTRA = {"allOf": [  # every function but count needs a field; only percentile takes (and needs) one
        {"anyOf": [{"properties": {"function": {"enum": ["count"]}}},
                   {"required": ["field"], "properties": {"field": {"type": "string"}}}]},
        {"anyOf": [{"properties": {"function": {"enum": [f for f in FUNCTIONS if f != "percentile"]},
                                   "percentile": {"enum": [None]}}},
                   {"required": ["percentile"], "properties": {"function": {"enum": ["percentile"]},
                                                               "percentile": {"type": "number"}}}]}]}

    field = ma.String(allow_none=True, metadata={"description": "record field or system column; optional for "
                                                                "count (then it counts records)"})
    function = ma.String(required=True, validate=validate.OneOf(FUNCTIONS))
    alias = ma.String(allow_none=True, metadata={"description": "default `<function>_<field>`; `count` alone → "
                                                                "`count`; unique within the request (explicit "
                                                                "or default)"})
    percentile = StrictFloat(allow_none=True,  # a JSON number: "0.9" (a string) is refused
                             metadata={"description": "required for percentile: a fraction (0.9) or a percent (90)",
                                       "minimum": 0, "maximum": 100})


class AggregateRequestSchema(Schema):
    class Meta:
        unknown = RAISE

    filters = ma.Dict(load_default=dict, allow_none=True, metadata={"description": "the filter language of /query"})
    groupBy = ma.List(ma.String(metadata={"minLength": 1}), load_default=list, allow_none=True,
                      metadata={"description": "fields or system columns; date/datetime may end with "
                                               ":hour|:day|:week|:month|:quarter|:year"})
    aggregates = ma.List(ma.Nested(AggregateFieldSchema), required=True, validate=validate.Length(min=1))
    having = ma.Dict(allow_none=True, metadata={"description": "filter-language comparisons keyed by alias"})
    sortBy = ma.String(allow_none=True, metadata={"description": "a group or aggregate alias, or `count`"})
    sortOrder = SortOrderField(allow_none=True)
    # 1..ENTITY_AGGREGATE_MAX_GROUPS is checked by plan_aggregate (one message naming both bounds)
    limit = StrictInt(allow_none=True, metadata={"description": "most groups returned (default and maximum: "
                                                                "ENTITY_AGGREGATE_MAX_GROUPS, default 1000)",
                                                 "minimum": 1, "maximum_setting": "ENTITY_AGGREGATE_MAX_GROUPS"})
    timezone = ma.String(allow_none=True, metadata={"description": "IANA zone the date buckets are cut in "
                                                                   "(default UTC)"})


class AggregateGroupSchema(Schema):
    key = ma.Dict(required=True, metadata={"description": "group alias → value"})
    values = ma.Dict(keys=ma.String(), values=AnyJson(), required=True,
                     metadata={"description": "aggregate alias → value (null when nothing was aggregated)"})
    count = ma.Integer(required=True, metadata={"description": "records in the group"})


class AggregateMetadataSchema(Schema):
    truncated = ma.Boolean(required=True, metadata={"description": "more groups matched than `limit`"})
    limit = ma.Integer(required=True)
    totalCount = ma.Integer(required=True, metadata={"description": "records matched by the filters"})


class AggregateResponseSchema(Schema):
    groups = ma.List(ma.Nested(AggregateGroupSchema), required=True)
    totals = ma.Dict(keys=ma.String(), values=AnyJson(),
                     metadata={"description": "the aggregates over all matched records"})
    metadata = ma.Nested(AggregateMetadataSchema)


# The request example (OpenAPI): hours of work per priority of the `tickets` example definition
# (app.entities.schemas), largest first, plus the overall totals.
AGGREGATE_EXAMPLE = {"filters": {"priority": {"$ne": "low"}}, "groupBy": ["priority"],
                     "aggregates": [{"function": "count"}, {"function": "sum", "field": "estimate", "alias": "hours"}],
                     "sortBy": "hours", "sortOrder": -1, "limit": 10}
