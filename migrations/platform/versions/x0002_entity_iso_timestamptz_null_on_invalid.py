"""entity_iso_timestamptz answers NULL for a value it cannot cast (was: an error)

A datetime field can hold a string the API would refuse (`2026-02-30T10:00:00Z`, hour 25) after a
schema change from string to datetime: the filter compiler's regex guard lets such a
string through, and `text::timestamptz` raised on it — in a query that filters or sorts on the field,
in the projection trigger (so any write of such a record failed), in a projection backfill and in a
per-definition index build. The function now checks what the cast checks, with no EXCEPTION block
(a subtransaction per call): the strict ISO 8601 shape with an offset, then the ranges PostgreSQL
enforces — year ≥ 1, month 1-12, the month's days (Gregorian leap years), minute ≤ 59, second ≤ 60,
time of day at most 24:00:00 (so `24:00:00` and `23:59:60` with a zero fraction roll over to the next
day, as the cast does), offset hours ≤ 15 and minutes ≤ 59 — and casts only what passes. An offset
of 16:00 to 23:59 (valid RFC 3339, which the API accepts on write, but beyond the cast's ±15:59) is
applied by hand: such a value raised in every query that compared the field, now it is its instant.
plpgsql, not SQL: the SQL variant of the same checks measured several times slower (the function is
never inlined either way: its body holds the STABLE cast).

Still IMMUTABLE (an offset of hours and minutes subtracted from an instant does not depend on
TimeZone) and the same answer as before for every value the old function cast (checked against
the cast over a grid of boundary values: tests/functional/test_entities_datetime_cast.py). So no
REINDEX: an index entry or projection row exists only for a value the old function cast (for any
other the write, backfill or index build failed), and for those the answer is unchanged. What the
failures left behind — an index INVALID after a failed CREATE INDEX CONCURRENTLY, a projection table
without its `complete` mark — the next index sync drops and rebuilds (app.entities.indexes /
projection); `flask entities sync-indexes` runs it at once.

Revision ID: x0002
Revises: x0001
Create Date: 2026-11-23
"""
from alembic import op

revision = "x0002"
down_revision = "x0001"
branch_labels = None
depends_on = None

ISO_DATETIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?([Zz]|[+-][0-9]{2}:[0-9]{2})$"

NULL_ON_INVALID = f"""CREATE OR REPLACE FUNCTION public.entity_iso_timestamptz(value text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
  y int; mo int; d int; secs int; offset_len int;
BEGIN
  -- the only shape the filter compiler passes: an explicit offset makes the instant independent of
  -- TimeZone and DateStyle (what makes IMMUTABLE honest)
  IF value !~ '{ISO_DATETIME}' THEN
    RETURN NULL;
  END IF;
  y := substr(value, 1, 4)::int;
  mo := substr(value, 6, 2)::int;
  d := substr(value, 9, 2)::int;
  IF y < 1 OR mo < 1 OR mo > 12 OR d < 1 OR d > (CASE WHEN mo IN (4, 6, 9, 11) THEN 30 WHEN mo <> 2 THEN 31
      WHEN y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0) THEN 29 ELSE 28 END) THEN
    RETURN NULL;
  END IF;
  secs := substr(value, 12, 2)::int * 3600 + substr(value, 15, 2)::int * 60 + substr(value, 18, 2)::int;
  IF substr(value, 15, 2)::int > 59 OR substr(value, 18, 2)::int > 60 OR secs > 86400 THEN
    RETURN NULL;
  END IF;
  offset_len := CASE WHEN right(value, 1) IN ('Z', 'z') THEN 1 ELSE 6 END;
  -- 24:00:00 and 23:59:60 are the next midnight; any fraction past it is out of range
  IF secs = 86400 AND ltrim(substr(value, 20, length(value) - 19 - offset_len), '.0') <> '' THEN
    RETURN NULL;
  END IF;
  IF offset_len = 1 OR substr(value, length(value) - 4, 2)::int <= 15 AND right(value, 2)::int <= 59 THEN
    RETURN value::timestamptz;
  END IF;
  -- RFC 3339 allows (and the API takes) offsets up to 23:59; the cast stops at 15:59
  IF substr(value, length(value) - 4, 2)::int > 23 OR right(value, 2)::int > 59 THEN
    RETURN NULL;
  END IF;
  RETURN (left(value, length(value) - 6) || 'Z')::timestamptz
         - (CASE WHEN substr(value, length(value) - 5, 1) = '-' THEN -1 ELSE 1 END)
           * make_interval(hours => substr(value, length(value) - 4, 2)::int, mins => right(value, 2)::int);
END
$fn$"""

RAISE_ON_INVALID = """CREATE OR REPLACE FUNCTION public.entity_iso_timestamptz(value text) RETURNS timestamptz
                  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
                  AS $$ SELECT value::timestamptz $$"""


def upgrade() -> None:
    op.execute(NULL_ON_INVALID)


def downgrade() -> None:
    op.execute(RAISE_ON_INVALID)
