"""The servers a test starts go down with the test process (tests/conftest.py `dies_with_parent`): a
run killed by CI's timeout or a signal must not leave Celery workers or gunicorn masters behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT

PARENT = """
import subprocess, sys
from tests.conftest import dies_with_parent
child = subprocess.Popen(["sleep", "60"], start_new_session=True, preexec_fn=dies_with_parent if {use} else None)
print(child.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _orphan_after_parent_killed(use: bool) -> tuple[int, bool]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(use=use)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()  # SIGKILL: no cleanup code of the parent runs
    parent.wait(10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    return child, _alive(child)


def test_a_server_started_with_dies_with_parent_ends_when_the_test_process_is_killed():
    _child, alive = _orphan_after_parent_killed(True)
    assert not alive


def test_without_it_the_server_would_outlive_the_test_process():
    child, alive = _orphan_after_parent_killed(False)
    try:
        assert alive  # what the hook prevents (and proof that the check above can fail)
    finally:
        if alive:
            os.kill(child, signal.SIGKILL)
