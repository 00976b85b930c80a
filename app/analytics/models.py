"""Analytics tables (one set per product schema).

- `analytics_events`: every ingested event, raw; idempotent by (org_id, event_id); read by GET /events
  and by the dashboards for the partial days at the edges of a window.
- `analytics_chats`: one row per chat (upserted by the ingest batches): its earliest event fixes its
  start, user, agent and channel; counters are sums over its message events; `csat_score` is the score
  of its latest csat event.
- `analytics_rollup`: per org × UTC day × agent × channel. Message columns are sums over message events
  of that day/agent/channel; chat columns (`chats`, `duration_us`, `csat_*`) describe the chats that
  *start* that day (a late event that moves a chat's start retracts it from the old bucket).
- `analytics_daily_users`: the exact set of users active per org × day × agent × channel.
- `analytics_usage`: per org × day × service × model, from message events (UsageAnalytics).
- `analytics_agent_names`: the last reported name of each agent id.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import BigInteger, Date, DateTime, Index, Integer, Numeric, String, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase

MONEY = Numeric()  # sums of costs: unbounded (migration n0002); one message is at most 1e9


class AnalyticsEvent(TenantBase):
    __tablename__ = "analytics_events"
    __table_args__ = (Index("ix_analytics_events_org_time", "org_id", "occurred_at"),)

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(256), nullable=False)
    user_id: Mapped[str] = mapped_column(String(256), nullable=False)
    event_type: Mapped[str] = mapped_column(String(128), nullable=False)
    event_category: Mapped[str] = mapped_column(String(128), nullable=False)
    page_path: Mapped[str | None] = mapped_column(Text)
    properties: Mapped[dict | None] = mapped_column(JSONB)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False,
                                                  server_default=func.now())


class AnalyticsChat(TenantBase):
    __tablename__ = "analytics_chats"
    __table_args__ = (Index("ix_analytics_chats_org_start", "org_id", "first_at"),)

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    chat_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    user_id: Mapped[str | None] = mapped_column(String(256))
    agent_id: Mapped[str] = mapped_column(String(256), nullable=False, default="")
    agent_name: Mapped[str | None] = mapped_column(String(256))
    channel: Mapped[str] = mapped_column(String(64), nullable=False, default="web")
    first_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_event_id: Mapped[str | None] = mapped_column(String(128))
    last_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    message_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    inbound_messages: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    total_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cost: Mapped[Decimal] = mapped_column(MONEY, nullable=False, default=0)
    csat_score: Mapped[int | None] = mapped_column(Integer)
    csat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    csat_event_id: Mapped[str | None] = mapped_column(String(128))


class AnalyticsRollup(TenantBase):
    __tablename__ = "analytics_rollup"
    __table_args__ = (Index("ix_analytics_rollup_day", "day"),)

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    channel: Mapped[str] = mapped_column(String(64), primary_key=True)
    chats: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    duration_us: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    csat_sum: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    csat_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    messages: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    inbound_messages: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    total_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cost: Mapped[Decimal] = mapped_column(MONEY, nullable=False, default=0)


class AnalyticsDailyUser(TenantBase):
    __tablename__ = "analytics_daily_users"
    __table_args__ = (Index("ix_analytics_daily_users_day", "day"),)

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    channel: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)


class AnalyticsUsage(TenantBase):
    __tablename__ = "analytics_usage"

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    service: Mapped[str] = mapped_column(String(128), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    total_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cost: Mapped[Decimal] = mapped_column(MONEY, nullable=False, default=0)
    request_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class AnalyticsAgentName(TenantBase):
    __tablename__ = "analytics_agent_names"

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(256), nullable=False)
