"""entity store index support: pg_trgm and an IMMUTABLE ISO date-time cast

- `pg_trgm` (in `public`, like `vector`): the per-definition trigram indexes that answer `$contains` /
  `$startsWith` / `$endsWith` on text fields (app.entities.indexes).
- `public.entity_iso_timestamptz(text)`: `text::timestamptz` declared IMMUTABLE, so a datetime field's
  typed expression can be indexed. Honest only because the filter compiler calls it on strings that
  match the ISO 8601 pattern *with* an offset (Z or ±hh:mm): such a string denotes the same instant
  whatever the session's TimeZone or DateStyle.

Revision ID: x0001
Revises: p0001
Create Date: 2026-11-23
"""
from alembic import op

revision = "x0001"
down_revision = "p0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm WITH SCHEMA public")
    op.execute("""CREATE OR REPLACE FUNCTION public.entity_iso_timestamptz(value text) RETURNS timestamptz
                  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
                  AS $$ SELECT value::timestamptz $$""")


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS public.entity_iso_timestamptz(text)")
