"""Flower (it can revoke tasks and shows task arguments) is served only behind basic auth."""

from __future__ import annotations

import base64
import os
import subprocess
import time
import urllib.error
import urllib.request

from tests.conftest import BIN, CELERY_KEY_PREFIX, ROOT, TEST_SECRET, TEST_VAR_DIR, dies_with_parent
from tests.functional.test_email_api import _free_port


def test_compose_requires_flower_credentials_and_binds_loopback():
    with open(os.path.join(ROOT, "docker", "compose.yaml")) as fh:
        text = fh.read()
    flower = text.split("\n  flower:\n", 1)[1].split("\nvolumes:", 1)[0]
    assert "FLOWER_BASIC_AUTH: ${FLOWER_BASIC_AUTH:?" in flower
    assert 'ports: ["127.0.0.1:' in flower and flower.count("ports:") == 1


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_flower_refuses_requests_without_the_credentials(database_url, redis_url):
    port = _free_port()
    env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, JWT_SECRET=TEST_SECRET,
               VAR_DIR=TEST_VAR_DIR, CELERY_KEY_PREFIX=CELERY_KEY_PREFIX, FLOWER_BASIC_AUTH="ops:flower-pass")
    proc = subprocess.Popen([os.path.join(BIN, "celery"), "-A", "workers", "flower", "--address=127.0.0.1",
                             f"--port={port}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=dies_with_parent)
    try:
        url = f"http://127.0.0.1:{port}/api/workers"
        deadline = time.time() + 60
        status = None
        while time.time() < deadline:
            try:
                status = _get(url)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        assert status == 401
        assert _get(url, "ops:wrong") == 401
        assert _get(f"http://127.0.0.1:{port}/", "ops:flower-pass") == 200
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
