"""``domain.usage``: raw bytes become a ``UsageRecord`` or one clear line of reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from domain.errors import InvalidUsage
from domain.usage import DEFAULT_MAX_RECORD_BYTES, UsageRecord, decode_usage, usage_id_of

VALID: dict[str, Any] = {
    "usage_id": "req-8812",
    "customer_id": "acme",
    "meter": "gpt-4o.input_tokens",
    "quantity": 1520,
    "occurred_at": "2026-12-02T10:15:00Z",
    "currency": "USD",
}
REQUIRED = ("usage_id", "customer_id", "meter", "quantity", "occurred_at")


def _raw(**changes: Any) -> bytes:
    """The valid record with ``changes`` applied; a change to ``...`` removes the field."""
    body = {**VALID, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def _reason(raw: bytes | None, **kwargs: Any) -> str:
    with pytest.raises(InvalidUsage) as caught:
        decode_usage(raw, **kwargs)
    reason = str(caught.value)
    assert reason
    assert "\n" not in reason  # one line: it goes into a log line and the DLQ record
    return reason


# ---------------------------------------------------------------------------------------------
# accepted records


def test_decode_usage_accepts_a_valid_record() -> None:
    record = decode_usage(_raw())
    assert record == UsageRecord(
        usage_id="req-8812",
        customer_id="acme",
        meter="gpt-4o.input_tokens",
        quantity=Decimal(1520),
        occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
        currency="USD",
    )


def test_decode_usage_leaves_currency_unset_when_the_record_has_none() -> None:
    assert decode_usage(_raw(currency=...)).currency is None


def test_decode_usage_accepts_a_lower_case_known_currency_and_normalises_it() -> None:
    assert decode_usage(_raw(currency="usd")).currency == "USD"


def test_decode_usage_reads_an_integer_quantity_as_decimal() -> None:
    quantity = decode_usage(_raw(quantity=1520)).quantity
    assert isinstance(quantity, Decimal)
    assert quantity == Decimal(1520)


def test_decode_usage_reads_a_string_quantity_as_decimal() -> None:
    assert decode_usage(_raw(quantity="1520.25")).quantity == Decimal("1520.25")


@pytest.mark.parametrize(
    ("json_number", "exact"),
    [
        ("0.1", "0.1"),  # as a binary float this is 0.1000000000000000055511151231257827...
        ("1520.000000000000000001", "1520.000000000000000001"),  # a float would give 1520.0
        ("2.5e3", "2.5E+3"),
    ],
)
def test_decode_usage_reads_a_json_float_quantity_exactly_as_decimal(
    json_number: str, exact: str
) -> None:
    raw = (
        b'{"usage_id":"u-1","customer_id":"acme","meter":"m","quantity":'
        + json_number.encode()
        + b',"occurred_at":"2026-12-02T10:15:00Z"}'
    )
    quantity = decode_usage(raw).quantity
    assert quantity == Decimal(exact)
    # the very digits: through a float, the second would be 1520.0 and the third 2500.0
    assert quantity.as_tuple() == Decimal(exact).as_tuple()


def test_decode_usage_ignores_unknown_fields() -> None:
    assert decode_usage(_raw(region="eu-west-1")).usage_id == "req-8812"


def test_decode_usage_accepts_a_payload_of_exactly_the_size_limit() -> None:
    raw = _raw()
    assert decode_usage(raw, max_bytes=len(raw)).usage_id == "req-8812"


# ---------------------------------------------------------------------------------------------
# rejected records, each with its reason


def test_decode_usage_rejects_a_message_without_a_value() -> None:
    assert _reason(None) == "empty message (no value)"


def test_decode_usage_rejects_a_payload_over_the_given_size_limit() -> None:
    raw = _raw()
    limit = len(raw) - 1
    assert _reason(raw, max_bytes=limit) == (
        f"payload of {len(raw)} bytes exceeds the {limit}-byte limit"
    )


def test_decode_usage_rejects_a_payload_over_the_default_limit_before_parsing_it() -> None:
    raw = b"x" * (DEFAULT_MAX_RECORD_BYTES + 1)  # not JSON either: the size is checked first
    assert _reason(raw) == (
        f"payload of {DEFAULT_MAX_RECORD_BYTES + 1} bytes exceeds the "
        f"{DEFAULT_MAX_RECORD_BYTES}-byte limit"
    )


def test_decode_usage_applies_the_default_limit_to_an_otherwise_valid_record() -> None:
    padding = "p" * DEFAULT_MAX_RECORD_BYTES  # an ignored field, so only the size is wrong
    assert "exceeds the 16384-byte limit" in _reason(_raw(padding=padding))


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b'{"usage_id": }', b"{'usage_id': 'u'}", b"not json"],
)
def test_decode_usage_rejects_invalid_json(raw: bytes) -> None:
    assert _reason(raw).startswith("not valid JSON: ")


@pytest.mark.parametrize("raw", [b"\x80abc", b'{"usage_id": "\xc3\x28"}', b"\xff\xfe\x00"])
def test_decode_usage_rejects_bytes_that_are_not_utf8(raw: bytes) -> None:
    reason = _reason(raw)
    assert reason.startswith("not valid JSON: ")
    assert "can't decode" in reason


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"[1, 2]", "list"), (b'"acme"', "str"), (b"42", "int"), (b"null", "NoneType")],
)
def test_decode_usage_rejects_json_that_is_not_an_object(raw: bytes, kind: str) -> None:
    assert _reason(raw) == f"expected a JSON object, got {kind}"


@pytest.mark.parametrize("missing", REQUIRED)
def test_decode_usage_names_each_missing_required_field(missing: str) -> None:
    assert _reason(_raw(**{missing: ...})) == f"{missing}: field required"


def test_decode_usage_names_every_missing_field_on_one_line() -> None:
    assert _reason(b"{}") == "; ".join(f"{name}: field required" for name in REQUIRED)


@pytest.mark.parametrize("quantity", [-1, "-0.5"])
def test_decode_usage_rejects_a_negative_quantity(quantity: object) -> None:
    assert _reason(_raw(quantity=quantity)) == (
        "quantity: input should be greater than or equal to 0"
    )


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b'"NaN"', b'"inf"'])
def test_decode_usage_rejects_nan_and_infinite_quantities(literal: bytes) -> None:
    raw = _raw(quantity=0).replace(b'"quantity": 0', b'"quantity": ' + literal)
    assert literal in raw
    assert _reason(raw) == "quantity: input should be a finite number"


def test_decode_usage_rejects_a_timestamp_without_a_timezone() -> None:
    assert _reason(_raw(occurred_at="2026-12-02T10:15:00")) == (
        "occurred_at: input should have timezone info"
    )


@pytest.mark.parametrize("customer_id", ["acme corp", "acme;drop", "acmé", "a\tb", "<acme>"])
def test_decode_usage_rejects_a_customer_id_with_disallowed_characters(customer_id: str) -> None:
    assert _reason(_raw(customer_id=customer_id)).startswith(
        "customer_id: string should match pattern"
    )


def test_decode_usage_rejects_a_blank_customer_id() -> None:
    # whitespace is stripped first, so "   " is empty
    assert (
        _reason(_raw(customer_id="   ")) == "customer_id: string should have at least 1 character"
    )


def test_decode_usage_quotes_the_customer_id_pattern_verbatim() -> None:
    assert "^[A-Za-z0-9_.@/+=-]+$" in _reason(_raw(customer_id="acme corp"))


@pytest.mark.parametrize("currency", ["XYZ", "usx"])
def test_decode_usage_rejects_an_unknown_currency_code(currency: str) -> None:
    assert _reason(_raw(currency=currency)) == f"unknown currency {currency!r}"


def test_decode_usage_rejects_deeply_nested_json_within_the_size_limit() -> None:
    raw = b"[" * 10_000  # 10,000 bytes < the 16,384-byte default limit
    assert _reason(raw).startswith("not valid JSON")


# ---------------------------------------------------------------------------------------------
# numbers the JSON parser cannot convert: bounded on their text first (issue 11)

# A record of 133 bytes whose unread field's exponent Decimal refuses (InvalidOperation).
HUGE_EXPONENT = (
    b'{"usage_id":"u","customer_id":"a","meter":"api.requests","quantity":1,'
    b'"occurred_at":"2026-12-01T00:00:00Z","x":1e9999999999999999999}'
)


def test_a_huge_exponent_in_a_field_nobody_reads_is_a_reason_not_an_invalid_operation() -> None:
    assert _reason(HUGE_EXPONENT) == (
        "number out of range: exponent 9999999999999999999 is beyond +/-1000"
    )


def test_an_integer_past_pythons_4300_digit_limit_is_a_reason_not_a_value_error() -> None:
    raw = _raw().replace(b'"currency"', b'"x": ' + b"9" * 4301 + b', "currency"')
    assert _reason(raw) == "number too long: a JSON number of 4301 characters (at most 100)"


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        (b"9" * 101, "number too long: a JSON number of 101 characters (at most 100)"),
        (b"-" + b"9" * 100, "number too long: a JSON number of 101 characters (at most 100)"),
        (b"0." + b"1" * 99, "number too long: a JSON number of 101 characters (at most 100)"),
        (b"1e-1001", "number out of range: exponent -1001 is beyond +/-1000"),
        (b"1.5E+1001", "number out of range: exponent 1001 is beyond +/-1000"),
    ],
)
def test_a_quantity_past_the_number_bounds_is_refused_before_conversion(
    literal: bytes, reason: str
) -> None:
    assert _reason(_raw(quantity=0).replace(b'"quantity": 0', b'"quantity": ' + literal)) == reason


@pytest.mark.parametrize("literal", [b"1e1000", b"1E-1000", b"9" * 100, b"0." + b"0" * 98])
def test_numbers_at_the_bounds_are_parsed_and_judged_by_the_field_rules(literal: bytes) -> None:
    raw = _raw().replace(b'"currency"', b'"x": ' + literal + b', "currency"')
    assert decode_usage(raw).usage_id == "req-8812"  # an unread field within the bounds


def test_a_quantity_string_with_a_huge_exponent_is_an_invalid_decimal() -> None:
    assert _reason(_raw(quantity="1e99999999999999999999")) == (
        "quantity: input should be a valid decimal"
    )


# ---------------------------------------------------------------------------------------------
# the wire form


@pytest.mark.parametrize(
    "record",
    [
        UsageRecord(
            usage_id="req-8812",
            customer_id="acme",
            meter="gpt-4o.input_tokens",
            quantity=Decimal(1520),
            occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
            currency="USD",
        ),
        UsageRecord(
            usage_id="job:42/step=3",
            customer_id="tenant@eu",
            meter="gpu.a100.seconds",
            quantity=Decimal("0.000001"),
            occurred_at=datetime(2026, 12, 2, 10, 15, 1, 250, tzinfo=timezone(timedelta(hours=5))),
        ),
    ],
    ids=["utc-with-currency", "offset-fraction-no-currency"],
)
def test_to_json_round_trips_through_decode_usage(record: UsageRecord) -> None:
    again = decode_usage(record.to_json())
    assert again == record
    assert again.quantity.as_tuple() == record.quantity.as_tuple()
    assert again.occurred_at.utcoffset() == record.occurred_at.utcoffset()


def test_to_json_writes_utc_as_z_and_the_quantity_as_a_string() -> None:
    body = json.loads(decode_usage(_raw(quantity=0.1)).to_json())
    assert body["occurred_at"] == "2026-12-02T10:15:00Z"
    assert body["quantity"] == "0.1"


@pytest.mark.parametrize(
    ("raw", "usage_id"),
    [
        (b'{"usage_id": "req-9", "quantity": -1}', "req-9"),  # readable, if not billable
        (b'{"usage_id": 9}', None),
        (b'["req-9"]', None),
        (b"not json", None),
        (b"", None),
        (None, None),
        (b"[" * 100_000, None),  # too deep for the parser: still an answer
    ],
)
def test_the_usage_id_of_a_records_bytes_is_read_when_it_can_be(
    raw: bytes | None, usage_id: str | None
) -> None:
    assert usage_id_of(raw) == usage_id
