"""Wire shapes of the analytics time series and the org's channel breakdown (app.analytics.series)."""

from __future__ import annotations

import functools
import zoneinfo

from marshmallow import Schema, ValidationError, fields, validate

from app.analytics.schemas import DateFilterSchema

_DIMENSION = validate.Length(min=1, max=256)


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}


def _zone(name: str) -> None:
    if len(name) > 64 or name not in _zones():
        raise ValidationError("Unknown time zone: use an IANA name such as UTC or Europe/Berlin.")


class SeriesArgsSchema(DateFilterSchema):
    interval = fields.String(load_default="day", validate=validate.OneOf(("day", "week", "month")),
                             metadata={"description": "Bucket size: `day`, `week` (ISO, from Monday) or `month`."})
    tz = fields.String(load_default="UTC", validate=_zone,
                       metadata={"description": "IANA time zone of the buckets (default UTC)."})
    agent_id = fields.String(validate=_DIMENSION, metadata={"description": "Only this agent's chats."})
    channel = fields.String(validate=validate.Length(min=1, max=64),
                            metadata={"description": "Only this channel's chats."})
    model = fields.String(validate=_DIMENSION, metadata={
        "description": "Only this model's messages and image calls (chat counts, sessions and CSAT are "
                       "then null: a chat is not one model's)."})


class GlobalSeriesArgsSchema(SeriesArgsSchema):
    org_id = fields.String(validate=validate.Length(min=1, max=128), metadata={"description": "Only this org."})


class SeriesPointSchema(Schema):
    total_chats = fields.Integer(allow_none=True, required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    unique_users = fields.Integer(required=True)
    avg_session_duration = fields.Float(allow_none=True, required=True, metadata={"description": "seconds"})
    avg_csat = fields.Float(allow_none=True, required=True, metadata={"description": "1-5; null without answers"})
    csat_responses = fields.Integer(allow_none=True, required=True)


class SeriesBucketSchema(SeriesPointSchema):
    period = fields.String(required=True, metadata={"description": "Local start date of the bucket."})
    complete = fields.Boolean(required=True, metadata={
        "description": "False for a bucket cut by the window's edges or not over yet."})


class AnalyticsSeriesSchema(Schema):
    interval = fields.String(required=True)
    timezone = fields.String(required=True)
    totals = fields.Nested(SeriesPointSchema, required=True)
    points = fields.List(fields.Nested(SeriesBucketSchema), required=True)


class ChannelAnalyticsSchema(Schema):
    channel = fields.String(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    inbound_messages = fields.Integer(required=True)
    unique_users = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    avg_messages_per_chat = fields.Float(required=True)
