"""entity projections: statistics target 300 on the folded text columns of existing projections

The planner estimates a substring match on a projection's folded column (`l_…`, lower() of a short
text field) from the column's histogram; with the default 100 entries a term in 1 % of the rows is
estimated at 10 rows after about one ANALYZE in three, and the page query then picks a plan that reads
every match. New projections get target 300 when their table is created (app.entities.projection,
FOLDED_STATISTICS); this sets it on the tables built before, and analyzes them so that the estimate
holds at once (ANALYZE reads a sample, not the table). The tables keep their names: no rebuild.

Revision ID: p0003
Revises: p0002
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "p0003"
down_revision = "p0002"
branch_labels = None
depends_on = None

TARGET = 300  # app.entities.projection.FOLDED_STATISTICS (a migration keeps its own copy)
_FOLDED = sa.text(
    "SELECT c.relname, a.attname, a.attstattarget FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE 'erp\\_%' "
    "AND a.attname LIKE 'l\\_%' AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _set(target: int | None) -> None:
    conn = op.get_bind()
    tables: dict[str, list[str]] = {}
    for table, column, have in conn.execute(_FOLDED):
        if (have if have is not None and have >= 0 else None) != target:
            tables.setdefault(table, []).append(column)
    for table, columns in tables.items():
        value = target if target is not None else -1  # -1: back to default_statistics_target
        conn.execute(sa.text(f"ALTER TABLE {_quote(table)} " + ", ".join(
            f"ALTER COLUMN {_quote(c)} SET STATISTICS {value}" for c in columns)))
        conn.execute(sa.text(f"ANALYZE {_quote(table)}"))


def upgrade() -> None:
    _set(TARGET)


def downgrade() -> None:
    _set(None)
