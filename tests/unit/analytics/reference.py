"""The pure-Python reference model of the analytics rollups (no database): what one ingest batch adds to
the rollups, from the definitions of app.analytics.rollup. tests/unit/analytics/test_rollup.py checks
`plan_batch` against a from-scratch computation; tests/functional/test_analytics_writer.py checks the
set-based SQL writer (app.analytics.writer) against the same computation. Only events stored for the
first time reach the planner; duplicates and redeliveries add nothing.

- message metrics (messages, inbound, tokens, cost, usage per service/model) belong to the message
  event's own UTC day, `agentId` ('' when absent) and `channel` ('web' when absent);
- a user is active on the day/agent/channel of each chat event they sent (exact sets, no sketch);
- a chat is all chat events with one `chatId`; its *earliest* event (by timestamp, then eventId) fixes
  its start day, user, agent and channel; its duration is its last non-csat event − its first event; its
  CSAT is the score of its latest `csat` event. A late event that changes any of these retracts the
  chat's old contribution from its old bucket and adds the new one, so totals stay exact in any order.
Durations are integer microseconds and costs Decimals with 6 places, so sums and retractions are exact.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from app.analytics.rollup import DEFAULT_CHANNEL, DEFAULT_MODEL, DEFAULT_SERVICE, ROLLUP_COLUMNS, USAGE_COLUMNS

CENT = Decimal("0.000001")


def money(value: Any) -> Decimal:
    return Decimal(str(value or 0)).quantize(CENT, rounding=ROUND_HALF_UP)  # as PostgreSQL numeric rounds


def utc_day(ts: datetime) -> date:
    return ts.astimezone(UTC).date()


@dataclass(frozen=True, slots=True)
class ChatFact:
    """One chat-category event, reduced to what the rollups need."""

    org_id: str
    event_id: str
    event_type: str
    chat_id: str
    user_id: str
    at: datetime
    agent_id: str = ""
    agent_name: str | None = None
    channel: str = DEFAULT_CHANNEL
    inbound: bool = False
    service: str = DEFAULT_SERVICE
    model: str = DEFAULT_MODEL
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    score: int | None = None
    day: date | None = None

    def __post_init__(self) -> None:
        if self.day is None:
            object.__setattr__(self, "day", utc_day(self.at))

    @property
    def order(self) -> tuple[datetime, str]:
        return (self.at, self.event_id)


@dataclass
class ChatState:
    """One row of analytics_chats."""

    user_id: str | None = None
    agent_id: str = ""
    agent_name: str | None = None
    channel: str = DEFAULT_CHANNEL
    first_at: datetime | None = None
    first_event_id: str | None = None
    last_at: datetime | None = None
    message_count: int = 0
    inbound_messages: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cost: Decimal = field(default_factory=lambda: Decimal(0))
    csat_score: int | None = None
    csat_at: datetime | None = None
    csat_event_id: str | None = None

    def absorb(self, fact: ChatFact) -> None:
        if self.first_at is None or fact.order < (self.first_at, self.first_event_id or ""):
            self.first_at, self.first_event_id = fact.at, fact.event_id
            self.user_id, self.agent_id, self.agent_name, self.channel = (
                fact.user_id, fact.agent_id, fact.agent_name, fact.channel)
        if fact.event_type != "csat" and (self.last_at is None or fact.at > self.last_at):
            self.last_at = fact.at  # a survey answered later does not lengthen the chat
        if fact.event_type == "message":
            self.message_count += 1
            self.inbound_messages += int(fact.inbound)
            self.input_tokens += fact.input_tokens
            self.output_tokens += fact.output_tokens
            self.total_tokens += fact.input_tokens + fact.output_tokens
            self.cost += fact.cost
        elif fact.event_type == "csat" and (
                self.csat_at is None or fact.order > (self.csat_at, self.csat_event_id or "")):
            self.csat_score, self.csat_at, self.csat_event_id = fact.score, fact.at, fact.event_id

    @property
    def duration_us(self) -> int:
        if self.first_at is None or self.last_at is None:
            return 0
        delta = self.last_at - self.first_at
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds

    def contribution(self) -> tuple[tuple[date, str, str], dict[str, int]] | None:
        """(bucket, chat columns) this chat adds to the rollup; None for an empty placeholder."""
        if self.first_at is None:
            return None
        return ((utc_day(self.first_at), self.agent_id, self.channel),
                {"chats": 1, "duration_us": self.duration_us,
                 "csat_sum": self.csat_score or 0, "csat_count": int(self.csat_score is not None)})


@dataclass
class BatchPlan:
    """Everything one batch changes: deltas to add, sets to union, chat rows to write."""

    rollup: dict[tuple[str, date, str, str], dict[str, Any]] = field(default_factory=dict)
    usage: dict[tuple[str, date, str, str], dict[str, Any]] = field(default_factory=dict)
    users: set[tuple[str, date, str, str, str]] = field(default_factory=set)
    chats: dict[tuple[str, str], ChatState] = field(default_factory=dict)
    agent_names: dict[tuple[str, str], str] = field(default_factory=dict)


def _add(target: dict, key: tuple, columns: tuple[str, ...], values: dict[str, Any], sign: int = 1) -> None:
    row = target.get(key)
    if row is None:
        row = target[key] = {c: (Decimal(0) if c == "cost" else 0) for c in columns}
    for name, value in values.items():
        row[name] += sign * value


def plan_batch(facts: list[ChatFact], existing: dict[tuple[str, str], ChatState]) -> BatchPlan:
    """The rollup deltas of `facts` (events stored for the first time), given the current rows of the
    chats they touch (`existing`; a missing chat is a new one)."""
    plan = BatchPlan()
    touched: dict[tuple[str, str], ChatState] = {}
    for fact in sorted(facts, key=lambda f: (f.org_id, f.order)):
        bucket = (fact.org_id, fact.day, fact.agent_id, fact.channel)
        plan.users.add((*bucket, fact.user_id))
        if fact.agent_id and fact.agent_name:
            plan.agent_names[(fact.org_id, fact.agent_id)] = fact.agent_name
        if fact.event_type == "message":
            tokens = fact.input_tokens + fact.output_tokens
            _add(plan.rollup, bucket, ROLLUP_COLUMNS,
                 {"messages": 1, "inbound_messages": int(fact.inbound), "input_tokens": fact.input_tokens,
                  "output_tokens": fact.output_tokens, "total_tokens": tokens, "cost": fact.cost})
            _add(plan.usage, (fact.org_id, fact.day, fact.service, fact.model), USAGE_COLUMNS,
                 {"input_tokens": fact.input_tokens, "output_tokens": fact.output_tokens,
                  "total_tokens": tokens, "cost": fact.cost, "request_count": 1})
        key = (fact.org_id, fact.chat_id)
        state = touched.get(key)
        if state is None:
            old = existing.get(key)
            state = touched[key] = copy.copy(old) if old is not None else ChatState()
        state.absorb(fact)
    for key, state in touched.items():
        old = existing.get(key)
        before = old.contribution() if old is not None else None
        after = state.contribution()
        if before != after:
            if before is not None:
                _add(plan.rollup, (key[0], *before[0]), ROLLUP_COLUMNS, before[1], -1)
            if after is not None:
                _add(plan.rollup, (key[0], *after[0]), ROLLUP_COLUMNS, after[1])
        plan.chats[key] = state
    return plan
