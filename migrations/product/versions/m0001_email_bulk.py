"""product schema: bulk email jobs, per-recipient delivery state, newsletter subscribers

Revision ID: m0001
Revises: t0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "m0001"
down_revision = "t0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "email_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("subject", sa.Text),
        sa.Column("body", sa.Text),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("created_by", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_email_jobs_org_id_created_at", "email_jobs", ["org_id", "created_at"])
    op.create_table(
        "email_deliveries",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("email_jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("recipient", sa.String(320), nullable=False),
        sa.Column("subject", sa.Text),
        sa.Column("body", sa.Text),
        sa.Column("headers", JSONB),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("smtp_code", sa.Integer),
        sa.Column("error", sa.Text),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("claimed_at", sa.DateTime(timezone=True)),
        sa.Column("sent_at", sa.DateTime(timezone=True)),
    )
    op.create_index("ix_email_deliveries_job_id_status", "email_deliveries", ["job_id", "status"])
    op.create_table(
        "newsletter_subscribers",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.String(100)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("unsubscribed_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("org_id", "email", name="uq_newsletter_subscribers_org_id_email"),
    )
    op.create_index("ix_newsletter_subscribers_org_id_status", "newsletter_subscribers", ["org_id", "status", "email"])


def downgrade() -> None:
    op.drop_table("newsletter_subscribers")
    op.drop_table("email_deliveries")
    op.drop_table("email_jobs")
