"""agent registry: widgets (deleted with their agent; one default per agent)

Revision ID: a0005
Revises: a0004
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0005"
down_revision = "a0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE agent_widgets (
            id         varchar(64)  PRIMARY KEY,
            org_id     varchar(64)  NOT NULL,
            agent_id   varchar(64)  NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
            name       varchar(128) NOT NULL,
            is_default boolean      NOT NULL DEFAULT false,
            doc        jsonb        NOT NULL,
            created_at timestamptz  NOT NULL,
            updated_at timestamptz  NOT NULL,
            CONSTRAINT uq_agent_widgets_agent_id_name UNIQUE (agent_id, name)
        )
    """)
    op.execute("CREATE UNIQUE INDEX uq_agent_widgets_default ON agent_widgets (agent_id) WHERE is_default")
    op.execute("CREATE INDEX ix_agent_widgets_org_id_agent_id ON agent_widgets (org_id, agent_id)")


def downgrade() -> None:
    op.execute("DROP TABLE agent_widgets")
