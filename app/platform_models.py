"""Tables of the `platform` schema (shared by every product): products, organizations, users, artifacts,
failed tasks. The tenancy layer (app.tenancy) reads `products`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import PlatformBase
from app.wire import new_id, utcnow


class Product(PlatformBase):
    __tablename__ = "products"

    slug: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    schema_name: Mapped[str] = mapped_column(String(63), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Organization(PlatformBase):
    __tablename__ = "organizations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    title: Mapped[str] = mapped_column(String(200))
    main_domain: Mapped[str | None] = mapped_column(String(253), unique=True)
    product: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class User(PlatformBase):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("org_id", "email"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(64), index=True)
    email: Mapped[str] = mapped_column(String(320))
    first_name: Mapped[str | None] = mapped_column(String(200))
    last_name: Mapped[str | None] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(40), default="user")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Artifact(PlatformBase):
    """A platform-shipped object (entity definition, agent, skill…) rolled out to organizations."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("kind", "name"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    kind: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(200))
    artifact_version: Mapped[int] = mapped_column(Integer, default=1)
    payload: Mapped[dict] = mapped_column(JSONB, default=dict)
    position: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class OrgArtifact(PlatformBase):
    """One artifact as provisioned into one org and product: which object, which version, and the
    object's edit stamp at that moment (entity definition `version`, registry doc `updatedAt`).
    A different stamp later means the org edited its copy."""

    __tablename__ = "org_artifacts"

    org_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    product: Mapped[str] = mapped_column(String(40), primary_key=True)
    artifact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(200))
    object_id: Mapped[str] = mapped_column(String(200))
    artifact_version: Mapped[int] = mapped_column(Integer)
    stamp: Mapped[str | None] = mapped_column(String(64))
    forked_from_version: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Rollout(PlatformBase):
    """Rolling one artifact version out to every provisioned org; `cursor_*` is the last org done."""

    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    artifact_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(200))
    artifact_version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    cursor_org: Mapped[str] = mapped_column(String(64), default="")
    cursor_product: Mapped[str] = mapped_column(String(40), default="")
    total: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict] = mapped_column(JSONB, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the lease (o0002; app.ops.rollout): renewed by every batch; the token travels in the task id
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dispatch_token: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    key_prefix: Mapped[str] = mapped_column(String(100), default="", server_default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SeedJob(PlatformBase):
    """An accepted asynchronous seed (`POST /internal/seed` with `Prefer: respond-async`, `flask seed org
    --queue`): the request and its lease (o0002; app.ops.seed_jobs), the shape every leased job has."""

    __tablename__ = "seed_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    org_id: Mapped[str] = mapped_column(String(253))
    product: Mapped[str] = mapped_column(String(40))
    body: Mapped[dict] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16))  # queued | running | done | failed
    error: Mapped[str | None] = mapped_column(Text)
    dispatch_token: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    key_prefix: Mapped[str] = mapped_column(String(100), default="", server_default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RolloutOutcome(PlatformBase):
    """What a rollout did to one org: updated, forked (edited copy kept), current, missing, failed."""

    __tablename__ = "rollout_outcomes"

    rollout_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    product: Mapped[str] = mapped_column(String(40), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class FailedTask(PlatformBase):
    """A Celery task that exhausted its retries (kept for operators to inspect and replay)."""

    __tablename__ = "failed_tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    task_name: Mapped[str] = mapped_column(String(200))
    args: Mapped[list] = mapped_column(JSONB, default=list)
    kwargs: Mapped[dict] = mapped_column(JSONB, default=dict)
    error: Mapped[str] = mapped_column(Text)
    failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class OutboxMessage(PlatformBase):
    """A task accepted by a committed transaction and not yet handed to the broker (app.tasks)."""

    __tablename__ = "task_outbox"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    key_prefix: Mapped[str] = mapped_column(String(100), default="")  # the deployment's CELERY_KEY_PREFIX
    task_name: Mapped[str] = mapped_column(String(200))
    args: Mapped[list] = mapped_column(JSONB, default=list)
    kwargs: Mapped[dict] = mapped_column(JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    # the W3C trace context of the request or task that wrote the row (traceparent, tracestate), when it
    # was traced: the task continues that trace whoever sends it (app.observability.tracing)
    trace_context: Mapped[dict | None] = mapped_column(JSONB)
