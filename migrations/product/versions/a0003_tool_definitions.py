"""agent registry: tool definitions

Revision ID: a0003
Revises: a0002
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0003"
down_revision = "a0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE tool_definitions (
            id         varchar(64)  PRIMARY KEY,
            org_id     varchar(64)  NOT NULL,
            name       varchar(128) NOT NULL,
            doc        jsonb        NOT NULL,
            created_at timestamptz  NOT NULL,
            updated_at timestamptz  NOT NULL,
            CONSTRAINT uq_tool_definitions_org_id_name UNIQUE (org_id, name)
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE tool_definitions")
