"""platform schema: idempotency keys keep the size and digest of an answer too large to store

Revision ID: k0002
Revises: k0001
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "k0002"
down_revision = "k0001"
branch_labels = None
depends_on = None

S = "platform"


def upgrade() -> None:
    # an answer above IDEMPOTENCY_MAX_ANSWER_BYTES is not kept: the row holds its status, headers, size and
    # sha256, and a replay tells the client the request ran and where to look the result up
    op.add_column("idempotency_keys", sa.Column("response_bytes", sa.Integer), schema=S)
    op.add_column("idempotency_keys", sa.Column("response_sha256", sa.LargeBinary), schema=S)


def downgrade() -> None:
    op.drop_column("idempotency_keys", "response_sha256", schema=S)
    op.drop_column("idempotency_keys", "response_bytes", schema=S)
