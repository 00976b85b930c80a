#!/bin/sh
# /docker-entrypoint-initdb.d of compose's `postgres` (run once, when its volume is initialised): admit
# replication connections from the compose network (the `postgres-replica` service, profile `replica`),
# with the password as every other connection. A volume initialised before this file existed: append the
# same line to $PGDATA/pg_hba.conf and `SELECT pg_reload_conf()` (docs/operations.md, "Read replica").
set -eu
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
