"""entity definitions: `projection`, the name of the definition's READY typed projection table

A definition big enough for its own indexes also gets a narrow typed table (`erp_<key>_<digest>`,
app.entities.projection) maintained by statement-level triggers on entity_records. The table is built
by the index task; `projection` names it once it is complete and matches the current schema (NULL:
queries use entity_records alone). The tables and triggers themselves are created at run time.

Revision ID: p0001
Revises: v0003
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "p0001"
down_revision = "v0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entity_definitions", sa.Column("projection", sa.String(63), nullable=True))


def downgrade() -> None:
    op.drop_column("entity_definitions", "projection")
