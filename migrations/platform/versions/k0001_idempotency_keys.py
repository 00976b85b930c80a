"""platform schema: idempotency keys (a retried POST with the same `Idempotency-Key` replays the first answer)

Revision ID: k0001
Revises: p0001
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "k0001"
down_revision = "p0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        # the key's scope: who sent it (org, product, caller) to which operation (method, route template)
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("product", sa.String(40), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("method", sa.String(10), nullable=False),
        sa.Column("route", sa.String(300), nullable=False),
        sa.Column("idem_key", sa.String(255), nullable=False),
        # sha256 of the request (path, query, raw body bytes): the same key with another request is 422
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        # running: a request holds it (until locked_until; a dead process's claim expires); done: answered
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("owner", sa.String(36), nullable=False),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("response_status", sa.SmallInteger),
        sa.Column("response_headers", JSONB),
        sa.Column("response_body", sa.LargeBinary),
        sa.CheckConstraint("state IN ('running', 'done')", name="state"),
        sa.UniqueConstraint("org_id", "product", "subject", "method", "route", "idem_key",
                            name="uq_idempotency_keys_scope"),
        schema=S,
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"], schema=S)


def downgrade() -> None:
    op.drop_table("idempotency_keys", schema=S)
