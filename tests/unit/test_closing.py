"""``domain.closing``: when an invoice closes, whether a frozen line's final total is in
Stripe, and each transaction's billed share of a rounded line."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from domain.closing import LineStatus, billed_shares, close_deadline, due_to_close, line_status
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.periods import Period

END = datetime(2027, 1, 1, tzinfo=UTC)
PERIOD = Period(datetime(2026, 12, 1, tzinfo=UTC), END)
GRACE = timedelta(hours=6)
T = [UUID(int=n) for n in range(1, 6)]


def _invoice() -> Invoice:
    return Invoice.open("acme", "USD", PERIOD, UUID(int=99))


def test_an_invoice_closes_at_its_periods_end_plus_the_grace() -> None:
    invoice = _invoice()
    deadline = END + GRACE
    assert close_deadline(invoice, GRACE) == deadline
    assert due_to_close(invoice, deadline - timedelta(microseconds=1), GRACE) is False
    assert due_to_close(invoice, deadline, GRACE) is True
    assert due_to_close(invoice, deadline + timedelta(days=3), GRACE) is True
    invoice.close("by hand")
    assert due_to_close(invoice, deadline, GRACE) is False


def _line(*amounts: str) -> InvoiceLine:
    line = InvoiceLine.open("acme", "USD", "api", PERIOD)
    line.settle([(T[i], Decimal(a)) for i, a in enumerate(amounts)])
    return line


def _push(line: InvoiceLine, pushed: int, charged: int) -> LinePush:
    push = LinePush(line_id=line.id)
    if pushed:
        push.record_pushed(pushed, line.billed, [line.billed], ["ii_1"], "in_1")
    if charged:
        push.record_charges(charged, line.transactions)
    return push


def test_a_line_is_pushed_once_stripe_holds_its_sequence_and_its_charges_are_recorded() -> None:
    line = _line("120.4", "30")  # sequence 2, billed 150
    assert line_status(line, None) == LineStatus(line.id, 2, 150, pushed=False)
    assert line_status(line, _push(line, 2, 2)) == LineStatus(line.id, 2, 150, pushed=True)
    assert line_status(line, _push(line, 2, 0)).pushed is False  # charges not recorded
    assert line_status(line, _push(line, 2, 1)).pushed is False
    assert line_status(line, _push(line, 1, 1)).pushed is False  # an older total in Stripe
    assert line_status(line, _push(line, 3, 3)).pushed is True  # a newer one (a later push)
    assert line_status(line, _push(line, 2, 2)).final == (line.id, 2, 150)


def _settled(ids: list[int], amounts: list[str]) -> InvoiceLine.Settled:
    line = InvoiceLine.open("acme", "USD", "api", PERIOD)
    line.settle([(T[i], Decimal(a)) for i, a in zip(ids, amounts, strict=True)])
    event = line.pending_events[-1]
    assert isinstance(event, InvoiceLine.Settled)
    return event


def _removed(ids: list[int], amounts: list[str]) -> InvoiceLine.Removed:
    line = InvoiceLine.open("acme", "USD", "api", PERIOD)
    line.settle([(T[i], Decimal(a)) for i, a in zip(ids, amounts, strict=True)])
    line.remove([(T[i], Decimal(a)) for i, a in zip(ids, amounts, strict=True)], "refund")
    event = line.pending_events[-1]
    assert isinstance(event, InvoiceLine.Removed)
    return event


def test_each_share_is_what_its_transaction_added_to_the_rounded_running_total() -> None:
    shares = billed_shares([_settled([0, 1, 2], ["0.4", "0.4", "0.4"])])
    assert shares == {T[0]: 0, T[1]: 1, T[2]: 0}  # 0.4 -> 0, 0.8 -> 1, 1.2 -> 1


def test_shares_add_up_to_the_billed_total_across_changes_and_removals() -> None:
    changes = [
        _settled([0, 1], ["10.6", "0.3"]),
        _settled([2, 3], ["5.25", "100"]),
        _removed([1], ["0.3"]),
        _settled([4], ["0.45"]),
    ]
    shares = billed_shares(changes)
    # held in order: t0 10.6 -> 11, t2 15.85 -> 16, t3 115.85 -> 116, t4 116.3 -> 116
    assert shares == {T[0]: 11, T[2]: 5, T[3]: 100, T[4]: 0}
    assert sum(shares.values()) == 116


def test_removing_what_was_never_settled_changes_nothing() -> None:
    shares = billed_shares([_settled([0], ["2.5"]), _removed([3], ["7"])])
    assert shares == {T[0]: 3}


def test_no_changes_no_shares() -> None:
    assert billed_shares([]) == {}


@pytest.mark.parametrize("amount", ["0.5", "1.5", "2.4999"])
def test_a_single_transaction_bills_its_amount_rounded_half_up(amount: str) -> None:
    (share,) = billed_shares([_settled([0], [amount])]).values()
    assert share == int(Decimal(amount).quantize(Decimal(1), rounding="ROUND_HALF_UP"))


def test_a_change_whose_ids_and_amounts_disagree_is_refused_not_read_in_part() -> None:
    malformed = dataclasses.replace(_settled([0, 1], ["0.6", "0.6"]), amounts=["0.6"])
    with pytest.raises(ValueError, match="shorter"):
        billed_shares([malformed])
