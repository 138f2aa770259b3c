"""``domain.duplicates``: when a record sent again under the same identity is the same
record (a silent duplicate) and when it conflicts (a dead letter with both hashes)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from domain.duplicates import CONFLICT_PREFIX, Recorded, canonical_body, conflict, differences
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord, decode_usage

FIRST: dict[str, Any] = {
    "usage_id": "req-1",
    "customer_id": "acme",
    "meter": "api.requests",
    "quantity": "1520",
    "occurred_at": "2026-12-02T10:15:00Z",
}
# What the Metered event of FIRST holds (the meter is priced in USD).
RECORDED = Recorded(
    customer_id="acme",
    usage_id="req-1",
    meter="api.requests",
    quantity=Decimal(1520),
    occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
    currency="USD",
)


def _again(raw: bytes) -> UsageRecord:
    return decode_usage(raw)


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(FIRST).encode(),  # an exact re-send
        json.dumps(FIRST, indent=4, sort_keys=True).encode(),  # other whitespace and order
        json.dumps({**FIRST, "quantity": 1520}).encode(),  # a number, not a string
        json.dumps(FIRST).replace('"1520"', "1.52e3").encode(),  # another spelling of 1520
        json.dumps({**FIRST, "quantity": "1520.000"}).encode(),
        json.dumps({**FIRST, "occurred_at": "2026-12-02T11:15:00+01:00"}).encode(),  # same instant
        json.dumps({**FIRST, "currency": "usd"}).encode(),  # the meter's own currency, given
        json.dumps({**FIRST, "region": "eu-west-1"}).encode(),  # a field nobody reads
    ],
)
def test_a_duplicate_that_bills_the_same_is_the_same_record(raw: bytes) -> None:
    record = _again(raw)
    assert differences(record, RECORDED) == []
    assert conflict(record, RECORDED) is None


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"quantity": "1521"}, ["quantity"]),
        ({"meter": "gpt-4o.input_tokens"}, ["meter"]),
        ({"occurred_at": "2026-12-02T10:15:00.000001Z"}, ["occurred_at"]),
        ({"currency": "EUR"}, ["currency"]),
        ({"quantity": 0, "meter": "gpu.a100.seconds"}, ["meter", "quantity"]),
    ],
)
def test_a_duplicate_that_bills_otherwise_conflicts_and_says_what_differs(
    change: dict[str, Any], fields: list[str]
) -> None:
    record = _again(json.dumps({**FIRST, **change}).encode())
    assert differences(record, RECORDED) == fields
    reason = conflict(record, RECORDED)
    assert reason is not None and reason.startswith(CONFLICT_PREFIX)
    assert f"was recorded with another {', '.join(fields)} (" in reason
    assert "\n" not in reason


def test_the_reason_carries_both_bodies_hashes_and_the_recorded_one_is_recomputable() -> None:
    changed = _again(json.dumps({**FIRST, "quantity": "7"}).encode())
    reason = conflict(changed, RECORDED)
    assert reason is not None
    recorded_hash = hashlib.sha256(canonical_body(RECORDED)).hexdigest()
    this = Recorded(**{**vars(RECORDED), "quantity": Decimal(7)})
    this_hash = hashlib.sha256(canonical_body(this)).hexdigest()
    assert reason.endswith(f"(recorded sha256 {recorded_hash}, this sha256 {this_hash})")
    assert recorded_hash != this_hash


def test_the_canonical_body_is_the_same_for_every_spelling_of_the_same_record() -> None:
    spellings = [
        RECORDED,
        Recorded(**{**vars(RECORDED), "quantity": Decimal("1.520E+3")}),
        Recorded(
            **{**vars(RECORDED),
               "occurred_at": datetime(2026, 12, 2, 5, 15, tzinfo=timezone(-timedelta(hours=5)))}
        ),
    ]  # fmt: skip
    assert len({canonical_body(r) for r in spellings}) == 1
    assert json.loads(canonical_body(RECORDED)) == {
        "currency": "USD",
        "customer_id": "acme",
        "meter": "api.requests",
        "occurred_at": "2026-12-02T10:15:00Z",
        "quantity": "1520",
        "usage_id": "req-1",
    }


@pytest.mark.parametrize("zero", ["0", "0.000", "-0", "0E-7"])
def test_every_spelling_of_zero_is_one_canonical_quantity(zero: str) -> None:
    body = canonical_body(Recorded(**{**vars(RECORDED), "quantity": Decimal(zero)}))
    assert json.loads(body)["quantity"] == "0"


def test_what_was_recorded_is_read_from_the_metered_event() -> None:
    record = decode_usage(
        json.dumps({**FIRST, "customer_id": "acme-9", "usage_id": "req-77"}).encode()
    )
    prices = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
    txn = BillingTransaction.from_usage(record, prices, Source("usage", 1, 5))
    metered = txn.pending_events[0]
    assert isinstance(metered, BillingTransaction.Metered)
    assert Recorded.of(metered) == Recorded(
        customer_id="acme-9",
        usage_id="req-77",
        meter="api.requests",
        quantity=Decimal(1520),
        occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
        currency="USD",
    )
