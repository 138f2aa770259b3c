"""``domain.usage.UsageWindow``: how far from the ledger's clock a record may have
occurred, and the reasons outside it, whatever the moment (year 1, year 9999, any zone)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.ingest.batch import decode
from adapters.ingest.letters import error_code
from domain.errors import InvalidUsage
from domain.usage import UsageRecord, UsageWindow, decode_usage

NOW = datetime(2026, 12, 5, 7, 30, 15, 123456, tzinfo=UTC)


def _record(occurred_at: str) -> UsageRecord:
    body = {"usage_id": "r", "customer_id": "acme", "meter": "m", "quantity": 1,
            "occurred_at": occurred_at}  # fmt: skip
    return decode_usage(json.dumps(body).encode())


def _reason(occurred_at: str, window: UsageWindow | None = None) -> str:
    with pytest.raises(InvalidUsage) as caught:
        (window or UsageWindow()).check(_record(occurred_at), NOW)
    return str(caught.value)


def test_the_last_day_of_year_9999_is_too_far_ahead_not_an_overflow() -> None:
    assert _reason("9999-12-31T23:00:00-05:00") == (
        "occurred_at too far ahead: 9999-12-31T23:00:00-05:00 is more than 1 hour after"
        " the ledger's clock (2026-12-05T07:30:15Z)"
    )


def test_year_one_is_too_old_not_an_overflow() -> None:
    assert _reason("0001-01-01T00:00:00+14:00") == (
        "occurred_at too old: 0001-01-01T00:00:00+14:00 is more than 400 days before"
        " the ledger's clock (2026-12-05T07:30:15Z)"
    )


def test_the_bounds_are_inclusive_and_measured_across_zones() -> None:
    window = UsageWindow(max_age=timedelta(days=2), max_ahead=timedelta(minutes=5))
    edge_ahead = (NOW + timedelta(minutes=5)).astimezone(UTC)
    in_new_york = edge_ahead.astimezone(timezone(timedelta(hours=-5)))  # the same instant
    for moment in (edge_ahead, in_new_york, NOW - timedelta(days=2), NOW):
        assert window.check(_record(moment.isoformat()), NOW).occurred_at == moment
    assert _reason((edge_ahead + timedelta(microseconds=1)).isoformat(), window).startswith(
        "occurred_at too far ahead: "
    )
    assert _reason((NOW - timedelta(days=2, microseconds=1)).isoformat(), window).endswith(
        "is more than 2 days before the ledger's clock (2026-12-05T07:30:15Z)"
    )
    assert "more than 5 minutes after" in _reason(
        (NOW + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S-00:00"), window
    )


@given(st.datetimes(timezones=st.timezones()))
def test_any_moment_gets_a_verdict_never_an_exception(moment: datetime) -> None:
    record = UsageRecord(usage_id="r", customer_id="acme", meter="m", quantity=1,
                         occurred_at=moment)  # fmt: skip
    try:
        UsageWindow().check(record, NOW)
    except InvalidUsage as exc:
        assert error_code(str(exc)) in {"too_old", "too_far_ahead"}


def test_a_window_without_room_is_refused() -> None:
    with pytest.raises(ValueError, match="age must be above 0"):
        UsageWindow(max_age=timedelta(0))
    with pytest.raises(ValueError, match="lead not below 0"):
        UsageWindow(max_ahead=timedelta(seconds=-1))


class _Rec:
    topic, partition = "usage", 0

    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.value, self.key = offset, value, b"acme"


def test_ingest_sets_a_record_from_the_far_future_aside_and_keeps_the_batch() -> None:
    good = _record(NOW.isoformat()).to_json()
    future = _record("9999-12-31T00:00:00Z").to_json()
    valid, letters = decode([_Rec(0, good), _Rec(1, future)], 16_384, UsageWindow(), NOW)
    assert [m.source.offset for m in valid] == [0]
    assert [(d.offset, d.code) for d in letters] == [(1, "too_far_ahead")]
