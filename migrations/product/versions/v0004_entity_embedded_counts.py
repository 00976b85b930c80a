"""entity records: an exact, O(1) count of the records with a current vector, per definition and setup

`$similar` without other conditions (and without maxDistance) matches exactly the active records of a
definition stamped with its current vector (v0003: `embedded_hash` = the definition's config_hash and
`embedded_version = version`). Counting them through the partial index of v0003 is O(matches) (8 ms at
100 000). This keeps that number per (org_id, entity_id, embedded_hash) in `entity_embedded_counts`:

- Statement-level AFTER UPDATE / DELETE triggers on entity_records (transition tables; one per event,
  PostgreSQL allows no transition tables on multi-event triggers) add, per statement, one row per key
  whose count moved: +1 for each new row that counts, -1 for each old row that counted. Inserts: a row
  trigger with a WHEN (a new record is stamped only when COPY or a restore writes it so). Every
  writer is covered (API, bulk, the vector stamp of v0003, COPY, an operator's UPDATE/DELETE, cascades),
  in the writer's own transaction: a rollback takes its deltas with it.
- Deltas are *inserted*, never updated in place, so concurrent writers of one definition never wait
  on a shared counter row. The reader sums the key's rows. A writer compacts a key (deletes its rows
  and inserts their sum, one statement) with probability 1/8 per statement, under a transaction-level
  advisory try-lock so that two compactors never wait on each other; a DELETE under READ COMMITTED
  skips rows another compactor already removed and never sees rows it did not, so every delta is
  summed exactly once. A sum of 0 leaves no row (dead definitions and setups disappear).
- TRUNCATE of entity_records empties the counts.
- v0003's partial index of stamped records is dropped (see upgrade()).
- The v0003 stamp trigger on entity_embeddings becomes statement-level too (one UPDATE of the records
  per vector statement instead of one per vector row): with the counter on entity_records, a per-row
  stamp would run the counting trigger once per vector, which made a 100 000-vector COPY ~20x slower.
  Same effect as before, in the same statement: INSERT and UPDATE stamp the records with the new
  rows' (config_hash, record_version) where they differ, DELETE (and an UPDATE that moved a row to
  another record) clears the stamp.

Revision ID: v0004
Revises: v0003
Create Date: 2026-11-23
"""
from alembic import op

revision = "v0004"
down_revision = "v0003"
branch_labels = None
depends_on = None

COUNTED = "is_active IS TRUE AND embedded_hash IS NOT NULL AND embedded_version = version"


def upgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar()
    q = '"' + schema.replace('"', '""') + '"'
    # no write between the backfill and the triggers (a writer locks records, then writes vectors)
    op.execute("LOCK TABLE entity_records, entity_embeddings IN SHARE MODE")
    op.execute("""
        CREATE TABLE entity_embedded_counts (
            org_id        varchar(64) NOT NULL,
            entity_id     varchar(36) NOT NULL,
            embedded_hash varchar(64) NOT NULL,
            n             bigint      NOT NULL
        )""")
    op.execute("CREATE INDEX ix_entity_embedded_counts_key ON entity_embedded_counts (entity_id, embedded_hash) "
               "INCLUDE (org_id, n)")
    op.execute(f"INSERT INTO entity_embedded_counts (org_id, entity_id, embedded_hash, n) "
               f"SELECT org_id, entity_id, embedded_hash, count(*) FROM entity_records WHERE {COUNTED} "
               f"GROUP BY org_id, entity_id, embedded_hash")
    op.execute(f"""
        CREATE FUNCTION {q}.entity_embedded_counts_compact(p_entity text, p_hash text) RETURNS void
        LANGUAGE plpgsql AS $fn$
        BEGIN
          -- one compactor per key at a time; a writer that cannot have the lock just leaves its delta
          IF NOT pg_try_advisory_xact_lock(1952805748, hashtext(p_entity || '/' || p_hash)) THEN
            RETURN;
          END IF;
          WITH gone AS (
            DELETE FROM {q}.entity_embedded_counts WHERE entity_id = p_entity AND embedded_hash = p_hash
            RETURNING org_id, n)
          INSERT INTO {q}.entity_embedded_counts (org_id, entity_id, embedded_hash, n)
          SELECT org_id, p_entity, p_hash, sum(n) FROM gone GROUP BY org_id HAVING sum(n) <> 0;
        END
        $fn$""")
    op.execute(f"""
        CREATE FUNCTION {q}.entity_records_count_embedded() RETURNS trigger LANGUAGE plpgsql AS $fn$
        DECLARE
          k record;
        BEGIN
          -- each branch names only the transition tables its event has
          IF TG_OP = 'DELETE' THEN
            FOR k IN
              INSERT INTO {q}.entity_embedded_counts (org_id, entity_id, embedded_hash, n)
              SELECT org_id, entity_id, embedded_hash, -count(*) FROM old_rows WHERE {COUNTED}
              GROUP BY org_id, entity_id, embedded_hash
              RETURNING entity_id, embedded_hash
            LOOP
              IF random() < 0.125 THEN PERFORM {q}.entity_embedded_counts_compact(k.entity_id, k.embedded_hash); END IF;
            END LOOP;
          ELSE
            FOR k IN
              INSERT INTO {q}.entity_embedded_counts (org_id, entity_id, embedded_hash, n)
              SELECT org_id, entity_id, embedded_hash, sum(d) FROM (
                SELECT org_id, entity_id, embedded_hash, 1 AS d FROM new_rows WHERE {COUNTED}
                UNION ALL
                SELECT org_id, entity_id, embedded_hash, -1 AS d FROM old_rows WHERE {COUNTED}) AS moved
              GROUP BY org_id, entity_id, embedded_hash HAVING sum(d) <> 0
              RETURNING entity_id, embedded_hash
            LOOP
              IF random() < 0.125 THEN PERFORM {q}.entity_embedded_counts_compact(k.entity_id, k.embedded_hash); END IF;
            END LOOP;
          END IF;
          RETURN NULL;
        END
        $fn$""")
    # Inserts: a new record is never stamped (its vector comes later, by UPDATE), except from COPY/restore
    # tools. A row trigger whose WHEN is false costs nothing, where a statement trigger with a transition
    # table copies every inserted row (+20 % on a 20 000-row insert).
    op.execute(f"""
        CREATE FUNCTION {q}.entity_records_count_embedded_insert() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
          INSERT INTO {q}.entity_embedded_counts (org_id, entity_id, embedded_hash, n)
          VALUES (NEW.org_id, NEW.entity_id, NEW.embedded_hash, 1);
          IF random() < 0.125 THEN PERFORM {q}.entity_embedded_counts_compact(NEW.entity_id, NEW.embedded_hash); END IF;
          RETURN NULL;
        END
        $fn$""")
    counted_new = " AND ".join(f"NEW.{c}" for c in ("is_active IS TRUE", "embedded_hash IS NOT NULL",
                                                     "embedded_version = NEW.version"))
    op.execute(f"CREATE TRIGGER entity_records_count_embedded_ins AFTER INSERT ON {q}.entity_records "
               f"FOR EACH ROW WHEN ({counted_new}) EXECUTE FUNCTION {q}.entity_records_count_embedded_insert()")
    fn = f"{q}.entity_records_count_embedded()"
    op.execute(f"CREATE TRIGGER entity_records_count_embedded_upd AFTER UPDATE ON {q}.entity_records "
               f"REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}")
    op.execute(f"CREATE TRIGGER entity_records_count_embedded_del AFTER DELETE ON {q}.entity_records "
               f"REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}")
    op.execute(f"""
        CREATE FUNCTION {q}.entity_records_count_embedded_truncate() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
          DELETE FROM {q}.entity_embedded_counts;
          RETURN NULL;
        END
        $fn$""")
    op.execute(f"CREATE TRIGGER entity_records_count_embedded_trunc AFTER TRUNCATE ON {q}.entity_records "
               f"FOR EACH STATEMENT EXECUTE FUNCTION {q}.entity_records_count_embedded_truncate()")
    _statement_level_stamp(q)
    # v0003's partial index of stamped rows counted a lone `$similar`; the counter does that now. With a
    # filter the planner ANDed it with the filter's index (reading all of a definition's entries: 40 ms
    # against 21 ms for the filter's bitmap and a heap check of the stamp, 10 000 of 100 000 records), and it
    # kept every stamp write from being a HOT update.
    op.execute("DROP INDEX IF EXISTS ix_entity_records_embedded_current")


def _statement_level_stamp(q: str) -> None:
    op.execute("DROP TRIGGER IF EXISTS entity_embeddings_stamp ON entity_embeddings")
    op.execute(f"""
        CREATE FUNCTION {q}.entity_embeddings_stamp_rows() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
          IF TG_OP IN ('INSERT', 'UPDATE') THEN
            UPDATE {q}.entity_records r SET embedded_hash = n.config_hash, embedded_version = n.record_version
              FROM new_rows n
             WHERE r.id = n.record_id AND (r.embedded_hash IS DISTINCT FROM n.config_hash
                                           OR r.embedded_version IS DISTINCT FROM n.record_version);
          END IF;
          IF TG_OP = 'DELETE' THEN
            UPDATE {q}.entity_records r SET embedded_hash = NULL, embedded_version = NULL FROM old_rows o
             WHERE r.id = o.record_id AND r.embedded_hash IS NOT NULL;
          ELSIF TG_OP = 'UPDATE' THEN  -- a row moved to another record: the old record has no vector now
            UPDATE {q}.entity_records r SET embedded_hash = NULL, embedded_version = NULL FROM old_rows o
             WHERE r.id = o.record_id AND r.embedded_hash IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.record_id = o.record_id);
          END IF;
          RETURN NULL;
        END
        $fn$""")
    fn = f"{q}.entity_embeddings_stamp_rows()"
    op.execute(f"CREATE TRIGGER entity_embeddings_stamp_ins AFTER INSERT ON {q}.entity_embeddings "
               f"REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}")
    op.execute(f"CREATE TRIGGER entity_embeddings_stamp_upd AFTER UPDATE ON {q}.entity_embeddings "
               f"REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}")
    op.execute(f"CREATE TRIGGER entity_embeddings_stamp_del AFTER DELETE ON {q}.entity_embeddings "
               f"REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}")


def downgrade() -> None:
    schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar()
    q = '"' + schema.replace('"', '""') + '"'
    op.execute("CREATE INDEX IF NOT EXISTS ix_entity_records_embedded_current ON entity_records (entity_id, "
               "embedded_hash) INCLUDE (org_id, is_active, version, embedded_version) "
               "WHERE embedded_version = version AND is_active IS TRUE")
    for name in ("ins", "upd", "del"):
        op.execute(f"DROP TRIGGER IF EXISTS entity_embeddings_stamp_{name} ON entity_embeddings")
    op.execute("DROP FUNCTION IF EXISTS entity_embeddings_stamp_rows()")
    op.execute("CREATE TRIGGER entity_embeddings_stamp AFTER INSERT OR DELETE OR UPDATE OF config_hash, "
               f"record_version ON {q}.entity_embeddings FOR EACH ROW EXECUTE FUNCTION {q}.entity_embeddings_stamp()")
    for name in ("ins", "upd", "del", "trunc"):
        op.execute(f"DROP TRIGGER IF EXISTS entity_records_count_embedded_{name} ON entity_records")
    op.execute("DROP FUNCTION IF EXISTS entity_records_count_embedded_truncate()")
    op.execute("DROP FUNCTION IF EXISTS entity_records_count_embedded_insert()")
    op.execute("DROP FUNCTION IF EXISTS entity_records_count_embedded()")
    op.execute("DROP FUNCTION IF EXISTS entity_embedded_counts_compact(text, text)")
    op.execute("DROP TABLE IF EXISTS entity_embedded_counts")
