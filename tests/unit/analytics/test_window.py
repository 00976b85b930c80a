"""The date window of the dashboards: forms, defaults, whole days vs raw edges."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from app.analytics.services import Window, parse_instant, resolve_window
from app.errors import InvalidInput

NOW = datetime(2026, 11, 23, 15, 30, tzinfo=UTC)


def test_default_is_today_and_the_29_days_before_in_whole_days():
    w = resolve_window(None, None, NOW)
    assert (w.start, w.end) == (datetime(2026, 10, 25, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC))
    assert w.full_days == (date(2026, 10, 25), date(2026, 11, 24)) and w.edges == []
    assert len(w.days()) == 30


@pytest.mark.parametrize("raw_from, raw_to, start, end", [
    ("2026-03-01", "2026-03-01", datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC)),
    ("2026-03-01T10:00:00Z", "2026-03-01T10:00:00.500Z", datetime(2026, 3, 1, 10, tzinfo=UTC),
     datetime(2026, 3, 1, 10, 0, 0, 500001, tzinfo=UTC)),
    ("2026-03-01T10:00:00+02:00", "2026-03-02T00:00:00-01:00", datetime(2026, 3, 1, 8, tzinfo=UTC),
     datetime(2026, 3, 2, 1, 0, 0, 1, tzinfo=UTC)),
    ("2026-03-01T10:00:00", None, datetime(2026, 3, 1, 10, tzinfo=UTC), datetime(2026, 11, 24, tzinfo=UTC)),
])
def test_forms(raw_from, raw_to, start, end):
    w = resolve_window(raw_from, raw_to, NOW)
    assert (w.start, w.end) == (start, end)


def test_only_to_gives_the_30_days_ending_that_day():
    w = resolve_window(None, "2026-03-31", NOW)
    assert (w.start, w.end) == (datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))


def test_partial_days_become_raw_edges():
    w = Window(datetime(2026, 3, 1, 9, 30, tzinfo=UTC), datetime(2026, 3, 4, 18, tzinfo=UTC))
    assert w.full_days == (date(2026, 3, 2), date(2026, 3, 4))
    assert w.edges == [(w.start, datetime(2026, 3, 2, tzinfo=UTC)), (datetime(2026, 3, 4, tzinfo=UTC), w.end)]
    inside = Window(datetime(2026, 3, 1, 9, tzinfo=UTC), datetime(2026, 3, 1, 18, tzinfo=UTC))
    assert inside.full_days is None and inside.edges == [(inside.start, inside.end)]
    assert inside.days() == [date(2026, 3, 1)]


@pytest.mark.parametrize("raw_from, raw_to", [
    ("x", None), (None, "2026-02-30"), ("2026-03-02", "2026-03-01"), ("0001-01-01", "9999-12-31"),
    (None, "9999-12-31"), ("0001-01-01T00:00:00+01:00", None), ("", "2026-01-01T25:00Z"), ("12:00", None)])
def test_bad_windows(raw_from, raw_to):
    with pytest.raises(InvalidInput):
        resolve_window(raw_from or None, raw_to, NOW)


def test_parse_instant_rejects_non_iso():
    for bad in ("yesterday", "1700000000", "", "2026-13-01", "x" * 100):
        with pytest.raises(ValueError):
            parse_instant(bad)
    assert parse_instant("2026-03-01T10:00:00.123+05:30") == datetime(2026, 3, 1, 4, 30, 0, 123000, tzinfo=UTC)
