"""agent registry: agents (JSONB document + indexed scalar columns, single-default index)

Revision ID: a0001
Revises: t0001
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0001"
down_revision = "t0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE agents (
            id            varchar(64)  PRIMARY KEY,
            org_id        varchar(64)  NOT NULL,
            name          varchar(128) NOT NULL,
            title         varchar(200) NOT NULL,
            type          varchar(16)  NOT NULL,
            status        varchar(16)  NOT NULL,
            is_default    boolean      NOT NULL DEFAULT false,
            sub_agent_ids text[]       NOT NULL DEFAULT '{}',
            doc           jsonb        NOT NULL,
            summary       jsonb        NOT NULL,
            created_at    timestamptz  NOT NULL,
            updated_at    timestamptz  NOT NULL,
            CONSTRAINT uq_agents_org_id_name UNIQUE (org_id, name),
            CONSTRAINT ck_agents_status CHECK (status IN ('draft', 'active', 'inactive', 'archived')),
            CONSTRAINT ck_agents_archived_not_default CHECK (NOT (is_default AND status = 'archived'))
        )
    """)
    # At most one default agent per organization, whatever the application does.
    op.execute("CREATE UNIQUE INDEX uq_agents_default ON agents (org_id) WHERE is_default")
    # "Which agents reference sub-agent X?" (sub-agent delete) without scanning documents.
    op.execute("CREATE INDEX ix_agents_sub_agent_ids ON agents USING gin (sub_agent_ids)")


def downgrade() -> None:
    op.execute("DROP TABLE agents")
