"""Wire shapes of analytics: the AnalyticsEvent body (camelCase) and the snake_case dashboard DTOs,
each wrapped as `{success, data, metadata?}` (every analytics answer has this wrapper)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, pre_load, validate, validates_schema

from app.fields import FastLoad, NulFree, QueryInt, clean_json_check, text
from app.jsonbody import json_bytes
from app.wire import parse_instant

MAX_PROPERTIES_BYTES = 32 * 1024
CHAT_DIRECTIONS = ("inbound", "outbound")
DATE_DOC = ("ISO 8601: a date (2026-11-01; a date-only `to` covers that whole UTC day) or an instant "
            "(2026-11-01T10:00:00Z, offsets and milliseconds allowed). Default: the last 30 days.")


def _finite_json(value: Any, path: str, errors: dict[str, list[str]]) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        errors.setdefault(path, []).append("Numbers must be finite.")
    elif isinstance(value, dict):
        for key, item in value.items():
            _finite_json(item, f"{path}.{key}", errors)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _finite_json(item, f"{path}[{index}]", errors)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


_CHAT_STRINGS = (("agentId", 256), ("agentName", 256), ("channel", 64), ("model", 256), ("service", 128))


def _chat_common_errors(props: dict[str, Any], bad: Callable[[str, str], None]) -> None:
    """What every chat-category event's properties must hold: the chat's id, its optional strings."""
    chat_id = props.get("chatId")
    if not isinstance(chat_id, str) or not 1 <= len(chat_id) <= 256:
        bad("chatId", "Required for chat events: a string of 1 to 256 characters.")
    for name, limit in _CHAT_STRINGS:
        value = props.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            bad(name, f"Must be a string of at most {limit} characters.")


def _message_errors(props: dict[str, Any], bad: Callable[[str, str], None]) -> None:
    if props.get("direction") is not None and props.get("direction") not in CHAT_DIRECTIONS:
        bad("direction", "Must be inbound or outbound.")
    for name in ("inputTokens", "outputTokens"):
        value = props.get(name)
        if value is not None and (not _is_int(value) or not 0 <= value <= 10**12):
            bad(name, "Must be a non-negative integer.")
    cost = props.get("cost")
    if cost is not None and (not _is_number(cost) or not 0 <= cost <= 10**9):
        bad("cost", "Must be a non-negative number.")


def _csat_errors(props: dict[str, Any], bad: Callable[[str, str], None]) -> None:
    score = props.get("score")
    if not _is_int(score) or not 1 <= score <= 5:
        bad("score", "Required for csat events: an integer from 1 to 5.")


# what a chat event of these types holds besides the common properties
_CHAT_TYPE_ERRORS = {"message": _message_errors, "csat": _csat_errors}


def chat_property_errors(event_type: str, props: dict[str, Any]) -> dict[str, list[str]]:
    """What a chat-category event's `properties` must hold."""
    errors: dict[str, list[str]] = {}

    def bad(name: str, message: str) -> None:
        errors.setdefault(f"properties.{name}", []).append(message)

    _chat_common_errors(props, bad)
    type_errors = _CHAT_TYPE_ERRORS.get(event_type)
    if type_errors is not None:
        type_errors(props, bad)
    return errors


EVENT_ID_PATTERN = re.compile(r"^[\x21-\x7e]+$")
CHAT_EVENT_TYPES = ("chat_started", "message", "chat_ended", "csat")


class AnalyticsEventSchema(NulFree, FastLoad):
    """AnalyticsEvent (camelCase). `orgId` is accepted and ignored: the token selects the org.
    Fields the DTO does not name are dropped (a newer client must not lose its events).
    `load` takes the fast lane derived from this schema (app.fields.FastLoad): the accept path's CPU."""

    class Meta:
        unknown = EXCLUDE

    @pre_load
    @clean_json_check
    def _refuse_lone_surrogates(self, data, **_):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("Text must be valid Unicode (no lone surrogate escapes).") from None
        except (TypeError, ValueError):
            pass  # not JSON-shaped: the fields report it
        return data

    sessionId = text(256, min_length=1, required=True)
    userId = text(256, min_length=1, required=True)
    eventType = text(128, min_length=1, required=True,
                     metadata={"example": "page_view"})
    eventCategory = text(128, min_length=1, required=True, metadata={"example": "navigation"})
    eventId = fields.String(allow_none=True, validate=[
        validate.Length(min=1, max=128),
        validate.Regexp(EVENT_ID_PATTERN, error="Printable ASCII without spaces.")],
                   metadata={"description": "Idempotency key per org; assigned by the server when absent."})
    orgId = fields.String(allow_none=True, metadata={"description": "Ignored: the token's org is used."})
    pagePath = text(2048, allow_none=True)
    timestamp = fields.String(allow_none=True, metadata={
        "description": "ISO 8601 instant (no offset = UTC); default: the time of receipt."})
    properties = fields.Dict(keys=fields.String(), allow_none=True, metadata={"description": (
        "At most 32 KB as JSON. Chat events (eventCategory `chat`) need `chatId`; `message` events take "
        "`direction`, `model`, `inputTokens`, `outputTokens`, `cost`; `csat` events a `score` of 1-5.")})

    @validates_schema
    def _check(self, data: dict[str, Any], **_: Any) -> None:
        errors: dict[str, list[str]] = {}
        if data.get("timestamp") is not None:
            try:
                parse_instant(data["timestamp"])
            except ValueError:
                errors["timestamp"] = ["Must be an ISO 8601 timestamp, e.g. 2026-11-23T10:00:00Z."]
        props = data.get("properties")
        if props is not None:
            try:  # the one measure of a JSON value's size (app.jsonbody); a non-finite number is named
                size = json_bytes(props, allow_nan=False)
            except ValueError:
                _finite_json(props, "properties", errors)
            else:
                if not errors and size > MAX_PROPERTIES_BYTES:
                    errors["properties"] = [f"At most {MAX_PROPERTIES_BYTES} bytes as JSON (got {size})."]
        if data.get("eventCategory") == "chat" and data.get("eventType") in CHAT_EVENT_TYPES:
            errors.update(chat_property_errors(data["eventType"], props or {}))
        if errors:
            raise ValidationError(errors)


MAX_BATCH = 500


class EventBatchSchema(FastLoad):
    """Several events in one request (an addition of ours, like PostHog's /batch): all valid, or none stored."""

    events = fields.List(fields.Nested(AnalyticsEventSchema), required=True,
                         validate=validate.Length(min=1, max=MAX_BATCH))


class BatchAcceptedSchema(Schema):
    success = fields.Boolean(required=True, metadata={"example": True})
    accepted = fields.Integer(required=True)
    eventIds = fields.List(fields.String(), required=True)


class DateFilterSchema(Schema):
    from_ = fields.String(data_key="from", metadata={"description": DATE_DOC})
    to = fields.String(metadata={"description": DATE_DOC})


class ChatsArgsSchema(DateFilterSchema):
    agent_id = fields.String(validate=validate.Length(min=1, max=256))
    limit = QueryInt(load_default=100, validate=validate.Range(min=1, max=1000))
    offset = QueryInt(load_default=0, validate=validate.Range(min=0, max=10_000_000))


class EventsArgsSchema(DateFilterSchema):
    eventType = fields.String(validate=validate.Length(min=1, max=128))
    eventCategory = fields.String(validate=validate.Length(min=1, max=128))
    userId = fields.String(validate=validate.Length(min=1, max=256))
    sessionId = fields.String(validate=validate.Length(min=1, max=256))
    limit = QueryInt(load_default=100, validate=validate.Range(min=1, max=1000))
    offset = QueryInt(load_default=0, validate=validate.Range(min=0, max=10_000_000))


class ChannelPathSchema(Schema):
    channel = fields.String(required=True, validate=validate.Length(min=1, max=64))


# --- DTOs (snake_case on the wire) -----------------------------------------------------------------

class AnalyticsSummarySchema(Schema):
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    unique_users = fields.Integer(required=True)
    avg_session_duration = fields.Float(required=True, metadata={"description": "seconds"})


class ChatAnalyticsSchema(Schema):
    chat_id = fields.String(required=True)
    agent_id = fields.String(required=True)
    user_id = fields.String(required=True)
    message_count = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    duration_secs = fields.Float(required=True)
    csat_score = fields.Float(allow_none=True)
    created_at = fields.String(required=True)


class AgentAnalyticsSchema(Schema):
    agent_id = fields.String(required=True)
    agent_name = fields.String(allow_none=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    avg_duration_secs = fields.Float(required=True)
    unique_users = fields.Integer(required=True)
    avg_csat = fields.Float(allow_none=True)


class UsageAnalyticsSchema(Schema):
    service = fields.String(required=True)
    model = fields.String(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    cost = fields.Float(required=True)
    request_count = fields.Integer(required=True)


class DailyAnalyticsSchema(Schema):
    date = fields.String(required=True, metadata={"example": "2026-11-23"})
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    unique_users = fields.Integer(required=True)


class AnalyticsEventOutSchema(Schema):
    eventId = fields.String(required=True)
    orgId = fields.String(required=True)
    sessionId = fields.String(required=True)
    userId = fields.String(required=True)
    eventType = fields.String(required=True)
    eventCategory = fields.String(required=True)
    pagePath = fields.String(allow_none=True)
    timestamp = fields.String(required=True)
    properties = fields.Dict(allow_none=True)


class GlobalAnalyticsSummarySchema(Schema):
    total_orgs = fields.Integer(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    total_users = fields.Integer(required=True)


class OrgAnalyticsSchema(Schema):
    org_id = fields.String(required=True)
    org_name = fields.String(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    unique_users = fields.Integer(required=True)


class GlobalChannelSummarySchema(Schema):
    channel = fields.String(required=True)
    total_orgs = fields.Integer(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    inbound_messages = fields.Integer(required=True)
    total_users = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)
    avg_messages_per_chat = fields.Float(required=True)


class ChannelDailySchema(Schema):
    date = fields.String(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    unique_users = fields.Integer(required=True)


class OrgChannelAnalyticsSchema(Schema):
    org_id = fields.String(required=True)
    org_name = fields.String(required=True)
    total_chats = fields.Integer(required=True)
    total_messages = fields.Integer(required=True)
    unique_users = fields.Integer(required=True)
    total_tokens = fields.Integer(required=True)
    total_cost = fields.Float(required=True)


class AcceptedSchema(Schema):
    success = fields.Boolean(required=True, metadata={"example": True})
    eventId = fields.String(metadata={"description": "The stored (or server-assigned) eventId."})


def wrapper(dto: type[Schema], many: bool = False) -> type[Schema]:
    """`<DTO>Response`: `{success, data, metadata?}`."""
    name = dto.__name__.removesuffix("Schema") + ("ListResponse" if many else "Response")
    return type(name, (Schema,), {
        "success": fields.Boolean(required=True, metadata={"example": True}),
        "data": fields.List(fields.Nested(dto), required=True) if many else fields.Nested(dto, required=True),
        "metadata": fields.Dict(metadata={"description": "The resolved window (from, to) and paging."}),
    })


# Request examples (OpenAPI): a page view, and a batch of a page view and a click, without `eventId` (the
# server assigns one) nor `timestamp` (the time of receipt).
EVENT_EXAMPLE = {"sessionId": "sess-42", "userId": "user-7", "eventType": "page_view", "eventCategory": "navigation",
                 "pagePath": "/pricing", "properties": {"referrer": "newsletter"}}
EVENT_BATCH_EXAMPLE = {"events": [EVENT_EXAMPLE, {**EVENT_EXAMPLE, "eventType": "click",
                                                  "properties": {"element": "start-trial"}}]}
