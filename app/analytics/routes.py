"""HTTP routes of analytics (thin: parse, call a service, wrap as `{success, data, metadata}`)."""

from __future__ import annotations

from flask.views import MethodView

from app.analytics import series, services, tasks
from app.analytics.schemas import (
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
from app.extensions import Blueprint
from app.tenancy import current_tenant
from app.wire import accepted, response_wrapper

READ = ("read:analytics",)  # generic `read` satisfies it (app.auth.scope_satisfies)
ADMIN = ("admin", "super_admin")  # or scope `*`

blp = Blueprint("analytics", __name__, url_prefix="/api/v1/analytics",
                description="Analytics: event ingest, per-org dashboards, global and per-channel roll-ups")


def _window(args):
    return services.resolve_window(args.get("from_"), args.get("to"))


def _ok(data, window=None, **extra):
    return response_wrapper(data, {**(window.metadata() if window else {}), **extra})


def _page(args, has_more: bool) -> dict:
    return {"limit": args["limit"], "offset": args["offset"], "hasMore": has_more}


@blp.route("/events")
class Events(MethodView):
    @blp.arguments(AnalyticsEventSchema())  # an instance: a class is instantiated per request (measured)
    @blp.response(202, AcceptedSchema)
    def post(self, data):
        """Record an event (any valid token). Answers 202 at once; a worker of the `analytics` queue
        stores it in a batch. Idempotent per org by `eventId` (assigned when absent); `orgId` in the
        body is ignored. Chat facts: `eventCategory` `chat`."""
        event = services.normalise_event(data, current_tenant())
        tasks.submit_many([event])
        return accepted({"success": True, "eventId": event["event_id"]})

    @blp.arguments(EventsArgsSchema, location="query")
    @blp.response(200, wrapper(AnalyticsEventOutSchema, many=True))
    @blp.requires(*READ)
    def get(self, args):
        """Recorded events of the caller's org in the window, newest first (`limit` ≤ 1000, `offset`;
        optional `eventType`, `eventCategory`, `userId`, `sessionId`)."""
        window = _window(args)
        found, more = services.events(current_tenant().org_id, window, args, args["limit"], args["offset"])
        return _ok(found, window, **_page(args, more))


@blp.route("/events/batch", methods=["POST"])
@blp.arguments(EventBatchSchema())
@blp.response(202, BatchAcceptedSchema)
def post_batch(data):
    """Record up to 500 events in one request (`{events: [AnalyticsEvent…]}`, any valid token): every
    event is validated first and one invalid event rejects the request (400, details by index)."""
    tenant = current_tenant()
    events = [services.normalise_event(body, tenant) for body in data["events"]]
    tasks.submit_many(events)
    return accepted({"success": True, "accepted": len(events), "eventIds": [e["event_id"] for e in events]})


@blp.route("/summary")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(AnalyticsSummarySchema))
@blp.requires(*READ)
def summary(args):
    """AnalyticsSummary of the caller's org (durations in seconds)."""
    window = _window(args)
    return _ok(services.summary(current_tenant().org_id, window), window)


@blp.route("/chats")
@blp.arguments(ChatsArgsSchema, location="query")
@blp.response(200, wrapper(ChatAnalyticsSchema, many=True))
@blp.requires(*READ)
def chats(args):
    """Chats that started in the window, newest first (optional `agent_id`; `limit` ≤ 1000, `offset`)."""
    window = _window(args)
    found, more = services.chats(current_tenant().org_id, window, args.get("agent_id"), args["limit"],
                                 args["offset"])
    return _ok(found, window, **_page(args, more))


@blp.route("/agents")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(AgentAnalyticsSchema, many=True))
@blp.requires(*READ)
def agents(args):
    """AgentAnalytics per agent of the caller's org."""
    window = _window(args)
    return _ok(services.agents(current_tenant().org_id, window), window)


@blp.route("/usage")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(UsageAnalyticsSchema, many=True))
@blp.requires(*READ)
def usage(args):
    """UsageAnalytics per service and model (chat messages, and image calls as service `image-gen`)."""
    window = _window(args)
    return _ok(services.usage(current_tenant().org_id, window), window)


@blp.route("/daily")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(DailyAnalyticsSchema, many=True))
@blp.requires(*READ)
def daily(args):
    """DailyAnalytics: one row per UTC day of the window (zeros for quiet days)."""
    window = _window(args)
    return _ok(services.daily(current_tenant().org_id, window), window)


@blp.route("/global/summary")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(GlobalAnalyticsSummarySchema))
@blp.requires(roles=ADMIN)
def global_summary(args):
    """GlobalAnalyticsSummary over every org of the token's product (role admin/super_admin or `*`)."""
    window = _window(args)
    return _ok(services.global_summary(window), window)


@blp.route("/global/orgs")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(OrgAnalyticsSchema, many=True))
@blp.requires(roles=ADMIN)
def global_orgs(args):
    """OrgAnalytics per org of the token's product (admin only)."""
    window = _window(args)
    return _ok(services.global_orgs(window), window)


@blp.route("/global/channels")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(GlobalChannelSummarySchema, many=True))
@blp.requires(roles=ADMIN)
def global_channels(args):
    """GlobalChannelSummary per channel over every org of the product (admin only)."""
    window = _window(args)
    return _ok(services.global_channels(window), window)


def _channel(channel: str) -> str:
    if not channel or len(channel) > 64 or "\x00" in channel:
        raise InvalidInput("'channel' must be 1 to 64 characters.")
    return channel


@blp.route("/global/channels/<string:channel>/daily")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(ChannelDailySchema, many=True))
@blp.requires(roles=ADMIN)
def channel_daily(args, channel):
    """ChannelDaily for one channel, one row per UTC day (admin only)."""
    window = _window(args)
    return _ok(services.channel_daily(_channel(channel), window), window)


@blp.route("/global/channels/<string:channel>/orgs")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(OrgChannelAnalyticsSchema, many=True))
@blp.requires(roles=ADMIN)
def channel_orgs(args, channel):
    """OrgChannelAnalytics per org for one channel (admin only)."""
    window = _window(args)
    return _ok(services.channel_orgs(_channel(channel), window), window)


# --- beyond the spec: time series and the org's channels (app.analytics.series) ---------------------

SERIES_RESPONSE = wrapper(AnalyticsSeriesSchema)


@blp.route("/series")
@blp.arguments(SeriesArgsSchema, location="query")
@blp.response(200, SERIES_RESPONSE)
@blp.requires(*READ)
def org_series(args):
    """Every metric of the caller's org per `day`, `week` or `month` bucket in time zone `tz`, with the
    window's totals; optional `agent_id`, `channel`, `model` filters."""
    window = _window(args)
    return _ok(series.series(window, args["interval"], args["tz"], org=current_tenant().org_id,
                             agent=args.get("agent_id"), channel=args.get("channel"), model=args.get("model")),
               window)


@blp.route("/channels")
@blp.arguments(DateFilterSchema, location="query")
@blp.response(200, wrapper(ChannelAnalyticsSchema, many=True))
@blp.requires(*READ)
def org_channels(args):
    """Per channel of the caller's org: chats, messages, users, tokens, cost."""
    window = _window(args)
    return _ok(series.channels(current_tenant().org_id, window), window)


@blp.route("/global/series")
@blp.arguments(GlobalSeriesArgsSchema, location="query")
@blp.response(200, SERIES_RESPONSE)
@blp.requires(roles=ADMIN)
def global_series(args):
    """The series over every org of the product (admin only); optional `org_id`, `agent_id`,
    `channel`, `model` filters. Users count per org, as in the global summary."""
    window = _window(args)
    channel = _channel(args["channel"]) if args.get("channel") else None
    return _ok(series.series(window, args["interval"], args["tz"], org=args.get("org_id"),
                             agent=args.get("agent_id"), channel=channel, model=args.get("model")), window)
