"""Shared fixtures: a migrated test database, the app, tokens, and a real Celery worker.

Isolation: every test gets its own organization id (`org_id`), and all tenant data is keyed by it,
so tests never see each other's rows even though they share one migrated database (and a real
worker process can read what a test wrote, which savepoint rollback would hide).

In parallel (`pytest -n 2`, what `make test` runs) each xdist worker has its own database (a copy of a
migrated template, made fresh at every run), its own VAR_DIR (var/test/<worker>) and its own Celery key
prefix, so the workers share only the embedded PostgreSQL server and the Redis server. Tests that need
the machine to themselves or share a costly module fixture are grouped (`pytest_collection_modifyitems`
below); a plain `pytest` runs everything in one process as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tests never read a developer's .env (app.config, ENV_FILE); the processes they start inherit this.
os.environ["ENV_FILE"] = ""
TEST_SECRET = "test-secret-" + "x" * 40
# "gw0", "gw1", … in an xdist worker (`pytest -n`); "" in a plain run
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_VAR_DIR = os.path.join(ROOT, "var", "test", XDIST_WORKER) if XDIST_WORKER else os.path.join(ROOT, "var", "test")
DATABASE = "platform_gateway_test"
REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"
QUEUES = "default,analytics,embeddings,email,bulk,seed"
# The console scripts of this environment (`.venv/bin/celery`, …), as `make worker` and compose run them:
# `python -m celery` would put the working directory on sys.path and hide an import only it resolves.
BIN = os.path.dirname(sys.executable)
# One key namespace per test run: a worker left over from another run (or another checkout sharing
# the Redis database) can never take this run's tasks.
# (each xdist worker imports this module itself, so each has its own prefix, hence its own queues)
CELERY_KEY_PREFIX = f"test-{XDIST_WORKER + '-' if XDIST_WORKER else ''}{uuid.uuid4().hex[:10]}:"


def _database_url(database: str = DATABASE) -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        from sqlalchemy.engine import make_url

        # the same server; TEST_DATABASE_URL's database name is the stem of the template's and the workers'
        base = make_url(url)
        return base.set(database=database.replace(DATABASE, base.database, 1)).render_as_string(hide_password=False)
    from app.embedded_pg import embedded_url

    # The embedded server lives in var/pg (shared with `make run`); tests use their own database.
    return embedded_url(os.path.join(ROOT, "var"), database)


def _migrate(url: str) -> None:
    from sqlalchemy import create_engine

    from migrations.runner import create_product, upgrade_all

    engine = create_engine(url)
    upgrade_all(engine, "default")
    create_product(engine, "other")
    engine.dispose()


@contextlib.contextmanager
def _file_lock(name: str):
    """An exclusive lock between the processes of this checkout (xdist workers starting together)."""
    directory = os.path.join(ROOT, "var", "test")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _worker_database(run_id: str) -> str:
    """This xdist worker's database: a fresh copy of `<DATABASE>_template`, migrated once per run by the
    first worker to get here (CREATE DATABASE … TEMPLATE copies files: far cheaper than migrating every
    product schema once per worker)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    with _file_lock("template.lock"):
        template_url = make_url(_database_url(f"{DATABASE}_template"))  # starts the embedded server if needed
        template, mine = template_url.database, f"{template_url.database.removesuffix('_template')}_{XDIST_WORKER}"
        admin = create_engine(template_url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                if not conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": template}):
                    conn.execute(text(f'CREATE DATABASE "{template}"'))  # (embedded_url has made it already)
            stamp = os.path.join(ROOT, "var", "test", "template.run")
            done = open(stamp).read() if os.path.exists(stamp) else ""
            if done != f"{template_url.render_as_string()} {run_id}":
                _migrate(template_url.render_as_string(hide_password=False))
                with open(stamp, "w") as fh:
                    fh.write(f"{template_url.render_as_string()} {run_id}")
            with admin.connect() as conn:
                # FORCE: a Celery worker of an interrupted run may still hold a connection
                conn.execute(text(f'DROP DATABASE IF EXISTS "{mine}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{mine}" TEMPLATE "{template}"'))
        finally:
            admin.dispose()
    return template_url.set(database=mine).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url(request) -> str:
    if XDIST_WORKER:
        return _worker_database(request.config.workerinput["testrunuid"])
    url = _database_url()
    _migrate(url)
    return url


def app_config(database_url: str, **extra) -> dict:
    config = {
        "TESTING": True,
        "DATABASE_URL": database_url,
        "JWT_SECRET": TEST_SECRET,
        "VAR_DIR": TEST_VAR_DIR,
        "REDIS_URL": os.environ.get("REDIS_URL", ""),
        "CELERY_KEY_PREFIX": CELERY_KEY_PREFIX,
        "PUBLIC_BASE_URL": "http://gateway.test",
        "LOG_LEVEL": "WARNING",
    }
    config.update(extra)
    return config


@pytest.fixture(scope="session")
def app(database_url):
    from app import create_app
    from tests.support import register_test_routes

    application = create_app(app_config(database_url))
    register_test_routes(application)
    return application


@pytest.fixture()
def make_app(app, database_url):
    """Build a second app with config overrides; the shared Celery app is re-bound to the main
    test app afterwards (Celery configuration is process-global)."""
    from app import create_app
    from app.extensions import celery_app
    from app.tasks import init_celery

    made = []

    def factory(**overrides):
        if "REDIS_URL" in overrides and "CELERY_KEY_PREFIX" not in overrides:
            # another broker is another deployment: its own key prefix, so the session's worker never
            # sends the tasks it left in the shared database's outbox (app.tasks)
            overrides["CELERY_KEY_PREFIX"] = f"test-app-{uuid.uuid4().hex[:8]}:"
        made.append(create_app(app_config(overrides.pop("DATABASE_URL", database_url), **overrides)))
        return made[-1]

    yield factory
    init_celery(celery_app, app)
    # close the pooled connections of the apps this test built (they would stay open until a garbage
    # collection: with several xdist workers on one server, past PostgreSQL's max_connections)
    for made_app in made:
        dispose_database(made_app)


def dispose_database(application) -> None:
    state = application.extensions.get("db")
    if state is not None:
        state.engine.dispose()


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture()
def org_id() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


@pytest.fixture()
def make_token(org_id):
    """make_token(scopes=[...], role=None, product=None, org=<this test's org>, **claim overrides)."""
    from tests.support import token

    def factory(scopes=("read", "write"), **kwargs):
        kwargs.setdefault("org", org_id)
        return token(scopes=scopes, **kwargs)

    return factory


@pytest.fixture()
def auth(make_token):
    """auth(scopes...) -> headers dict with a bearer token for this test's org."""

    def factory(*scopes, **kwargs):
        return {"Authorization": f"Bearer {make_token(scopes=scopes or ('read', 'write'), **kwargs)}"}

    return factory


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("REDIS_URL")
    if not url:
        if REQUIRE_SERVICES:
            pytest.fail("REQUIRE_SERVICES=1 but REDIS_URL is not set")
        pytest.skip("REDIS_URL not set: asynchronous tests need Redis")
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        if REQUIRE_SERVICES:
            pytest.fail(f"Redis at {url} is not reachable: {exc}")
        pytest.skip(f"Redis not reachable: {exc}")
    return url


def dies_with_parent() -> None:
    """`preexec_fn` of a server a test starts: the kernel sends it SIGTERM when the test process that
    started it dies (Linux PR_SET_PDEATHSIG), so a test run killed by a timeout or a signal leaves no
    Celery worker, gunicorn or nginx running behind it. The signal comes when the starting *thread*
    exits: start servers from the test's own thread (fixtures do), not from a helper thread."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def start_worker(database_url: str, redis_url: str, *, prefix: str = CELERY_KEY_PREFIX, extra_env=None,
                 queues: str = QUEUES, concurrency: int = 2, log_name: str = "worker.log"):
    """Start a real `celery -A workers worker` process (its own process group; the `celery` console
    script, as operators run it) against the test database and wait until it answers a ping; returns
    the Popen (`.log_path` names its log)."""
    env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, PUBLIC_BASE_URL="http://gateway.test", LOG_LEVEL="INFO",
               CELERY_KEY_PREFIX=prefix)
    env.update(extra_env or {})
    log_path = os.path.join(TEST_VAR_DIR, log_name)
    os.makedirs(TEST_VAR_DIR, exist_ok=True)
    log = open(log_path, "w")
    hostname = f"test-{uuid.uuid4().hex[:8]}@%h"
    proc = subprocess.Popen(
        [os.path.join(BIN, "celery"), "-A", "workers", "worker", "-Q", queues, "-c", str(concurrency),
         "--loglevel", "INFO", "-n", hostname, "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=dies_with_parent)
    log.close()
    proc.log_path = log_path
    proc.hostname = hostname.replace("%h", socket.gethostname())
    from app.extensions import celery_app

    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited early; see {log_path}")
        replies = celery_app.control.ping(timeout=1.0)
        if any(hostname.split("@")[0] in name for reply in replies for name in reply):
            return proc
    stop_worker(proc)
    raise RuntimeError(f"celery worker did not come up; see {log_path}")


def stop_worker(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)


@pytest.fixture(scope="session")
def celery_worker(database_url, redis_url, app):
    """A real `celery -A workers worker` process on Redis, against the test database."""
    proc = start_worker(database_url, redis_url, extra_env=getattr(app, "worker_env", {}))
    yield proc
    stop_worker(proc)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.2):
    """Poll `predicate` until it returns a truthy value (async tests); fails on timeout, naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"{what}: not met within {timeout} s")


# Under `pytest -n` (`--dist loadgroup`, pyproject's addopts): the units of work an xdist worker takes
# whole. A test module is one unit (its module fixtures are built once, and some of its tests read what
# an earlier one wrote); the deployment suite is one unit (one stack; `stops_stack` tests run last); the
# tests of SPLIT_BY_TEST modules are units of their own (the contract test's shards). The units are
# drawn by this scheduler rather than by `xdist_group` markers: xdist 3.8 marks a test's group in its
# node id, which pytest 9 no longer lets a plugin change, so those markers group nothing.
SPLIT_BY_TEST = ("tests/functional/test_openapi_contract.py",)
# Heaviest units first (measured durations) so that no long unit starts last; the rest keeps its order.
HEAVY_FIRST = (
    "tests/deploy",
    "tests/functional/test_openapi_contract.py",
    "tests/functional/test_semantic_search_api.py",
    "tests/functional/test_console_browser.py",
    "tests/functional/test_email_bulk_api.py",
    "tests/functional/test_entities_shaped_property.py",
    "tests/functional/test_job_durability.py",
    "tests/functional/test_reliability.py",
    "tests/functional/test_embedding_leases.py",
    "tests/functional/test_entities_projection.py",
    "tests/functional/test_entities_filter_property.py",
)


def _module_unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return "tests/deploy" if path.startswith("tests/deploy/") else path


def unit_of(nodeid: str) -> str:
    """The unit of work of a test, by its node id (all the scheduler sees)."""
    module = _module_unit(nodeid)
    return nodeid if module in SPLIT_BY_TEST else module


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (requirements-dev.txt)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist chosen on the command line: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if not XDIST_WORKER:
        return  # a plain run: one process, the collection's order

    def rank(item) -> int:
        module = _module_unit(item.nodeid)
        return HEAVY_FIRST.index(module) if module in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)  # stable: each unit keeps its own order (the deployment suite re-sorts its own)
