"""The reasons ``domain.usage`` gives for a record it refuses, word for word: they are
the dead letters' reasons that operators read (and whose prefix is the log's code)."""

from __future__ import annotations

import decimal
import json

import pytest
from pydantic import BaseModel, ValidationError

from domain import usage
from domain.errors import InvalidUsage
from domain.usage import UsageRecord, decode_usage

GOOD = {
    "usage_id": "req-1",
    "customer_id": "acme",
    "meter": "api.requests",
    "quantity": "15",
    "occurred_at": "2026-12-02T10:15:00Z",
}


def _reason(body: object) -> str:
    with pytest.raises(InvalidUsage) as caught:
        decode_usage(json.dumps(body).encode())
    return str(caught.value)


def test_each_failing_field_is_named_and_its_rule_lowercased_one_after_another() -> None:
    reason = _reason({**GOOD, "quantity": [15], "occurred_at": "yesterday", "currency": 5})
    assert reason == (
        "quantity: decimal input should be an integer, float, string or Decimal object;"
        " occurred_at: input should be a valid datetime or date, input is too short;"
        " currency: input should be a valid string"
    )


def test_a_record_level_error_is_named_record() -> None:
    with pytest.raises(ValidationError) as caught:
        UsageRecord.model_validate("not an object")
    assert usage._describe(caught.value) == (
        "record: input should be a valid dictionary or instance of UsageRecord"
    )


def test_a_nested_location_is_dotted() -> None:
    class Batch(BaseModel):
        quantities: list[int]

    with pytest.raises(ValidationError) as caught:
        Batch.model_validate({"quantities": [1, "x"]})
    assert usage._describe(caught.value) == (
        "quantities.1: input should be a valid integer, unable to parse string as an integer"
    )


def test_a_validation_error_without_details_still_gives_a_reason() -> None:
    assert usage._describe(ValidationError.from_exception_data("UsageRecord", [])) == (
        "record: invalid"
    )


def test_a_reason_is_one_line_without_nul_characters() -> None:
    assert usage._one_line("bad\x00value\n\t here") == "bad value here"


def test_an_arithmetic_failure_the_bounds_let_through_is_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def overflowing(text: str) -> int:
        raise decimal.Overflow(text)

    monkeypatch.setattr(usage, "_bounded_int", overflowing)
    assert _reason(GOOD | {"quantity": 15}) == "number out of range: Overflow"
