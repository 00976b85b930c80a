"""product schema base: the root every product-schema migration descends from

Domain migrations (entities, agents, images, analytics, …) each start a branch from this
revision (down_revision = "t0001"); `upgrade heads` applies them all.

Revision ID: t0001
Revises:
Create Date: 2026-11-22
"""
from alembic import op

revision = "t0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nothing yet: the schema itself is created by migrations.runner before Alembic runs.
    op.execute("SELECT 1")


def downgrade() -> None:
    pass
