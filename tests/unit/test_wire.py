"""The wire layer's helpers: one timestamp format, ids, envelopes; the one task retry policy."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from app.errors import envelope
from app.tasks import MAX_BACKOFF_SECONDS, retry_countdown, retry_or_give_up
from app.wire import iso, new_id, success_envelope, utcnow

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@pytest.mark.parametrize("moment,text", [
    (datetime(2026, 11, 23, 16, 25, 2, 123456, tzinfo=UTC), "2026-11-23T16:25:02.123Z"),
    (datetime(2026, 11, 23, 16, 25, 2, tzinfo=UTC), "2026-11-23T16:25:02.000Z"),
    (datetime(2026, 11, 23, 18, 25, 2, 999999, tzinfo=timezone(timedelta(hours=2))), "2026-11-23T16:25:02.999Z"),
    (datetime(2026, 11, 23, 16, 25, 2, 5000), "2026-11-23T16:25:02.005Z"),  # naive: taken as UTC
])
def test_one_timestamp_format(moment, text):
    assert iso(moment) == text and ISO_MS.match(text)


def test_none_stays_none_and_now_is_stored_at_wire_precision():
    assert iso(None) is None
    now = utcnow()
    assert now.tzinfo is UTC and now.microsecond % 1000 == 0
    assert datetime.fromisoformat(iso(now).replace("Z", "+00:00")) == now  # what is returned is what is stored


def test_ids_and_envelopes():
    assert len({new_id() for _ in range(100)}) == 100 and len(new_id()) == 36
    ok = success_envelope({"a": 1})
    assert ok["data"] == {"a": 1} and ok["metadata"]["success"] is True and isinstance(ok["metadata"]["timestamp"], int)
    err = envelope("NOT_FOUND", "gone")
    assert err["error"] == {"code": "NOT_FOUND", "message": "gone"} and err["metadata"]["success"] is False


def test_retry_countdown_is_exponential_with_jitter_capped_and_honours_retry_after():
    for retries in range(4):
        assert 2 ** retries <= retry_countdown(retries) <= 1.5 * 2 ** retries
    assert retry_countdown(20) == MAX_BACKOFF_SECONDS
    assert retry_countdown(0, retry_after=7) == 7 and retry_countdown(0, retry_after=10_000) == MAX_BACKOFF_SECONDS


def test_retry_or_give_up():
    scheduled = []

    def retry(**kwargs):
        scheduled.append(kwargs)
        return RuntimeError("retry scheduled")

    exc = ValueError("db down")
    task = SimpleNamespace(name="t", request=SimpleNamespace(retries=1), retry=retry)
    assert str(retry_or_give_up(task, exc, 3)) == "retry scheduled"
    assert scheduled[0]["exc"] is exc and scheduled[0]["max_retries"] == 3 and 2 <= scheduled[0]["countdown"] <= 3
    task.request.retries = 3
    assert retry_or_give_up(task, exc, 3) is exc and len(scheduled) == 1
