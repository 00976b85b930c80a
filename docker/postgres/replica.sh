#!/bin/sh
# compose's `postgres-replica` (profile `replica`): a streaming replica (hot standby) of the `postgres`
# service through the physical replication slot gateway_replica, which keeps on the primary every WAL
# segment the replica has not received yet (a replica stopped for a while catches up; docs/operations.md,
# "Read replica", says what a slot left behind costs and how to drop it). The first start copies the
# primary (pg_basebackup -R: the standby's settings, primary_slot_name among them); later starts replay
# from where the copy stands. Runs as the image's postgres user.
set -eu
export PGPASSWORD="$POSTGRES_PASSWORD"
PRIMARY="host=postgres port=5432 user=gateway dbname=gateway"
SLOT=gateway_replica
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    psql "$PRIMARY" -v ON_ERROR_STOP=1 -qAt -c "SELECT pg_create_physical_replication_slot('$SLOT', true)
        WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$SLOT')" >/dev/null
    pg_basebackup -d "$PRIMARY" -D "$PGDATA" -R -X stream -c fast -S "$SLOT"
    echo "hot_standby_feedback = on" >> "$PGDATA/postgresql.auto.conf"
    chmod 700 "$PGDATA"
fi
exec postgres
