"""agent registry: sub-agents

Revision ID: a0004
Revises: a0003
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0004"
down_revision = "a0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE sub_agents (
            id         varchar(64)  PRIMARY KEY,
            org_id     varchar(64)  NOT NULL,
            name       varchar(128) NOT NULL,
            doc        jsonb        NOT NULL,
            created_at timestamptz  NOT NULL,
            updated_at timestamptz  NOT NULL,
            CONSTRAINT uq_sub_agents_org_id_name UNIQUE (org_id, name)
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE sub_agents")
