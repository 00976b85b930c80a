"""agent registry: index agents by (org, status, name) for the status filter of the list routes

Revision ID: a0006
Revises: a0005
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0006"
down_revision = "a0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_agents_org_id_status_name ON agents (org_id, status, name)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_agents_org_id_status_name")
