"""Time series and channel breakdown of the dashboards (an extension beyond the spec's endpoints, made
for the console and any analyst's client): every metric per day, ISO week (Monday) or month, in UTC or
in an IANA time zone, optionally for one agent, channel or model (platform-wide: also one org).

Two ways to answer, with the same definitions (app.analytics.rollup) and so the same numbers:

- UTC buckets without a model filter read the daily rollups for whole days and the raw facts of the
  window's partial edge days (`services.facts` / `services.users`), as every other dashboard read;
- another time zone's days cut UTC days in two, and the rollups carry no model, so those read the raw
  facts of the whole window (message events, chat rows, image calls; indexed by org + time). Their
  cost grows with the events of the window, where the rollup read's grows with its days.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Date as SqlDate
from sqlalchemy import DateTime, Integer, and_, cast, func, select

from app.analytics.rollup import CHAT_CATEGORY, CHAT_TYPES, duration_us
from app.analytics.services import (
    IMG,
    C,
    E,
    Window,
    _count_users,
    _images,
    _num,
    _props,
    _secs,
    _session,
    _sum,
    facts,
    users,
)
from app.db import db
from app.errors import InvalidInput

INTERVALS = ("day", "week", "month")
UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu",
                       "Z", "GMT", "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "GMT0", "Etc/Greenwich",
                       "Greenwich"})
_ONE_US = timedelta(microseconds=1)


def resolve_zone(name: str | None) -> str:
    """"UTC" for UTC and its aliases, else the (validated) IANA zone name."""
    return "UTC" if not name or name in UTC_NAMES else name


def bucket_start(day: date, interval: str) -> date:
    if interval == "week":
        return day - timedelta(days=day.weekday())
    if interval == "month":
        return day.replace(day=1)
    return day


def next_bucket(start: date, interval: str) -> date:
    if interval == "week":
        return start + timedelta(days=7)
    if interval == "month":
        return (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return start + timedelta(days=1)


def buckets(window: Window, interval: str, zone: str) -> list[date]:
    """The local start dates of every bucket the window touches."""
    tz = zoneinfo.ZoneInfo(zone)
    first = bucket_start(window.start.astimezone(tz).date(), interval)
    last = (window.end - _ONE_US).astimezone(tz).date()
    out = []
    while first <= last:
        out.append(first)
        first = next_bucket(first, interval)
    return out


def _local_midnight(day: date, zone: str) -> datetime:
    return datetime.combine(day, datetime.min.time(), tzinfo=zoneinfo.ZoneInfo(zone)).astimezone(UTC)


def _trunc(interval: str, local_timestamp):
    """The bucket's local start date of a timestamp without time zone."""
    return cast(func.date_trunc(interval, local_timestamp), SqlDate)


def _local(column, zone: str):
    return func.timezone(zone, column)


# --- the two readers: (bucket → sums), users per bucket, users over the window -----------------------

SUMS = ("chats", "messages", "total_tokens", "cost", "duration_us", "csat_sum", "csat_count")


def _rollup_read(window: Window, interval: str, org, agent, channel):
    s = _session()
    f = facts(window, org, channel)
    where = [f.c.agent_id == agent] if agent is not None else []
    bucket = _trunc(interval, cast(f.c.day, DateTime)).label("bucket")
    sums = {r[0]: list(r[1:]) for r in s.execute(
        select(bucket, *[_sum(f.c[c]) for c in SUMS]).where(*where).group_by(bucket))}
    u = users(window, org, channel)
    u_where = [u.c.agent_id == agent] if agent is not None else []
    u_bucket = _trunc(interval, cast(u.c.day, DateTime)).label("bucket")
    chosen = select(u_bucket, u.c.org_id, u.c.user_id).where(*u_where).subquery()
    return sums, chosen


def _raw_read(window: Window, interval: str, zone: str, org, agent, channel, model):
    s = _session()
    p = _props()
    in_window = and_(E.c.occurred_at >= window.start, E.c.occurred_at < window.end)
    scope = [E.c.org_id == org] if org else []
    if agent is not None:
        scope.append(p["agent_id"] == agent)
    if channel is not None:
        scope.append(p["channel"] == channel)
    m_bucket = _trunc(interval, _local(E.c.occurred_at, zone)).label("bucket")
    m_where = [E.c.event_category == CHAT_CATEGORY, E.c.event_type == "message", in_window, *scope]
    if model is not None:
        m_where.append(p["model"] == model)
    sums: dict[date, list] = {}
    for b, messages, tokens, cost in s.execute(
            select(m_bucket, func.count(), _sum(p["input_tokens"] + p["output_tokens"]), _sum(p["cost"]))
            .where(*m_where).group_by(m_bucket)):
        sums[b] = [0, int(messages), int(tokens), cost, 0, 0, 0]
    if model is None:  # a chat is not one model's: its counts only exist without a model filter
        c_where = [C.c.first_at >= window.start, C.c.first_at < window.end]
        c_where += [C.c.org_id == org] if org else []
        c_where += [C.c.agent_id == agent] if agent is not None else []
        c_where += [C.c.channel == channel] if channel is not None else []
        c_bucket = _trunc(interval, _local(C.c.first_at, zone)).label("bucket")
        for b, chats, dur, csat_sum, csat_count in s.execute(
                select(c_bucket, func.count(), _sum(duration_us(C.c.first_at, C.c.last_at)),
                       _sum(func.coalesce(C.c.csat_score, 0)), _sum(cast(C.c.csat_score.isnot(None), Integer)))
                .where(*c_where).group_by(c_bucket)):
            row = sums.setdefault(b, [0, 0, 0, 0, 0, 0, 0])
            row[0], row[4], row[5], row[6] = int(chats), int(dur), int(csat_sum), int(csat_count)
    u_where = [E.c.event_category == CHAT_CATEGORY, in_window, *scope]
    u_where.append(E.c.event_type == "message" if model is not None else E.c.event_type.in_(CHAT_TYPES))
    if model is not None:
        u_where.append(p["model"] == model)
    chosen = select(_trunc(interval, _local(E.c.occurred_at, zone)).label("bucket"), E.c.org_id,
                    E.c.user_id).where(*u_where).subquery()
    return sums, chosen


def _image_sums(window: Window, interval: str, zone: str, org, model) -> dict[date, tuple[int, Any]]:
    where = list(_images(window, org))
    if model is not None:
        where.append(IMG.c.model == model)
    bucket = _trunc(interval, _local(IMG.c.created_at, zone)).label("bucket")
    return {b: (int(t), c) for b, t, c in _session().execute(
        select(bucket, _sum(IMG.c.total_tokens), _sum(IMG.c.cost)).where(*where).group_by(bucket))}


def _point(row: list, users_count: int, model) -> dict[str, Any]:
    chats, messages, tokens, cost, dur, csat_sum, csat_count = row
    by_chat = model is None
    return {"total_chats": int(chats) if by_chat else None, "total_messages": int(messages),
            "total_tokens": int(tokens), "total_cost": _num(cost), "unique_users": int(users_count),
            "avg_session_duration": _secs(dur, chats) if by_chat else None,
            "avg_csat": round(int(csat_sum) / int(csat_count), 3) if by_chat and csat_count else None,
            "csat_responses": int(csat_count) if by_chat else None}


@db.lag_tolerant
def series(window: Window, interval: str, zone: str, *, org: str | None = None, agent: str | None = None,
           channel: str | None = None, model: str | None = None) -> dict[str, Any]:
    """`{interval, timezone, totals, points}`: every bucket the window touches, quiet ones as zeros.
    `org` None is platform-wide (users then count per org, as the global summary's). A point is
    `complete` when its whole bucket lies inside the window and in the past."""
    if interval not in INTERVALS:
        raise InvalidInput("'interval' must be one of day, week, month.",
                           {"fields": {"interval": ["Must be one of: day, week, month."]}})
    zone = resolve_zone(zone)
    per_org = org is None
    if zone == "UTC" and model is None:
        sums, chosen = _rollup_read(window, interval, org, agent, channel)
    else:
        sums, chosen = _raw_read(window, interval, zone, org, agent, channel, model)
    if agent is None and channel is None:  # image calls have no agent or channel
        for b, (tokens, cost) in _image_sums(window, interval, zone, org, model).items():
            row = sums.setdefault(b, [0, 0, 0, 0, 0, 0, 0])
            row[2], row[3] = row[2] + tokens, row[3] + cost
    s = _session()
    per_bucket = _count_users(s, chosen, "bucket", per_org=per_org)
    total_users = _count_users(s, chosen, per_org=per_org)
    now = datetime.now(UTC)
    points, total = [], [0, 0, 0, 0, 0, 0, 0]
    for start in buckets(window, interval, zone):
        row = sums.get(start, [0, 0, 0, 0, 0, 0, 0])
        total = [a + b for a, b in zip(total, row, strict=True)]
        begins, ends = _local_midnight(start, zone), _local_midnight(next_bucket(start, interval), zone)
        points.append({"period": start.isoformat(),
                       "complete": begins >= window.start and ends <= min(window.end, now),
                       **_point(row, per_bucket.get(start, 0), model)})
    return {"interval": interval, "timezone": zone, "totals": _point(total, total_users, model), "points": points}


@db.lag_tolerant
def channels(org: str, window: Window) -> list[dict[str, Any]]:
    """Per channel of one org's chats in the window (the org-scoped sibling of global channels)."""
    s = _session()
    f = facts(window, org)
    rows = s.execute(select(f.c.channel, _sum(f.c.chats), _sum(f.c.messages), _sum(f.c.inbound_messages),
                            _sum(f.c.total_tokens), _sum(f.c.cost))
                     .where((f.c.chats != 0) | (f.c.messages != 0)).group_by(f.c.channel)).all()
    unique = _count_users(s, users(window, org), "channel")
    out = [{"channel": ch, "total_chats": int(n_chats), "total_messages": int(msgs),
            "inbound_messages": int(inbound), "unique_users": int(unique.get(ch, 0)), "total_tokens": int(tokens),
            "total_cost": _num(cost), "avg_messages_per_chat": round(int(msgs) / int(n_chats), 3) if n_chats else 0.0}
           for ch, n_chats, msgs, inbound, tokens, cost in rows]
    return sorted(out, key=lambda c: (-c["total_chats"], -c["total_messages"], c["channel"]))
