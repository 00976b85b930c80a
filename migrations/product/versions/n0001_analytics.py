"""analytics: raw events, per-chat facts, daily rollups, daily user sets, usage, agent names

Revision ID: n0001
Revises: t0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "n0001"
down_revision = "t0001"
branch_labels = None
depends_on = None

MONEY = sa.Numeric(18, 6)


def _zero(name, type_=sa.Integer):
    return sa.Column(name, type_, nullable=False, server_default="0")


def upgrade() -> None:
    op.create_table(
        "analytics_events",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("event_type", sa.String(128), nullable=False),
        sa.Column("event_category", sa.String(128), nullable=False),
        sa.Column("page_path", sa.Text),
        sa.Column("properties", JSONB),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("org_id", "event_id", name="pk_analytics_events"),
    )
    op.create_index("ix_analytics_events_org_time", "analytics_events", ["org_id", "occurred_at"])
    op.create_table(
        "analytics_chats",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("chat_id", sa.String(256), nullable=False),
        sa.Column("user_id", sa.String(256)),
        sa.Column("agent_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("agent_name", sa.String(256)),
        sa.Column("channel", sa.String(64), nullable=False, server_default="web"),
        sa.Column("first_at", sa.DateTime(timezone=True)),
        sa.Column("first_event_id", sa.String(128)),
        sa.Column("last_at", sa.DateTime(timezone=True)),
        _zero("message_count"), _zero("inbound_messages"),
        _zero("input_tokens", sa.BigInteger), _zero("output_tokens", sa.BigInteger),
        _zero("total_tokens", sa.BigInteger), _zero("cost", MONEY),
        sa.Column("csat_score", sa.Integer),
        sa.Column("csat_at", sa.DateTime(timezone=True)),
        sa.Column("csat_event_id", sa.String(128)),
        sa.PrimaryKeyConstraint("org_id", "chat_id", name="pk_analytics_chats"),
    )
    op.create_index("ix_analytics_chats_org_start", "analytics_chats", ["org_id", "first_at"])
    op.create_table(
        "analytics_rollup",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("agent_id", sa.String(256), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        _zero("chats"), _zero("duration_us", sa.BigInteger), _zero("csat_sum"), _zero("csat_count"),
        _zero("messages"), _zero("inbound_messages"),
        _zero("input_tokens", sa.BigInteger), _zero("output_tokens", sa.BigInteger),
        _zero("total_tokens", sa.BigInteger), _zero("cost", MONEY),
        sa.PrimaryKeyConstraint("org_id", "day", "agent_id", "channel", name="pk_analytics_rollup"),
    )
    op.create_index("ix_analytics_rollup_day", "analytics_rollup", ["day"])
    op.create_table(
        "analytics_daily_users",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("agent_id", sa.String(256), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "day", "agent_id", "channel", "user_id",
                                name="pk_analytics_daily_users"),
    )
    op.create_index("ix_analytics_daily_users_day", "analytics_daily_users", ["day"])
    op.create_table(
        "analytics_usage",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("service", sa.String(128), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        _zero("input_tokens", sa.BigInteger), _zero("output_tokens", sa.BigInteger),
        _zero("total_tokens", sa.BigInteger), _zero("cost", MONEY), _zero("request_count"),
        sa.PrimaryKeyConstraint("org_id", "day", "service", "model", name="pk_analytics_usage"),
    )
    op.create_table(
        "analytics_agent_names",
        sa.Column("org_id", sa.String(128), nullable=False),
        sa.Column("agent_id", sa.String(256), nullable=False),
        sa.Column("agent_name", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "agent_id", name="pk_analytics_agent_names"),
    )


def downgrade() -> None:
    for table in ("analytics_agent_names", "analytics_usage", "analytics_daily_users", "analytics_rollup",
                  "analytics_chats", "analytics_events"):
        op.drop_table(table)
