"""The deployment suite's stack: `python -m stack up` (what `make stack` runs) on free ports under
var/test/stack-<worker>, started once for this package's tests and stopped after the last of them (it
also stops by itself when this process dies or after STACK_MAX_SECONDS). Tests talk to it only as
operators do: HTTP through the ingress, Flower's API, and the console scripts (`flask`, `celery`) with
the stack's settings file."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from stack import free_port
from tests.conftest import REQUIRE_SERVICES, ROOT, dies_with_parent

BIN = os.path.dirname(sys.executable)
# a safety net (the stack also stops when this process dies): the package takes about 12 min alone, more
# beside the rest of a parallel suite
STACK_LIFETIME_SECONDS = 2400
FIGURES = os.path.join(ROOT, "var", "test", "deploy-figures.json")


def pytest_configure(config):
    config.addinivalue_line("markers", "stops_stack: stops part of the session's stack; runs after every other test")


def pytest_collection_modifyitems(config, items):
    """A test that stops part of the stack runs after the other tests of this package (honcho stops the
    whole stack when one process exits); the rest of the session keeps its order."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    mine = [i for i, item in enumerate(items) if str(item.path).startswith(here)]
    if mine:
        block = [items[i] for i in mine]
        block.sort(key=lambda item: item.get_closest_marker("stops_stack") is not None)
        for i, item in zip(mine, block, strict=True):
            items[i] = item


def _scrubbed_environ() -> dict[str, str]:
    """This process's environment without any setting of the app or the stack (CI exports REDIS_URL
    for the functional tests; the stack's processes must see only the stack's own)."""
    from app.config import SETTINGS
    from stack import SECRETS
    from stack import SETTINGS as STACK_SETTINGS

    drop = set(SETTINGS) | set(STACK_SETTINGS) | set(SECRETS) | {"PORT", "FLOWER_ADDRESS", "CELERY_KEY_PREFIX",
                                                                 "API_THREADS", "IMAGES_THREADS"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("FLOWER_", "STACK_"))}


class StackHandle:
    def __init__(self, proc, directory: str, env: dict[str, str], log_path: str, fake_images):
        from stack import Stack, read_env_file

        self.proc = proc
        self.dir = directory
        self.log_path = log_path
        self.fake_images = fake_images
        self.settings = Stack.from_env(env)
        self.env = read_env_file(self.settings.env_file)  # what an operator sources
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self.flower = f"http://127.0.0.1:{self.settings.flower_port}"

    # -- operators' tools ------------------------------------------------------------------------------
    def cli(self, *argv: str, timeout: float = 120, cwd: str = ROOT, env=None) -> subprocess.CompletedProcess:
        """A console script of this environment (`flask`, `celery`) as the docs give it, with the stack's
        settings file: `ENV_FILE=var/stack/stack.env flask …` (nothing else of the stack exported)."""
        env = {**_scrubbed_environ(), **(env or {"ENV_FILE": self.settings.env_file})}
        return subprocess.run([os.path.join(BIN, argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)

    def http(self, method: str, path: str, body=None, headers=None, timeout: float = 30):
        """(status, headers, parsed JSON or raw bytes) of a request through the ingress."""
        data = None
        headers = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status, resp.headers, _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, _decode(exc.read())

    def flower_get(self, path: str, auth: str | None = None, timeout: float = 15):
        request = urllib.request.Request(self.flower + path)
        if auth:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def gunicorn_master(self, process: str) -> int:
        """The pid of the latest gunicorn master of honcho process `api.N` (from its "Listening at" line)."""
        found = re.findall(rf"^\S+ {re.escape(process)}\s+\|.*Listening at: \S+ \((\d+)\)", self.log(), re.M)
        assert found, f"no gunicorn master for {process} in {self.log_path}"
        return int(found[-1])

    def node(self, process: str):
        """The node `api.N` / `worker.N` / `worker-embeddings.N` (stack.Node: its runsv directory, its pid)."""
        from stack import nodes

        return next(node for node in nodes(self.settings) if node.process == process)

    def started_pid(self, process: str) -> int:
        """The pid honcho started for `process` (what a container's PID 1 is: for a node, its runsv)."""
        match = re.search(rf"\| {re.escape(process)} started \(pid=(\d+)\)", self.log())
        assert match, f"{process} not started in {self.log_path}"
        return int(match.group(1))

    def served_by(self, request_id: str) -> str | None:
        """The honcho process (`api.1`, `api-images.2`, …) whose gunicorn logged the request with this
        X-Request-ID (its access line ends `rid=<id>`), or None while no line names it."""
        match = re.search(rf"^\S+ (\S+)\s+\|.* rid={re.escape(request_id)}$", self.log(), re.M)
        return match.group(1) if match else None

    def honcho_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"started \(pid=(\d+)\)", self.log())]

    def processes(self) -> dict[int, str]:
        """Every process of the stack now: `stack up` and everything below it (honcho, runsv, the nodes in
        their own process groups, PostgreSQL, nginx's workers…), pid -> its start time (pids are reused)."""
        from stack.__main__ import _descendants

        found = {}
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
            started = _start_time(pid)
            if started is not None:
                found[pid] = started
        return found

    def stop(self) -> float | None:
        """SIGTERM to `stack up` (the nodes drain, then honcho stops the rest); SIGKILL to what is left after
        200 s (above the nodes' stop bound). Returns how long the stack took to stop, or None when it had
        already stopped."""
        if self.proc.poll() is not None:
            return None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(200)
        except subprocess.TimeoutExpired:
            pass
        stopped = time.monotonic() - start
        self.kill_leftovers()
        self.proc.wait(10)
        return stopped

    def node_pids(self) -> list[int]:
        from stack import nodes

        return [pid for pid in (node.pid() for node in nodes(self.settings)) if pid]

    def kill_leftovers(self) -> None:
        """SIGKILL to every process group of the stack still there: honcho's processes' (each its own) and
        the nodes' (each its own, under its runsv)."""
        for pid in [self.proc.pid, *self.honcho_pids(), *self.node_pids()]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _start_time(pid: int) -> str | None:
    """A live process's start time (field 22 of /proc/PID/stat), None once it has exited (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def still_running(processes: dict[int, str]) -> list[int]:
    """The processes of `processes` (pid -> start time, StackHandle.processes) still running."""
    return [pid for pid, started in processes.items() if _start_time(pid) == started]


def _decode(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def record_figure(name: str, value) -> None:
    """Measured figures of the suite (var/test/deploy-figures.json), for docs and reports."""
    figures = {}
    if os.path.exists(FIGURES):
        with open(FIGURES) as fh:
            figures = json.load(fh)
    figures[name] = value
    os.makedirs(os.path.dirname(FIGURES), exist_ok=True)
    with open(FIGURES, "w") as fh:
        json.dump(figures, fh, indent=1, sort_keys=True)


def _need_tools() -> None:
    from stack import missing_tools

    missing = missing_tools()
    if missing:
        message = f"{', '.join(missing)} not installed (make stack-tools)"
        if REQUIRE_SERVICES:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="package")
def fake_images():
    """provider-a (Azure OpenAI images) on loopback, answering after `delay` seconds: the stack's
    long-running request (an image call holds its API thread while the upstream works). The delay is
    above the 10 s after which the drain test calls a new request hung: a request that waits for the
    drain to end (queued on the stopping process) is caught as one."""
    from tests.images_fakes import FakeAzureImages, Reply

    class SlowAzureImages(FakeAzureImages):
        delay = 12.0

        def success(self, request):
            reply = super().success(request)
            return Reply(reply.status, reply.body, reply.headers, delay=self.delay)

    fake = SlowAzureImages()
    yield fake
    fake.close()


@pytest.fixture(scope="package")
def stack(fake_images):
    """The package's stack: two API nodes, two image nodes, two worker nodes of each group (NODES=2)."""
    _need_tools()
    with started_stack(f"stack-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", fake_images) as handle:
        yield handle


@contextlib.contextmanager
def started_stack(name: str, fake_images, **settings: str):
    """`python -m stack up` under var/test/<name> on free ports (the package's settings, then `settings`),
    until it answers through every node; stopped on the way out (stop() reports how long that took)."""
    from tests.images_fakes import FakeAzureImages

    directory = os.path.join(ROOT, "var", "test", name)
    # PostgreSQL's data survives runs (initdb and the first migration are the slow part of a start);
    # everything else starts empty, as a new deployment's Redis and files do (a replica is copied anew)
    for sub in ("redis", "nginx", "blobs", "outbox", "stack.env", "pg-replica"):
        path = os.path.join(directory, sub)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    env = {
        **_scrubbed_environ(),
        "STACK_DIR": directory,
        "STACK_PORT": str(free_port()),
        "STACK_API_PORT": str(free_port(pair=True)),
        "STACK_API_PROCESSES": "2",
        "STACK_WORKER_NODES": "2",
        "STACK_PG_PORT": str(free_port()),
        "STACK_REDIS_PORT": str(free_port()),
        "FLOWER_PORT": str(free_port()),
        "ENV_FILE": "",  # not the developer's .env: the test stack has only its own settings
        "STACK_PARENT_PID": str(os.getpid()),
        "STACK_MAX_SECONDS": str(STACK_LIFETIME_SECONDS),
        # one gunicorn worker per API process: the drain test stops one process while the other serves
        "WEB_CONCURRENCY": "1",
        # two image nodes of 4 threads each, and API nodes of 4 threads: ten image calls hold every thread
        # of either pool (the pools test); one image node can stop while the other serves (the drain test)
        "STACK_IMAGES_PROCESSES": "2",
        "IMAGES_THREADS": "4",
        "API_THREADS": "4",
        # test_nodes: a job of a killed worker node is re-queued within seconds, not a minute; one group's
        # rate limit low enough to be reached through two API nodes
        "JOB_LEASE_SECONDS": "5",
        "OUTBOX_DISPATCH_INTERVAL_SECONDS": "1",
        "RATE_LIMIT_AGGREGATE": "6/3600",
        "PROVIDER_A_ENDPOINT": fake_images.url,
        "PROVIDER_A_API_KEY": FakeAzureImages.API_KEY,
        "PROVIDER_A_API_VERSION": FakeAzureImages.GENERATION_VERSION,
        "PROVIDER_A_EDIT_API_VERSION": FakeAzureImages.EDIT_VERSION,
        **settings,
    }
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(directory, "stack.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "stack", "up"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=dies_with_parent)
    started = time.monotonic()
    handle = None
    try:
        handle = _wait_until_up(proc, env, log_path, fake_images)
        record_figure(f"{name.split('-')[0]}_start_seconds", round(time.monotonic() - started, 1))
        yield handle
    finally:
        if handle is None:
            handle = StackHandle(proc, directory, env, log_path, fake_images)
        stopped = handle.stop()
        if stopped is not None:
            record_figure(f"{name.split('-')[0]}_stop_seconds", round(stopped, 1))


def _wait_until_up(proc, env, log_path, fake_images, timeout: float = 240) -> StackHandle:
    """Ready: the ingress answers /health 200 through every API process, and Flower (with its login)
    lists every worker node of both groups."""
    directory = env["STACK_DIR"]
    deadline = time.monotonic() + timeout
    handle = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the stack exited early (rc={proc.returncode}); see {log_path}")
        if handle is None and os.path.exists(os.path.join(directory, "stack.env")):
            handle = StackHandle(proc, directory, env, log_path, fake_images)
        if handle is not None and _ready(handle):
            return handle
        time.sleep(1)
    raise RuntimeError(f"the stack did not come up in {timeout} s; see {log_path}")


def _ready(handle: StackHandle) -> bool:
    try:
        for port in handle.settings.api_ports + handle.settings.images_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as resp:
                if resp.status != 200:
                    return False
        status, _headers, _body = handle.http("GET", "/health", timeout=3)
        if status != 200:
            return False
        status, workers = handle.flower_get("/api/workers?refresh=1", handle.env["FLOWER_BASIC_AUTH"])
        groups = [name.split("@")[0] for name in workers] if status == 200 else []
        return all(groups.count(group) >= handle.settings.worker_nodes for group in ("worker", "worker-embeddings"))
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return False
