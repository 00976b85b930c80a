"""agent registry: catalog skills

Revision ID: a0002
Revises: a0001
Create Date: 2026-11-22
"""
from alembic import op

revision = "a0002"
down_revision = "a0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE skills (
            id         varchar(64)  PRIMARY KEY,
            org_id     varchar(64)  NOT NULL,
            name       varchar(128) NOT NULL,
            category   varchar(100) NOT NULL,
            doc        jsonb        NOT NULL,
            created_at timestamptz  NOT NULL,
            updated_at timestamptz  NOT NULL,
            CONSTRAINT uq_skills_org_id_name UNIQUE (org_id, name)
        )
    """)
    op.execute("CREATE INDEX ix_skills_org_id_category ON skills (org_id, category)")


def downgrade() -> None:
    op.execute("DROP TABLE skills")
