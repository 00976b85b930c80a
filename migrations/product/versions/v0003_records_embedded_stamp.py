"""entity records: which vector a record has (`embedded_hash`, `embedded_version`), so `$similar` counts
without joining the vectors

A record is a match of `$similar` (without maxDistance) iff its entity_embeddings row has the
definition's current `config_hash` and `record_version` = the record's version. A trigger on
entity_embeddings mirrors that pair onto the record itself (same statement as any vector write, whoever
writes: pipeline, COPY, an operator's DELETE; NULL when the vector is deleted), so the exact totalCount
is a count of entity_records through a partial index of the current rows: an index-only scan, no join.
A record update bumps `version` and so makes the stamp stale exactly as it makes the vector stale
(docs/decisions.md, "Semantic search: exact totalCount").

Revision ID: v0003
Revises: v0002
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = "v0003"
down_revision = "v0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("entity_records", sa.Column("embedded_hash", sa.String(64), nullable=True))
    op.add_column("entity_records", sa.Column("embedded_version", sa.Integer, nullable=True))
    op.execute("UPDATE entity_records r SET embedded_hash = e.config_hash, embedded_version = e.record_version "
               "FROM entity_embeddings e WHERE e.record_id = r.id")
    schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar()
    q = '"' + schema.replace('"', '""') + '"'
    op.execute(f"""
        CREATE FUNCTION {q}.entity_embeddings_stamp() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
          IF TG_OP = 'DELETE' THEN
            UPDATE {q}.entity_records SET embedded_hash = NULL, embedded_version = NULL
             WHERE id = OLD.record_id AND embedded_hash IS NOT NULL;
            RETURN OLD;
          END IF;
          UPDATE {q}.entity_records SET embedded_hash = NEW.config_hash, embedded_version = NEW.record_version
           WHERE id = NEW.record_id AND (embedded_hash IS DISTINCT FROM NEW.config_hash
                                         OR embedded_version IS DISTINCT FROM NEW.record_version);
          RETURN NEW;
        END
        $fn$""")
    op.execute("CREATE TRIGGER entity_embeddings_stamp AFTER INSERT OR DELETE OR UPDATE OF config_hash, "
               f"record_version ON {q}.entity_embeddings FOR EACH ROW EXECUTE FUNCTION {q}.entity_embeddings_stamp()")
    op.execute("CREATE INDEX ix_entity_records_embedded_current ON entity_records (entity_id, embedded_hash) "
               "INCLUDE (org_id, is_active, version, embedded_version) "
               "WHERE embedded_version = version AND is_active IS TRUE")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_entity_records_embedded_current")
    op.execute("DROP TRIGGER IF EXISTS entity_embeddings_stamp ON entity_embeddings")
    op.execute("DROP FUNCTION IF EXISTS entity_embeddings_stamp()")
    op.drop_column("entity_records", "embedded_version")
    op.drop_column("entity_records", "embedded_hash")
