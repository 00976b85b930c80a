"""`make stack` runs until it is stopped unless STACK_MAX_SECONDS (set by the deployment tests) says
otherwise: an unset or zero limit is no deadline."""

import time

from stack.__main__ import stack_deadline


def test_no_limit_is_no_deadline():
    assert stack_deadline(None) is None
    assert stack_deadline("") is None
    assert stack_deadline("0") is None


def test_a_limit_is_a_deadline_that_far_ahead():
    before = time.monotonic()
    deadline = stack_deadline("900")
    assert before + 899 < deadline <= time.monotonic() + 900
