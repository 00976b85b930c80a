"""The stack's ingress alone (stack/nginx.conf as `make stack` renders it), in front of API ports where
nothing listens: the client gets a clean 503 in the API's envelope, at once, never a hang or nginx's page."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from stack import free_port
from tests.conftest import ROOT, dies_with_parent
from tests.deploy.conftest import _need_tools


@pytest.fixture()
def lone_ingress():
    _need_tools()
    from stack import Stack, prepare

    directory = os.path.join(ROOT, "var", "test", f"ingress-{os.getpid()}")
    shutil.rmtree(directory, ignore_errors=True)
    stack = Stack.from_env({"STACK_DIR": directory, "STACK_PORT": str(free_port()),
                            "STACK_API_PORT": str(free_port(pair=True)), "STACK_API_PROCESSES": "2"})
    prepare(stack, {"ENV_FILE": ""})
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen([nginx, "-c", os.path.join(directory, "nginx", "nginx.conf"), "-e", "stderr"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=dies_with_parent)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                urllib.request.urlopen(stack.public_url + "/health", timeout=2)
            except urllib.error.HTTPError:
                break  # answering (503: nothing behind it)
            except OSError:
                time.sleep(0.1)
        yield stack
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def test_no_api_process_answering_is_a_clean_503_in_the_envelope(lone_ingress):
    """Either pool: the API upstream, and the image route's own."""
    for method, path, body in (("GET", "/api/v1/me", None), ("POST", "/api/v1/me", b'{"a": 1}'),
                               ("POST", "/api/v1/agents/images", b'{"a": 1}')):
        request = urllib.request.Request(lone_ingress.public_url + path, data=body, method=method,
                                         headers={"Content-Type": "application/json", "X-Request-ID": "rid-1"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        answer = refused.value
        assert answer.code == 503 and answer.headers["Retry-After"] == "5"
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.headers["X-Request-ID"] == "rid-1"
        envelope = json.loads(answer.read())
        assert envelope["error"]["code"] == "SERVICE_UNAVAILABLE"
        assert envelope["metadata"]["success"] is False and isinstance(envelope["metadata"]["timestamp"], int)
