"""image_usage: one line per image call that reached the provider stage (analytics reads it)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import DateTime, Index, Integer, Numeric, String, func
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase
from app.wire import new_id


class ImageUsage(TenantBase):
    """Named for the analytics UsageAnalytics DTO: group by (service, model), sum the token columns
    and `cost`, count rows for `request_count`."""

    __tablename__ = "image_usage"
    __table_args__ = (Index("ix_image_usage_org_created", "org_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(128), nullable=False)
    user_id: Mapped[str | None] = mapped_column(String(128))
    service: Mapped[str] = mapped_column(String(64), nullable=False)  # "image-generation"
    provider: Mapped[str] = mapped_column(String(32), nullable=False)
    model: Mapped[str] = mapped_column(String(128), nullable=False)
    mode: Mapped[str] = mapped_column(String(16), nullable=False)  # generate | edit
    outcome: Mapped[str] = mapped_column(String(32), nullable=False)  # success | an error code
    http_status: Mapped[int] = mapped_column(Integer, nullable=False)
    input_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    total_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cost: Mapped[Decimal | None] = mapped_column(Numeric(14, 6))  # NULL: price unknown to the gateway
    latency_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    image_bytes: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
