"""The definitions of the analytics metrics, once: which events are chat facts, their defaults, the fact
columns of a chat event (SQL over its `properties`), and what a message and a chat add to the rollup
and usage columns.

The batch writer (`app.analytics.writer`) compiles these expressions into its set-based statements over
the staged batch; the dashboards (`app.analytics.services`) apply the same expressions to the raw events
and chat rows of a window's partial days. So a change here changes both, and the rollups of whole days
and the raw reads of partial days cannot disagree. The pure-Python reference model the tests compare
the writer with lives in tests/unit/analytics/reference.py.

- message metrics (messages, inbound, tokens, cost, usage per service/model) belong to the message
  event's own UTC day, `agentId` ('' when absent) and `channel` ('web' when absent or empty);
- a chat's start day, user, agent and channel are those of its earliest event; its duration is its last
  non-csat event − its first event (integer microseconds); its CSAT the score of its latest `csat` event.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Integer, Numeric, Text, and_, case, cast, false, func, literal, literal_column
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

CHAT_CATEGORY = "chat"
CHAT_TYPES = ("chat_started", "message", "chat_ended", "csat")
DEFAULT_CHANNEL = "web"
DEFAULT_SERVICE = "chat"
DEFAULT_MODEL = "unknown"

ROLLUP_COLUMNS = ("chats", "duration_us", "csat_sum", "csat_count", "messages", "inbound_messages",
                  "input_tokens", "output_tokens", "total_tokens", "cost")
USAGE_COLUMNS = ("input_tokens", "output_tokens", "total_tokens", "cost", "request_count")
COST = Numeric(18, 6)


def _text_or(value: ColumnElement, default: str) -> ColumnElement:
    """The text, or `default` when it is absent or empty."""
    return func.coalesce(func.nullif(value, ""), default)


def _number(value: ColumnElement, type_: Any) -> ColumnElement:
    return cast(func.coalesce(cast(value, Numeric), 0), type_)


def fact_columns(p: ColumnElement, event_type: ColumnElement) -> dict[str, ColumnElement]:
    """The fact columns of a chat event from its `properties` (`p`, JSONB) and type: message-only
    columns are their default for the other types."""
    message = event_type == "message"
    return {
        "agent_id": func.coalesce(p["agentId"].astext, ""),
        "agent_name": p["agentName"].astext,
        "channel": _text_or(p["channel"].astext, DEFAULT_CHANNEL),
        "inbound": and_(message, func.coalesce(p["direction"].astext == "inbound", false())),
        "service": case((message, _text_or(p["service"].astext, DEFAULT_SERVICE)), else_=DEFAULT_SERVICE),
        "model": case((message, _text_or(p["model"].astext, DEFAULT_MODEL)), else_=DEFAULT_MODEL),
        "input_tokens": case((message, _number(p["inputTokens"].astext, BigInteger)), else_=0),
        "output_tokens": case((message, _number(p["outputTokens"].astext, BigInteger)), else_=0),
        "cost": case((message, _number(p["cost"].astext, COST)), else_=literal(0, COST)),
        "score": case((event_type == "csat", cast(cast(p["score"].astext, Numeric), Integer))),
    }


def message_sums(f: dict[str, ColumnElement]) -> dict[str, ColumnElement]:
    """What one message (fact columns `f`: inbound, input_tokens, output_tokens, cost) adds to each
    rollup column."""
    return {"chats": 0, "duration_us": 0, "csat_sum": 0, "csat_count": 0, "messages": 1,
            "inbound_messages": cast(f["inbound"], Integer), "input_tokens": f["input_tokens"],
            "output_tokens": f["output_tokens"], "total_tokens": f["input_tokens"] + f["output_tokens"],
            "cost": f["cost"]}


def usage_sums(f: dict[str, ColumnElement]) -> dict[str, ColumnElement]:
    """What one message adds to each usage column (per service and model)."""
    return {"input_tokens": f["input_tokens"], "output_tokens": f["output_tokens"],
            "total_tokens": f["input_tokens"] + f["output_tokens"], "cost": f["cost"], "request_count": 1}


def duration_us(first_at: ColumnElement, last_at: ColumnElement) -> ColumnElement:
    """A chat's duration in integer microseconds (0 while either end is unknown)."""
    return func.coalesce(cast(func.extract("epoch", last_at - first_at) * 1_000_000, BigInteger), 0)


def chat_sums(first_at: ColumnElement, last_at: ColumnElement, score: ColumnElement) -> dict[str, ColumnElement]:
    """What one chat adds to each rollup column of its start bucket."""
    return {"chats": 1, "duration_us": duration_us(first_at, last_at), "csat_sum": func.coalesce(score, 0),
            "csat_count": cast(score.isnot(None), Integer), "messages": 0, "inbound_messages": 0,
            "input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cost": 0}


# --- as SQL text, for the writer's statements --------------------------------------------------------

def column(name: str, type_: Any = Text) -> ColumnElement:
    """A column of the writer's statements by name (compiled as is)."""
    return literal_column(name, type_)


def sql(value: Any) -> str:
    """An expression (or a constant) as PostgreSQL text, constants inlined (compiled once, at import)."""
    if not isinstance(value, ColumnElement):
        value = literal(value)
    return str(value.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


def chat_fact_sql(p: str, event_type: str) -> dict[str, str]:
    """`fact_columns` over the writer's columns named `p` (JSONB) and `event_type`, as SQL text."""
    return {name: sql(expr) for name, expr in fact_columns(column(p, JSONB), column(event_type)).items()}

