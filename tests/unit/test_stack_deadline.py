"""`make stack` runs until it is stopped unless STACK_MAX_SECONDS (set by the deployment tests) says
otherwise: an unset or zero limit is no deadline."""

import time

from stack.__main__ import exit_status, stack_deadline


def test_no_limit_is_no_deadline():
    assert stack_deadline(None) is None
    assert stack_deadline("") is None
    assert stack_deadline("0") is None


def test_a_limit_is_a_deadline_that_far_ahead():
    before = time.monotonic()
    deadline = stack_deadline("900")
    assert before + 899 < deadline <= time.monotonic() + 900


def test_a_stack_asked_to_stop_exits_0_whatever_signal_ended_its_processes():
    for status in (0, 130, 143, -2, -15):
        assert exit_status(status, asked_to_stop=True) == 0
    # a process that failed is still reported, asked to stop or not
    assert exit_status(1, asked_to_stop=True) == 1
    # honcho ending by itself (a process died) keeps its status
    assert exit_status(143, asked_to_stop=False) == 143
    assert exit_status(0, asked_to_stop=False) == 0
