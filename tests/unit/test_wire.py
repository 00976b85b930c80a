"""The wire layer's helpers (app.wire): one timestamp format, ids, envelopes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import envelope
from app.wire import (
    accepted,
    iso,
    json_response,
    new_id,
    preferences,
    response_wrapper,
    success_envelope,
    utcnow,
    wants_async,
)

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@pytest.mark.parametrize("moment,text", [
    (datetime(2026, 11, 23, 16, 25, 2, 123456, tzinfo=UTC), "2026-11-23T16:25:02.123Z"),
    (datetime(2026, 11, 23, 16, 25, 2, tzinfo=UTC), "2026-11-23T16:25:02.000Z"),
    (datetime(2026, 11, 23, 18, 25, 2, 999999, tzinfo=timezone(timedelta(hours=2))), "2026-11-23T16:25:02.999Z"),
    (datetime(2026, 11, 23, 16, 25, 2, 5000), "2026-11-23T16:25:02.005Z"),  # naive: taken as UTC
])
def test_one_timestamp_format(moment, text):
    assert iso(moment) == text and ISO_MS.match(text)


@settings(max_examples=500, deadline=None)
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 30),
                    timezones=st.one_of(st.none(), st.just(UTC), st.timezones())))
def test_iso_is_the_strftime_format(moment):
    """The isoformat shortcut answers what the strftime format did (years < 1000 keep strftime)."""
    utc = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).astimezone(UTC)
    assert iso(moment) == utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


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


def test_the_analytics_wrapper_states_metadata_only_when_there_is_some():
    assert response_wrapper([1]) == {"success": True, "data": [1]}
    assert response_wrapper({"a": 1}, {}) == {"success": True, "data": {"a": 1}}
    assert response_wrapper([], {"limit": 5}) == {"success": True, "data": [], "metadata": {"limit": 5}}


def test_a_202_and_a_held_response():
    app = Flask(__name__)
    with app.test_request_context():
        queued = accepted({"jobId": "j1"}, "/api/v1/jobs/j1", respond_async=True)
        assert (queued.status_code, queued.get_json(), queued.mimetype) == (202, {"jobId": "j1"}, "application/json")
        assert queued.headers["Location"] == "/api/v1/jobs/j1"
        assert queued.headers["Preference-Applied"] == "respond-async"
        plain = accepted({"success": True})
        assert plain.status_code == 202 and "Location" not in plain.headers
        assert "Preference-Applied" not in plain.headers
        count = json_response(7, headers={"Preference-Applied": "count=exact"})
        assert (count.status_code, count.get_json(), count.headers["Preference-Applied"]) == (200, 7, "count=exact")


def test_prefer_tokens_come_from_every_prefer_header():

    app = Flask(__name__)
    with app.test_request_context(headers=[("Prefer", "count=planned; x=1"), ("Prefer", " Respond-Async ")]):
        assert preferences() == ["count=planned", "respond-async"]
        assert wants_async()
    with app.test_request_context(headers={"Prefer": "return=minimal"}):
        assert not wants_async()
