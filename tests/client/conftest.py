"""The Python client (clients/python, `platform_gateway_client`) against the real service: gunicorn with
docker/gunicorn.conf.py serving `wsgi:app` (what `make run` serves) on a free loopback port, on this
worker's test database, with a real Celery worker when REDIS_URL is set (eager tasks otherwise).

The only stand-in is provider-a's upstream (tests.images_fakes, a third-party API), so that image calls
and their 503-with-Retry-After can be produced on purpose. Rate limits of the aggregate group are
small here (2 per 5 s) so that a 429 with `Retry-After` is reachable with a few calls.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import CELERY_KEY_PREFIX, ROOT, TEST_SECRET, TEST_VAR_DIR, dies_with_parent
from tests.images_fakes import FakeAzureImages
from tests.support import token

try:
    import platform_gateway_client  # noqa: F401  (`make install`: pip install --no-deps -e clients/python)
except ImportError:  # a venv made before the client existed: test the source tree (installability: test_packaging)
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from platform_gateway_client import Client, RetryPolicy

INTERNAL_TOKEN = "client-internal-" + "k" * 32
AGGREGATE_LIMIT = "2/5"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, url: str, fake_a: FakeAzureImages, log_path: str) -> None:
        self.url = url
        self.fake_a = fake_a
        self.log_path = log_path


@pytest.fixture(scope="session")
def fake_provider_a() -> Iterator[FakeAzureImages]:
    fake = FakeAzureImages()
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def gateway(request, database_url, fake_provider_a) -> Iterator[Gateway]:
    """The API as deployed (gunicorn, gthread workers) on a free port; stopped after the session."""
    redis_url = os.environ.get("REDIS_URL", "")
    if redis_url:
        request.getfixturevalue("celery_worker")  # the asynchronous paths run on a real worker
    port = _free_port()
    env = dict(os.environ, PORT=str(port), DATABASE_URL=database_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, REDIS_URL=redis_url, CELERY_KEY_PREFIX=CELERY_KEY_PREFIX,
               PUBLIC_BASE_URL=f"http://127.0.0.1:{port}", LOG_LEVEL="WARNING", WEB_CONCURRENCY="1",
               GUNICORN_THREADS="16", INTERNAL_API_TOKEN=INTERNAL_TOKEN, RATE_LIMIT_AGGREGATE=AGGREGATE_LIMIT,
               PROVIDER_A_ENDPOINT=fake_provider_a.url, PROVIDER_A_API_KEY=FakeAzureImages.API_KEY,
               PROVIDER_A_API_VERSION=FakeAzureImages.GENERATION_VERSION,
               PROVIDER_A_EDIT_API_VERSION=FakeAzureImages.EDIT_VERSION,
               PROVIDER_A_LEGACY_DEPLOYMENTS="legacy-images")
    os.makedirs(TEST_VAR_DIR, exist_ok=True)
    log_path = os.path.join(TEST_VAR_DIR, "client-gunicorn.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "-c",
                                 "docker/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}", "wsgi:app"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=dies_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gunicorn exited early; see {log_path}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"gunicorn did not answer /health; see {log_path}")
                time.sleep(0.2)
        yield Gateway(url, fake_provider_a, log_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the process group this fixture started
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


class Sent:
    """What a client put on the wire (an httpx event hook: observation, nothing is changed)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.responses: list[httpx.Response] = []

    def on_request(self, req: httpx.Request) -> None:
        self.requests.append(req)

    def on_response(self, resp: httpx.Response) -> None:
        self.responses.append(resp)

    async def on_request_async(self, req: httpx.Request) -> None:
        self.requests.append(req)

    async def on_response_async(self, resp: httpx.Response) -> None:
        self.responses.append(resp)

    def hooks(self) -> dict:
        return {"request": [self.on_request], "response": [self.on_response]}

    def async_hooks(self) -> dict:
        return {"request": [self.on_request_async], "response": [self.on_response_async]}

    def paths(self, method: str | None = None) -> list[str]:
        return [r.url.path for r in self.requests if method is None or r.method == method]


class Sleeps(list):
    """The waits a client asked for, in seconds; really waits (the server's Retry-After must pass)."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        time.sleep(seconds)

    async def async_sleep(self, seconds: float) -> None:
        import asyncio

        self.append(seconds)
        await asyncio.sleep(seconds)


@pytest.fixture()
def sent() -> Sent:
    return Sent()


@pytest.fixture()
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture()
def make_client(gateway, org_id, sent, sleeps):
    """make_client(token=…, retry=…, **Client kwargs): a Client of this test's org on the live gateway,
    its requests recorded in `sent`, its waits in `sleeps`."""
    made: list[Client] = []

    def factory(tok=None, *, scopes=("read", "write"), role=None, retry=None, **kwargs) -> Client:
        if tok is None:
            tok = token(org=org_id, scopes=scopes, role=role)
        http = httpx.Client(base_url=gateway.url, event_hooks=sent.hooks(), timeout=30)
        client = Client(token=tok, http=http, retry=retry or RetryPolicy(backoff_base=0.05), sleep=sleeps,
                        **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        client._http.close()


@pytest.fixture()
def api(make_client) -> Client:
    return make_client()
