"""``BillingTransaction``: each refusal says what was refused and why (the operator reads
these in logs and dead letters), and a charge names the line push that included it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from domain.errors import IllegalTransition
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

PRICES = PriceList({"api": Price(Decimal("0.01"), "USD")})
ACCOUNT, LINE, OTHER = UUID(int=7), UUID(int=0xA), UUID(int=0xB)


def _txn() -> BillingTransaction:
    record = UsageRecord(
        usage_id="u-1",
        customer_id="acme",
        meter="api",
        quantity=Decimal(3),
        occurred_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    return BillingTransaction.from_usage(record, PRICES, Source("usage", 0, 1))


def _refusal(action: object) -> str:
    with pytest.raises((IllegalTransition, ValueError)) as raised:
        action()  # type: ignore[operator]
    return str(raised.value)


def test_a_step_from_the_wrong_state_names_the_step_the_state_and_the_allowed_ones() -> None:
    txn = _txn()
    assert _refusal(lambda: txn.record_charged("ii")) == (
        f"cannot record a charge: transaction {txn.id} is metered"
        " (allowed from reserved, charge_failed)"
    )
    assert _refusal(lambda: txn.settle(LINE, 2)).startswith("cannot join a line: ")
    assert _refusal(
        lambda: txn.record_charge_failure("E", "m", retryable=False, next_attempt_at=None)
    ).startswith("cannot record a charge failure: ")
    txn.compensate("no")
    assert _refusal(lambda: txn.reserve(ACCOUNT)).startswith("cannot reserve: ")
    assert _refusal(lambda: txn.compensate("again")).startswith("cannot compensate: ")


def test_refusals_of_bad_arguments_say_what_is_missing() -> None:
    txn = _txn()
    assert _refusal(lambda: txn.reserve(ACCOUNT, LINE)) == "a line and its version go together"
    assert _refusal(lambda: txn.compensate(" ")) == "a compensation needs a reason"
    txn.reserve(ACCOUNT, LINE, 3)
    assert (
        _refusal(lambda: txn.record_charge_failure("E", "m", retryable=True, next_attempt_at=None))
        == "a retryable failure needs next_attempt_at"
    )
    assert _refusal(lambda: txn.settle(OTHER, 2)) == (
        f"transaction {txn.id} is in line {LINE} already"
    )
    assert _refusal(lambda: txn.record_charged("ii", OTHER, 3)) == (
        f"transaction {txn.id} is not in line {OTHER}"
    )
    assert _refusal(lambda: txn.record_charged("ii", LINE, 2)) == (
        f"line {LINE} at 2 does not include transaction {txn.id} (joined at 3)"
    )
    assert _refusal(lambda: txn.record_charged("ii", LINE, None)).startswith(f"line {LINE} at None")
    txn.record_charged("ii", LINE, 3)
    assert _refusal(lambda: txn.compensate("refund")) == (
        "reversing a charge needs the id of its Stripe reversal"
    )


def test_a_charge_records_the_line_and_sequence_of_its_push() -> None:
    txn = _txn()
    txn.reserve(ACCOUNT, LINE, 3)
    txn.record_charged("ii_9", LINE, 3)
    charged = txn.pending_events[-1]
    assert isinstance(charged, BillingTransaction.Charged)
    assert (charged.stripe_object_id, charged.line_id, charged.sequence) == ("ii_9", LINE, 3)


def test_a_transaction_from_before_lines_joins_one_at_its_version() -> None:
    txn = _txn()
    txn.reserve(ACCOUNT)
    txn.settle(LINE, 5)
    settled = txn.pending_events[-1]
    assert isinstance(settled, BillingTransaction.Settled)
    assert (settled.line_id, settled.line_version) == (LINE, 5)
    assert (txn.line_id, txn.line_version) == (LINE, 5)
