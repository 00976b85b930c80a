"""Stopping the whole stack (Ctrl-C or SIGTERM to `make stack`) while it serves: the session's stack
(two API nodes, two image nodes, two worker nodes of each group, each under its runsv) gets SIGTERM with an
image call in flight. Runs last: it stops the stack."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
import uuid

import pytest

from tests.conftest import wait_for
from tests.deploy.conftest import record_figure, still_running
from tests.deploy.test_stack import domain, signed

# honcho's kill timeout (honcho.manager.KILL_WAIT): what is still running that long after honcho began
# stopping gets SIGKILL
HONCHO_KILL_WAIT = 5


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.stops_stack
def test_sigterm_stops_every_process_of_the_stack_after_the_requests_in_flight(stack):
    """An image call waits on the provider (the fake answers after 12 s, more than honcho's 5 s) when the
    stack gets SIGTERM: the call is answered 200 through the ingress; the stack exits by itself (status 0)
    without honcho's SIGKILL, no node is started again by its runsv while the stack stops, and not one
    process of the stack is left."""
    from honcho.manager import KILL_WAIT

    assert KILL_WAIT == HONCHO_KILL_WAIT
    admin = signed(stack, domain(), scopes=["write:image-gen", "read"])
    before = len(stack.fake_images.received)
    answer: dict[str, object] = {}

    def image_call():
        request_id = f"stop-{uuid.uuid4().hex}"
        try:
            status, _h, body = stack.http("POST", "/api/v1/agents/images", {"provider": "provider-a",
                                          "model": "gpt-image-1", "prompt": "a fox at dusk"},
                                          headers={**admin, "X-Request-ID": request_id}, timeout=120)
            answer.update(status=status, body=body, at=time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a cut connection is the failure this test looks for
            answer.update(status=repr(exc), at=time.monotonic())

    call = threading.Thread(target=image_call)
    call.start()
    wait_for(lambda: len(stack.fake_images.received) > before, 30, "the image call waiting upstream", interval=0.05)
    processes = stack.processes()
    assert len(processes) > 20, processes
    log_at_signal = len(stack.log())
    signalled = time.monotonic()
    stack.proc.send_signal(signal.SIGTERM)
    try:
        status = stack.proc.wait(200)  # a hang guard: the nodes' stop bound (150 s) and honcho's 5 s
    except subprocess.TimeoutExpired:
        pytest.fail(f"the stack did not stop within 200 s; see {stack.log_path}")
    stopped = time.monotonic() - signalled
    call.join(60)
    log = stack.log()[log_at_signal:]
    assert answer.get("status") == 200, (answer, log[-3000:])
    assert answer["body"]["data"]["mimeType"] == "image/png"
    assert status == 0, log[-3000:]
    # honcho never reached its kill timeout: what it stopped (the ingress, the databases, Flower, the runsv
    # of each node, whose node was already down) was gone within its 5 s
    assert "SIGKILL" not in log, log[-3000:]
    assert re.search(r"^stack: nodes down in [0-9.]+ s$", log, re.M), log[-3000:]
    # no node was started again by its runsv while the stack stopped
    assert not re.search(r"\| .*(Starting gunicorn|\bready\.$)", log, re.M), log[-3000:]
    deadline = time.monotonic() + 10  # the last ones reaped (a zombie's parent collects it)
    while still_running(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: _command(pid) for pid in still_running(processes)}
    assert left == {}, left
    nodes_down = float(re.search(r"^stack: nodes down in ([0-9.]+) s$", log, re.M).group(1))
    record_figure("stack_sigterm", {
        "processes": len(processes), "in_flight_image_call": answer["status"],
        "image_call_answered_after_sigterm_s": round(answer["at"] - signalled, 1),
        "nodes_down_s": nodes_down, "stack_exit_s": round(stopped, 1),
        "after_nodes_down_s": round(stopped - nodes_down, 1),
    })
