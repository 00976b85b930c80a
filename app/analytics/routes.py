"""HTTP routes of analytics (thin: parse, call a service, wrap as `{success, data, metadata}`)."""

from __future__ import annotations

from flask.views import MethodView

from app.analytics import series, services, tasks
from app.analytics.schemas import (
    EVENT_BATCH_EXAMPLE,
    EVENT_EXAMPLE,
    AcceptedSchema,
    AgentAnalyticsSchema,
    AnalyticsEventOutSchema,
    AnalyticsEventSchema,
    AnalyticsSummarySchema,
    BatchAcceptedSchema,
    ChannelDailySchema,
    ChatAnalyticsSchema,
    ChatsArgsSchema,
    DailyAnalyticsSchema,
    DateFilterSchema,
    EventBatchSchema,
    EventsArgsSchema,
    GlobalAnalyticsSummarySchema,
    GlobalChannelSummarySchema,
    OrgAnalyticsSchema,
    OrgChannelAnalyticsSchema,
    UsageAnalyticsSchema,
    wrapper,
)
from app.analytics.series_schemas import (
    AnalyticsSeriesSchema,
    ChannelAnalyticsSchema,
    GlobalSeriesArgsSchema,
    SeriesArgsSchema,
)
from app.errors import InvalidInput
from app.extensions import Blueprint, path_param
from app.ratelimit import concurrency_limited
from app.tenancy import current_tenant
from app.wire import accepted, response_wrapper

READ = ("read:analytics",)  # generic `read` satisfies it (app.auth.scope_satisfies)
ADMIN = ("admin", "super_admin")  # or scope `*`

blp = Blueprint("analytics", __name__, url_prefix="/api/v1/analytics", tag="Analytics",
                description="Analytics: event ingest, per-org dashboards, global and per-channel roll-ups")
CHANNEL = path_param("channel", "A chat channel, as chat events name it (`web`, `whatsapp`, …).", "web")



def _window(args):
    return services.resolve_window(args.get("from_"), args.get("to"))


def _ok(data, window=None, **extra):
    return response_wrapper(data, {**(window.metadata() if window else {}), **extra})


def _page(args, has_more: bool) -> dict:
    return {"limit": args["limit"], "offset": args["offset"], "hasMore": has_more}


@blp.route("/events")
class Events(MethodView):
    @concurrency_limited("ingest")  # outermost: a refusal costs no body parsing
    # an instance: a class is instantiated per request (measured)
    @blp.arguments(AnalyticsEventSchema(), example=EVENT_EXAMPLE)
    @blp.response(202, AcceptedSchema)
    def post(self, data):
        """Record an event

        Any valid token may record. Answers 202 at once; a worker of the `analytics` queue stores it in
        a batch. Idempotent per organization by `eventId` (assigned when absent); `orgId` in the body is
        ignored (the token's organization is used). Chat facts use `eventCategory` `chat` and feed the
        chat, agent, usage and channel roll-ups.

        Errors: 400 VALIDATION_ERROR naming the field (a `timestamp` that is not ISO 8601, `properties`
        above 32 KB, a chat event without `chatId`, a `csat` score outside 1–5).

        Example: the request example records a page view of /pricing → 202 `{"success": true, "eventId":
        "…"}`"""
        event = services.normalise_event(data, current_tenant())
        tasks.submit_many([event])
        return accepted({"success": True, "eventId": event["event_id"]})

    @blp.arguments(EventsArgsSchema, location="query")
    @blp.response(200, wrapper(AnalyticsEventOutSchema, many=True))
    @blp.requires(*READ)
    def get(self, args):
        """List recorded events

        The organization's stored events in the window, newest first; optionally only one
        `eventType`, `eventCategory`, `userId` or `sessionId`; paged by `limit` (at most 1000) and
        `offset` (`metadata.hasMore`). Events are stored by a worker shortly after they are accepted.

        Errors: 400 VALIDATION_ERROR for a malformed `from`/`to` or a `limit` out of range.

        Example: `GET /api/v1/analytics/events?eventType=page_view&limit=50` → `{"success": true, "data":
        [{"eventId": "…", "eventType": "page_view", "pagePath": "/pricing", …}], "metadata": {"limit": 50,
        "offset": 0, "hasMore": false, …}}`"""
        window = _window(args)
        found, more = services.events(current_tenant().org_id, window, args, args["limit"], args["offset"])
        return _ok(found, window, **_page(args, more))


@blp.route("/events/batch", methods=["POST"])
@concurrency_limited("ingest")
@blp.arguments(EventBatchSchema(), example=EVENT_BATCH_EXAMPLE)
@blp.response(202, BatchAcceptedSchema)
def post_batch(data):
    """Record events in a batch

    Up to 500 events in one request (`{events: [AnalyticsEvent…]}`, any valid token), stored like
    single events. Every event is validated first: one invalid event refuses the whole request.

    Errors: 400 VALIDATION_ERROR with the failing events by index (`details.fields.events.<i>`); more
    than 500 events.

    Example: the request example records two events → 202 `{"success": true, "accepted": 2, "eventIds":
    ["…", "…"]}`"""
    tenant = current_tenant()
    events = [services.normalise_event(body, tenant) for body in data["events"]]
    tasks.submit_many(events)
    return accepted({"success": True, "accepted": len(events), "eventIds": [e["event_id"] for e in events]})


@blp.route("/summary")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(AnalyticsSummarySchema))
@blp.requires(*READ)
def summary(args):
    """Organization summary

    AnalyticsSummary of the caller's organization in the window: chats, messages, users, average
    chat duration (seconds), CSAT, tokens and cost.

    Errors: 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/summary?from=2026-11-01&to=2026-11-30` → `{"success": true, "data":
    {"total_chats": 120, "total_messages": 940, "unique_users": 85, "avg_session_duration": 312.5, …},
    "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.summary(current_tenant().org_id, window), window)


@blp.route("/chats")
@blp.arguments(ChatsArgsSchema, location="query")
@blp.response(200, wrapper(ChatAnalyticsSchema, many=True))
@blp.requires(*READ)
def chats(args):
    """List chats

    Chats of the organization that started in the window, newest first, with their message counts,
    duration, tokens and CSAT; optionally of one `agent_id`; paged by `limit` (at most 1000) and
    `offset`.

    Errors: 400 VALIDATION_ERROR for a malformed window or a `limit` out of range.

    Example: `GET /api/v1/analytics/chats?limit=20` → `{"success": true, "data": [{"chat_id": "…",
    "agent_id": "…", "message_count": 8, "duration_secs": 240, …}], "metadata": {"limit": 20, "offset": 0,
    "hasMore": false, …}}`"""
    window = _window(args)
    found, more = services.chats(current_tenant().org_id, window, args.get("agent_id"), args["limit"],
                                 args["offset"])
    return _ok(found, window, **_page(args, more))


@blp.route("/agents")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(AgentAnalyticsSchema, many=True))
@blp.requires(*READ)
def agents(args):
    """Per-agent analytics

    AgentAnalytics for each agent of the organization that chatted in the window: chats, messages,
    tokens, cost, CSAT.

    Errors: 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/agents` → `{"success": true, "data": [{"agent_id": "…", "agent_name":
    "order-help", "total_chats": 40, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.agents(current_tenant().org_id, window), window)


@blp.route("/usage")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(UsageAnalyticsSchema, many=True))
@blp.requires(*READ)
def usage(args):
    """Usage per service and model

    UsageAnalytics per service and model in the window: chat messages, and image generation calls
    as service `image-gen`, with their tokens and cost.

    Errors: 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/usage` → `{"success": true, "data": [{"service": "image-gen", "model":
    "gpt-image-1", "request_count": 3, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.usage(current_tenant().org_id, window), window)


@blp.route("/daily")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(DailyAnalyticsSchema, many=True))
@blp.requires(*READ)
def daily(args):
    """Daily analytics

    DailyAnalytics of the organization: one row per UTC day of the window, zeros for quiet days.

    Errors: 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/daily?from=2026-11-01&to=2026-11-07` → `{"success": true, "data":
    [{"date": "2026-11-01", "total_chats": 0, …}, …], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.daily(current_tenant().org_id, window), window)


@blp.route("/global/summary")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(GlobalAnalyticsSummarySchema))
@blp.requires(roles=ADMIN)
def global_summary(args):
    """Platform summary

    GlobalAnalyticsSummary over every organization of the token's product in the window. Needs role
    admin or super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/global/summary` → `{"success": true, "data": {"total_orgs": 12,
    "total_chats": 3400, …}, "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.global_summary(window), window)


@blp.route("/global/orgs")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(OrgAnalyticsSchema, many=True))
@blp.requires(roles=ADMIN)
def global_orgs(args):
    """Per-organization analytics

    OrgAnalytics for each organization of the token's product in the window. Needs role admin or
    super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/global/orgs` → `{"success": true, "data": [{"org_id": "acme.com",
    "total_chats": 120, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.global_orgs(window), window)


@blp.route("/global/channels")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(GlobalChannelSummarySchema, many=True))
@blp.requires(roles=ADMIN)
def global_channels(args):
    """Per-channel summary

    GlobalChannelSummary for each chat channel over every organization of the product in the
    window. Needs role admin or super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/global/channels` → `{"success": true, "data": [{"channel": "web",
    "total_chats": 2100, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.global_channels(window), window)


def _channel(channel: str) -> str:
    if not channel or len(channel) > 64 or "\x00" in channel:
        raise InvalidInput("'channel' must be 1 to 64 characters.")
    return channel


@blp.route("/global/channels/<string:channel>/daily", parameters=[CHANNEL])
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(ChannelDailySchema, many=True))
@blp.requires(roles=ADMIN)
def channel_daily(args, channel):
    """Daily analytics of a channel

    ChannelDaily for one chat channel over every organization of the product: one row per UTC day
    of the window. Needs role admin or super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 for a channel name over 64 characters or a malformed window.

    Example: `GET /api/v1/analytics/global/channels/web/daily` → `{"success": true, "data": [{"date":
    "2026-11-01", "total_chats": 70, …}, …], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.channel_daily(_channel(channel), window), window)


@blp.route("/global/channels/<string:channel>/orgs", parameters=[CHANNEL])
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(OrgChannelAnalyticsSchema, many=True))
@blp.requires(roles=ADMIN)
def channel_orgs(args, channel):
    """Per-organization analytics of a channel

    OrgChannelAnalytics for each organization of the product that used the chat channel in the
    window. Needs role admin or super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 for a channel name over 64 characters or a malformed window.

    Example: `GET /api/v1/analytics/global/channels/web/orgs` → `{"success": true, "data": [{"org_id":
    "acme.com", "total_chats": 80, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(services.channel_orgs(_channel(channel), window), window)


# --- beyond the spec: time series and the org's channels (app.analytics.series) ---------------------

SERIES_RESPONSE = wrapper(AnalyticsSeriesSchema)


@blp.route("/series")
@blp.arguments(SeriesArgsSchema, location="query")
@blp.response(200, SERIES_RESPONSE)
@blp.requires(*READ)
def org_series(args):
    """Time series of the organization

    Every metric of the caller's organization (chats, messages, tokens, cost, users, session length,
    CSAT) per `interval` bucket (`day`, ISO `week` from Monday, or `month`) in the IANA time zone `tz`
    (default UTC), with the window's totals; quiet buckets are zeros, and a bucket cut by the window's
    edges or not over yet has `complete: false`. Optionally only one `agent_id`, `channel` or `model`
    (with `model`, the per-chat figures are null: a chat is not one model's).

    Errors: 400 VALIDATION_ERROR for another `interval`, an unknown `tz`, an empty filter or a malformed
    window.

    Example: `GET /api/v1/analytics/series?interval=week&tz=Europe/Berlin` → `{"success": true, "data":
    {"interval": "week", "timezone": "Europe/Berlin", "totals": {"total_chats": 42, …}, "points":
    [{"period": "2026-10-26", "complete": false, "total_chats": 5, …}, …]}, "metadata": {…}}`"""
    window = _window(args)
    return _ok(series.series(window, args["interval"], args["tz"], org=current_tenant().org_id,
                             agent=args.get("agent_id"), channel=args.get("channel"), model=args.get("model")),
               window)


@blp.route("/channels")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(ChannelAnalyticsSchema, many=True))
@blp.requires(*READ)
def org_channels(args):
    """Per-channel analytics of the organization

    ChannelAnalytics for each chat channel the caller's organization used in the window: chats,
    messages (and inbound ones), users, tokens, cost and messages per chat, busiest channel first.

    Errors: 400 VALIDATION_ERROR for a malformed window.

    Example: `GET /api/v1/analytics/channels` → `{"success": true, "data": [{"channel": "web",
    "total_chats": 80, "total_messages": 640, "avg_messages_per_chat": 8.0, …}], "metadata": {…}}`"""
    window = _window(args)
    return _ok(series.channels(current_tenant().org_id, window), window)


@blp.route("/global/series")
@blp.arguments(GlobalSeriesArgsSchema, location="query")
@blp.response(200, SERIES_RESPONSE)
@blp.requires(roles=ADMIN)
def global_series(args):
    """Platform time series

    The time series of `GET /api/v1/analytics/series` over every organization of the token's product
    (users count per organization, as in the platform summary); optionally only one `org_id`,
    `agent_id`, `channel` or `model`. Needs role admin or super_admin (or scope `*`).

    Errors: 403 FORBIDDEN without it; 400 VALIDATION_ERROR for another `interval`, an unknown `tz`, an
    empty filter or a malformed window.

    Example: `GET /api/v1/analytics/global/series?interval=month` → `{"success": true, "data":
    {"interval": "month", "timezone": "UTC", "totals": {"total_chats": 3400, …}, "points": [{"period":
    "2026-11-01", "complete": false, …}, …]}, "metadata": {…}}`"""
    window = _window(args)
    channel = _channel(args["channel"]) if args.get("channel") else None
    return _ok(series.series(window, args["interval"], args["tz"], org=args.get("org_id"),
                             agent=args.get("agent_id"), channel=channel, model=args.get("model")), window)
