"""Tables of the agent registry (product schema).

Each table keeps the resource's complete wire document in `doc` (JSONB) and copies the few
fields that queries, constraints and ordering need into indexed scalar columns. The copies are
written by the services in the same statement as `doc`, so they never drift.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Index, String, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase


class _Document:
    """Columns every registry table has: id, org, the wire document, timestamps."""

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128))
    doc: Mapped[dict] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Agent(_Document, TenantBase):
    __tablename__ = "agents"
    __table_args__ = (
        UniqueConstraint("org_id", "name", name="uq_agents_org_id_name"),
        # at most one default agent per org: the database enforces it, the service serialises it
        Index("uq_agents_default", "org_id", unique=True, postgresql_where=text("is_default")),
        Index("ix_agents_sub_agent_ids", "sub_agent_ids", postgresql_using="gin"),
        Index("ix_agents_org_id_status_name", "org_id", "status", "name"),
    )

    title: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    sub_agent_ids: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    summary: Mapped[dict] = mapped_column(JSONB)


class CatalogSkill(_Document, TenantBase):
    __tablename__ = "skills"
    __table_args__ = (
        UniqueConstraint("org_id", "name", name="uq_skills_org_id_name"),
        Index("ix_skills_org_id_category", "org_id", "category"),
    )

    category: Mapped[str] = mapped_column(String(100))


class ToolDefinition(_Document, TenantBase):
    __tablename__ = "tool_definitions"
    __table_args__ = (UniqueConstraint("org_id", "name", name="uq_tool_definitions_org_id_name"),)


class SubAgent(_Document, TenantBase):
    __tablename__ = "sub_agents"
    __table_args__ = (UniqueConstraint("org_id", "name", name="uq_sub_agents_org_id_name"),)


class AgentWidget(_Document, TenantBase):
    __tablename__ = "agent_widgets"
    __table_args__ = (
        UniqueConstraint("agent_id", "name", name="uq_agent_widgets_agent_id_name"),
        Index("uq_agent_widgets_default", "agent_id", unique=True, postgresql_where=text("is_default")),
        Index("ix_agent_widgets_org_id_agent_id", "org_id", "agent_id"),
    )

    agent_id: Mapped[str] = mapped_column(String(64), ForeignKey("product.agents.id", ondelete="CASCADE"))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
