"""Tables of bulk email and newsletters (product schema).

- `email_jobs`: one bulk send (or newsletter issue); the shared subject/body of a one-message job, and
  the job's lease (`lease_expires_at`, `dispatch_token`: see app.email.bulk).
- `email_deliveries`: one row per recipient message, the unit of work and of state:
  pending → sending (claimed by a worker) → sent | failed. A row leaves `pending` only through an
  UPDATE … WHERE status = 'pending', so two workers never send the same row, and a redelivered task
  never sends a row that is already `sent`.
- `newsletter_subscribers`: an org's subscribers (email unique per org, stored lower-case).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import TenantBase


class EmailJob(TenantBase):
    __tablename__ = "email_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # bulk | newsletter
    status: Mapped[str] = mapped_column(String(16))  # queued | sending | done
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str | None] = mapped_column(Text)
    total: Mapped[int] = mapped_column(Integer)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the lease (app.email.bulk): renewed by every slice; past it, a job no worker holds is dispatched
    # again by the reaper (same token); a slice moves the token on (a message carrying an older one does nothing)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dispatch_token: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    key_prefix: Mapped[str] = mapped_column(String(100), default="", server_default="")  # the deployment's
    # slice runs started without progress (m0003); past JOB_MAX_ATTEMPTS the reaper ends the job with `error`
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)


class EmailDelivery(TenantBase):
    __tablename__ = "email_deliveries"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("email_jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    recipient: Mapped[str] = mapped_column(String(320))
    subject: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str | None] = mapped_column(Text)
    headers: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(12))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    smtp_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class NewsletterSubscriber(TenantBase):
    __tablename__ = "newsletter_subscribers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    email: Mapped[str] = mapped_column(String(320))
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))  # active | unsubscribed
    source: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    unsubscribed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
