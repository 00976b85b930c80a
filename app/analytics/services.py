"""Analytics services: event normalisation, the batch writer, the date window and the dashboards.

The dashboards tolerate lag (events are stored by a worker after their 202 anyway): each is a
`db.lag_tolerant` read, served by the read replica when one is configured (DATABASE_REPLICA_URL).

Reads never scan raw events for whole days: a window is split into whole UTC days, answered from the
rollups, and at most two partial days at its edges, answered from raw events / chat facts (indexed by
org + time). Both parts have the same columns and are summed in one query, so any window is exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Date,
    and_,
    cast,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from app.analytics.models import (
    AnalyticsAgentName,
    AnalyticsChat,
    AnalyticsDailyUser,
    AnalyticsEvent,
    AnalyticsRollup,
    AnalyticsUsage,
)
from app.analytics.rollup import (
    CHAT_CATEGORY,
    CHAT_TYPES,
    COST,
    ROLLUP_COLUMNS,
    USAGE_COLUMNS,
    chat_sums,
    fact_columns,
    message_sums,
    usage_sums,
)
from app.analytics.writer import encode, write_lines
from app.db import db
from app.errors import InvalidInput
from app.images.models import ImageUsage
from app.platform_models import Organization
from app.tenancy import Tenant
from app.wire import iso, new_id, parse_instant, utcnow

E = AnalyticsEvent.__table__
C = AnalyticsChat.__table__
R = AnalyticsRollup.__table__
U = AnalyticsDailyUser.__table__
USAGE = AnalyticsUsage.__table__
NAMES = AnalyticsAgentName.__table__
IMG = ImageUsage.__table__
IMAGE_SERVICE = "image-gen"
DEFAULT_DAYS = 30
MAX_WINDOW_DAYS = 3660
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ONE_US = timedelta(microseconds=1)


# --- time ------------------------------------------------------------------------------------------

def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """[start, end) in UTC, split into whole days (rollups) and partial edges (raw facts)."""

    start: datetime
    end: datetime

    @property
    def full_days(self) -> tuple[date, date] | None:
        first = self.start.date() if self.start == midnight(self.start.date()) else self.start.date() + timedelta(1)
        stop = self.end.date()
        return (first, stop) if first < stop else None

    @property
    def edges(self) -> list[tuple[datetime, datetime]]:
        days = self.full_days
        if days is None:
            return [(self.start, self.end)]
        out = []
        if self.start < midnight(days[0]):
            out.append((self.start, midnight(days[0])))
        if midnight(days[1]) < self.end:
            out.append((midnight(days[1]), self.end))
        return out

    def days(self) -> list[date]:
        first, last = self.start.date(), (self.end - _ONE_US).date()
        return [first + timedelta(n) for n in range((last - first).days + 1)]

    def metadata(self) -> dict[str, str]:
        return {"from": iso(self.start), "to": iso(self.end)}


def resolve_window(raw_from: str | None, raw_to: str | None, now: datetime | None = None) -> Window:
    """Dates or instants; a date-only `to` covers its whole day; default the last 30 days
    (today included, whole days); `from` after `to` or a bad value is 400."""
    now = now or datetime.now(UTC)

    def bound(raw: str, name: str, is_to: bool) -> datetime:
        try:
            moment = parse_instant(raw)
        except ValueError:
            raise InvalidInput(f"'{name}' must be an ISO 8601 date or timestamp.",
                               {"fields": {name: ["Not an ISO 8601 date or timestamp."]}}) from None
        if is_to:
            try:
                return moment + (timedelta(days=1) if _DATE_ONLY.match(raw.strip()) else _ONE_US)
            except OverflowError:
                raise InvalidInput(f"'{name}' is out of range.") from None
        return moment

    end = bound(raw_to, "to", True) if raw_to else midnight(now.date() + timedelta(1))
    if raw_from:
        start = bound(raw_from, "from", False)
    else:
        try:
            start = midnight((end - _ONE_US).date() - timedelta(DEFAULT_DAYS - 1))
        except OverflowError:
            raise InvalidInput("'to' is out of range.") from None
    if start >= end:
        raise InvalidInput("'from' must not be after 'to'.", {"fields": {"from": ["After 'to'."]}})
    if (end - start).days > MAX_WINDOW_DAYS:
        raise InvalidInput(f"The window may span at most {MAX_WINDOW_DAYS} days.")
    return Window(start, end)


# --- ingest ----------------------------------------------------------------------------------------

def normalise_event(data: dict[str, Any], tenant: Tenant, received: datetime | None = None) -> dict[str, Any]:
    """A validated AnalyticsEvent body as the JSON-serialisable row the batch writer stores. The org
    and product come from the token; `orgId` in the body is ignored."""
    moment = parse_instant(data["timestamp"]) if data.get("timestamp") else (received or utcnow())
    return {
        "product": tenant.product, "org_id": tenant.org_id,
        "event_id": data.get("eventId") or new_id(),
        "session_id": data["sessionId"], "user_id": data["userId"],
        "event_type": data["eventType"], "event_category": data["eventCategory"],
        "page_path": data.get("pagePath"), "properties": data.get("properties"),
        "occurred_at": iso(moment) if moment.microsecond % 1000 == 0 else moment.isoformat(),
    }


def write_batch(session: Session, events: Iterable[dict[str, Any]]) -> int:
    """Store one batch of normalised events (one product) in the session's transaction and fold the
    newly stored ones into the rollups (`app.analytics.writer`). Returns how many were new; duplicates
    change nothing."""
    stored, _ = write_lines(session, encode(events))
    return stored


# --- fact sources for the dashboards ---------------------------------------------------------------

def _edge_time(column, window: Window):
    return or_(*[and_(column >= lo, column < hi) for lo, hi in window.edges])


def _utc_day(column):
    return cast(func.timezone("UTC", column), Date)


def _props():
    """The fact columns of the events read (the definitions of app.analytics.rollup, as the writer's)."""
    return fact_columns(E.c.properties, E.c.event_type)


def _labelled(sums: dict[str, Any], columns: tuple[str, ...]) -> list:
    """`sums` (app.analytics.rollup) as labelled select columns in `columns` order (constants typed)."""
    return [(sums[c] if isinstance(sums[c], ColumnElement) else literal(sums[c], COST if c == "cost" else BigInteger)
             ).label(c) for c in columns]


def facts(window: Window, org: str | None = None, channel: str | None = None):
    """Subquery (org_id, day, agent_id, channel, <ROLLUP_COLUMNS>) covering exactly the window."""
    parts = []
    days = window.full_days
    if days:
        q = select(R.c.org_id, R.c.day, R.c.agent_id, R.c.channel, *[R.c[c] for c in ROLLUP_COLUMNS]).where(
            R.c.day >= days[0], R.c.day < days[1])
        q = q.where(R.c.org_id == org) if org else q
        parts.append(q.where(R.c.channel == channel) if channel else q)
    if window.edges:
        p = _props()
        q = select(E.c.org_id, _utc_day(E.c.occurred_at).label("day"), p["agent_id"].label("agent_id"),
                   p["channel"].label("channel"), *_labelled(message_sums(p), ROLLUP_COLUMNS)
                   ).where(E.c.event_category == CHAT_CATEGORY, E.c.event_type == "message",
                           _edge_time(E.c.occurred_at, window))
        q = q.where(E.c.org_id == org) if org else q
        parts.append(q.where(p["channel"] == channel) if channel else q)
        q = select(C.c.org_id, _utc_day(C.c.first_at).label("day"), C.c.agent_id, C.c.channel,
                   *_labelled(chat_sums(C.c.first_at, C.c.last_at, C.c.csat_score), ROLLUP_COLUMNS)
                   ).where(C.c.first_at.isnot(None), _edge_time(C.c.first_at, window))
        q = q.where(C.c.org_id == org) if org else q
        parts.append(q.where(C.c.channel == channel) if channel else q)
    return union_all(*parts).subquery("facts")


def users(window: Window, org: str | None = None, channel: str | None = None):
    """Subquery (org_id, day, agent_id, channel, user_id): every user active in the window (exact)."""
    parts = []
    days = window.full_days
    if days:
        q = select(U.c.org_id, U.c.day, U.c.agent_id, U.c.channel, U.c.user_id).where(
            U.c.day >= days[0], U.c.day < days[1])
        q = q.where(U.c.org_id == org) if org else q
        parts.append(q.where(U.c.channel == channel) if channel else q)
    if window.edges:
        p = _props()
        q = select(E.c.org_id, _utc_day(E.c.occurred_at).label("day"), p["agent_id"].label("agent_id"),
                   p["channel"].label("channel"), E.c.user_id).where(
            E.c.event_category == CHAT_CATEGORY, E.c.event_type.in_(CHAT_TYPES),
            _edge_time(E.c.occurred_at, window))
        q = q.where(E.c.org_id == org) if org else q
        parts.append(q.where(p["channel"] == channel) if channel else q)
    return union_all(*parts).subquery("users")


def _images(window: Window, org: str | None = None):
    q = IMG.c.created_at >= window.start, IMG.c.created_at < window.end
    return (*q, IMG.c.org_id == org) if org else q


def _sum(column):
    return func.coalesce(func.sum(column), 0)


def _count_users(session: Session, u, group: str | None = None, per_org: bool = False):
    """Distinct users of `u` (per `group` value when given). `SELECT DISTINCT` then count, which
    PostgreSQL hashes, instead of count(DISTINCT …), which sorts (10x slower on 40 000 rows)."""
    keys = ["org_id", "user_id"] if per_org and group != "org_id" else ["user_id"]
    columns = ([group] if group else []) + keys
    d = select(*[u.c[c] for c in columns]).distinct().subquery()
    if group is None:
        return int(session.scalar(select(func.count()).select_from(d)) or 0)
    return dict(session.execute(select(d.c[group], func.count()).group_by(d.c[group])).all())


def _num(value) -> float:
    return round(float(value or 0), 6)


def _secs(total_us, count) -> float:
    return round(int(total_us) / int(count) / 1_000_000, 3) if count else 0.0


def _session() -> Session:
    """The dashboards' session: on the read replica inside a `db.lag_tolerant` read when one is configured
    (DATABASE_REPLICA_URL), else the request's."""
    return db.replica_session()


# --- per-org dashboards ----------------------------------------------------------------------------

@db.lag_tolerant
def summary(org: str, window: Window) -> dict[str, Any]:
    s = _session()
    f = facts(window, org)
    row = s.execute(select(_sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens), _sum(f.c.cost),
                           _sum(f.c.duration_us))).one()
    unique = _count_users(s, users(window, org))
    img = s.execute(select(_sum(IMG.c.total_tokens), _sum(IMG.c.cost)).where(*_images(window, org))).one()
    return {"total_chats": int(row[0]), "total_messages": int(row[1]),
            "total_tokens": int(row[2]) + int(img[0]), "total_cost": _num(row[3] + img[1]),
            "unique_users": int(unique), "avg_session_duration": _secs(row[4], row[0])}


@db.lag_tolerant
def chats(org: str, window: Window, agent_id: str | None, limit: int, offset: int) -> tuple[list, bool]:
    q = select(C).where(C.c.org_id == org, C.c.first_at >= window.start, C.c.first_at < window.end)
    if agent_id:
        q = q.where(C.c.agent_id == agent_id)
    rows = _session().execute(q.order_by(C.c.first_at.desc(), C.c.chat_id).limit(limit + 1).offset(offset)
                              ).mappings().all()
    out = [{"chat_id": r["chat_id"], "agent_id": r["agent_id"], "user_id": r["user_id"] or "",
            "message_count": r["message_count"], "total_tokens": r["total_tokens"],
            "duration_secs": round((r["last_at"] - r["first_at"]).total_seconds(), 3) if r["last_at"] else 0.0,
            "csat_score": None if r["csat_score"] is None else float(r["csat_score"]),
            "created_at": iso(r["first_at"])} for r in rows[:limit]]
    return out, len(rows) > limit


@db.lag_tolerant
def agents(org: str, window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window, org)
    grouped = s.execute(select(f.c.agent_id, _sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens),
                               _sum(f.c.duration_us), _sum(f.c.csat_sum), _sum(f.c.csat_count))
                        .group_by(f.c.agent_id)).all()
    unique = _count_users(s, users(window, org), "agent_id")
    names = dict(s.execute(select(NAMES.c.agent_id, NAMES.c.agent_name).where(NAMES.c.org_id == org)).all())
    out = []
    for agent, n_chats, n_messages, tokens, duration, csat_sum, csat_count in grouped:
        if not (n_chats or n_messages or unique.get(agent)):
            continue
        out.append({"agent_id": agent, "agent_name": names.get(agent), "total_chats": int(n_chats),
                    "total_messages": int(n_messages), "total_tokens": int(tokens),
                    "avg_duration_secs": _secs(duration, n_chats), "unique_users": int(unique.get(agent, 0)),
                    "avg_csat": round(int(csat_sum) / int(csat_count), 3) if csat_count else None})
    return sorted(out, key=lambda a: (-a["total_chats"], -a["total_messages"], a["agent_id"]))


@db.lag_tolerant
def usage(org: str, window: Window) -> list[dict[str, Any]]:
    s = _session()
    parts = []
    days = window.full_days
    if days:
        parts.append(select(USAGE.c.service, USAGE.c.model, *[USAGE.c[c] for c in USAGE_COLUMNS]).where(
            USAGE.c.org_id == org, USAGE.c.day >= days[0], USAGE.c.day < days[1]))
    if window.edges:
        p = _props()
        parts.append(select(p["service"].label("service"), p["model"].label("model"),
                            *_labelled(usage_sums(p), USAGE_COLUMNS)).where(
            E.c.org_id == org, E.c.event_category == CHAT_CATEGORY, E.c.event_type == "message",
            _edge_time(E.c.occurred_at, window)))
    parts.append(select(literal(IMAGE_SERVICE).label("service"), IMG.c.model, IMG.c.input_tokens,
                        IMG.c.output_tokens, IMG.c.total_tokens, func.coalesce(IMG.c.cost, 0).label("cost"),
                        literal(1, BigInteger).label("request_count")).where(*_images(window, org)))
    u = union_all(*parts).subquery("usage")
    rows = s.execute(select(u.c.service, u.c.model, *[_sum(u.c[c]) for c in USAGE_COLUMNS])
                     .group_by(u.c.service, u.c.model)).all()
    out = [{"service": r[0], "model": r[1], "input_tokens": int(r[2]), "output_tokens": int(r[3]),
            "total_tokens": int(r[4]), "cost": _num(r[5]), "request_count": int(r[6])}
           for r in rows if r[6]]
    return sorted(out, key=lambda x: (-x["cost"], -x["total_tokens"], x["service"], x["model"]))


@db.lag_tolerant
def daily(org: str, window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window, org)
    by_day = {r[0]: r[1:] for r in s.execute(
        select(f.c.day, _sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens)).group_by(f.c.day))}
    unique = _count_users(s, users(window, org), "day")
    day = _utc_day(IMG.c.created_at)
    img = dict(s.execute(select(day, _sum(IMG.c.total_tokens)).where(*_images(window, org)).group_by(day)).all())
    out = []
    for d in window.days():
        n_chats, n_messages, tokens = by_day.get(d, (0, 0, 0))
        out.append({"date": d.isoformat(), "total_chats": int(n_chats), "total_messages": int(n_messages),
                    "total_tokens": int(tokens) + int(img.get(d, 0)), "unique_users": int(unique.get(d, 0))})
    return out


@db.lag_tolerant
def events(org: str, window: Window, filters: dict[str, str], limit: int, offset: int) -> tuple[list, bool]:
    q = select(E).where(E.c.org_id == org, E.c.occurred_at >= window.start, E.c.occurred_at < window.end)
    for arg, column in (("eventType", E.c.event_type), ("eventCategory", E.c.event_category),
                        ("userId", E.c.user_id), ("sessionId", E.c.session_id)):
        if filters.get(arg):
            q = q.where(column == filters[arg])
    rows = _session().execute(q.order_by(E.c.occurred_at.desc(), E.c.event_id.desc())
                              .limit(limit + 1).offset(offset)).mappings().all()
    out = [{"eventId": r["event_id"], "orgId": r["org_id"], "sessionId": r["session_id"], "userId": r["user_id"],
            "eventType": r["event_type"], "eventCategory": r["event_category"], "pagePath": r["page_path"],
            "timestamp": iso(r["occurred_at"]), "properties": r["properties"]} for r in rows[:limit]]
    return out, len(rows) > limit


# --- global (every org of the token's product) -----------------------------------------------------

def _org_names(org_ids: Iterable[str]) -> dict[str, str]:
    ids = sorted(set(org_ids))
    if not ids:
        return {}
    found = dict(_session().execute(select(Organization.id, Organization.title).where(Organization.id.in_(ids))).all())
    return {i: (found.get(i) or i) for i in ids}


def _active(f):
    return or_(f.c.chats != 0, f.c.messages != 0)


@db.lag_tolerant
def global_summary(window: Window) -> dict[str, Any]:
    s = _session()
    f = facts(window)
    row = s.execute(select(_sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens), _sum(f.c.cost))).one()
    orgs = set(s.scalars(select(f.c.org_id).where(_active(f)).distinct()))
    orgs |= set(s.scalars(select(IMG.c.org_id).where(*_images(window)).distinct()))
    img = s.execute(select(_sum(IMG.c.total_tokens), _sum(IMG.c.cost)).where(*_images(window))).one()
    total_users = _count_users(s, users(window), per_org=True)
    return {"total_orgs": len(orgs), "total_chats": int(row[0]), "total_messages": int(row[1]),
            "total_tokens": int(row[2]) + int(img[0]), "total_cost": _num(row[3] + img[1]),
            "total_users": int(total_users)}


@db.lag_tolerant
def global_orgs(window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window)
    per_org = {r[0]: list(r[1:]) for r in s.execute(
        select(f.c.org_id, _sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens), _sum(f.c.cost))
        .where(_active(f)).group_by(f.c.org_id))}
    for org, tokens, cost in s.execute(select(IMG.c.org_id, _sum(IMG.c.total_tokens), _sum(IMG.c.cost))
                                       .where(*_images(window)).group_by(IMG.c.org_id)):
        row = per_org.setdefault(org, [0, 0, 0, 0])
        row[2], row[3] = row[2] + tokens, row[3] + cost
    unique = _count_users(s, users(window), "org_id")
    names = _org_names(per_org)
    out = [{"org_id": org, "org_name": names[org], "total_chats": int(r[0]), "total_messages": int(r[1]),
            "total_tokens": int(r[2]), "total_cost": _num(r[3]), "unique_users": int(unique.get(org, 0))}
           for org, r in per_org.items()]
    return sorted(out, key=lambda o: (-o["total_chats"], -o["total_messages"], o["org_id"]))


@db.lag_tolerant
def global_channels(window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window)
    rows = s.execute(select(f.c.channel, func.count(func.distinct(f.c.org_id)), _sum(f.c.chats),
                            _sum(f.c.messages), _sum(f.c.inbound_messages), _sum(f.c.total_tokens),
                            _sum(f.c.cost)).where(_active(f)).group_by(f.c.channel)).all()
    unique = _count_users(s, users(window), "channel", per_org=True)
    out = [{"channel": ch, "total_orgs": int(orgs), "total_chats": int(n_chats), "total_messages": int(msgs),
            "inbound_messages": int(inbound), "total_users": int(unique.get(ch, 0)), "total_tokens": int(tokens),
            "total_cost": _num(cost), "avg_messages_per_chat": round(int(msgs) / int(n_chats), 3) if n_chats else 0.0}
           for ch, orgs, n_chats, msgs, inbound, tokens, cost in rows]
    return sorted(out, key=lambda c: (-c["total_chats"], -c["total_messages"], c["channel"]))


@db.lag_tolerant
def channel_daily(channel: str, window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window, channel=channel)
    by_day = {r[0]: r[1:] for r in s.execute(
        select(f.c.day, _sum(f.c.chats), _sum(f.c.messages)).group_by(f.c.day))}
    unique = _count_users(s, users(window, channel=channel), "day", per_org=True)
    return [{"date": d.isoformat(), "total_chats": int(by_day.get(d, (0, 0))[0]),
             "total_messages": int(by_day.get(d, (0, 0))[1]), "unique_users": int(unique.get(d, 0))}
            for d in window.days()]


@db.lag_tolerant
def channel_orgs(channel: str, window: Window) -> list[dict[str, Any]]:
    s = _session()
    f = facts(window, channel=channel)
    per_org = {r[0]: r[1:] for r in s.execute(
        select(f.c.org_id, _sum(f.c.chats), _sum(f.c.messages), _sum(f.c.total_tokens), _sum(f.c.cost))
        .where(_active(f)).group_by(f.c.org_id))}
    unique = _count_users(s, users(window, channel=channel), "org_id")
    names = _org_names(per_org)
    out = [{"org_id": org, "org_name": names[org], "total_chats": int(r[0]), "total_messages": int(r[1]),
            "unique_users": int(unique.get(org, 0)), "total_tokens": int(r[2]), "total_cost": _num(r[3])}
           for org, r in per_org.items()]
    return sorted(out, key=lambda o: (-o["total_chats"], -o["total_messages"], o["org_id"]))
