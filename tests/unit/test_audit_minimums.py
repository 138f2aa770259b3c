"""``domain.audit_minimums``: every closed invoice's true-up recomputed from the contract
versions as stored and the invoice's lines."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from domain.audit_invoices import InvoiceAudit
from domain.audit_lines import LineAudit
from domain.audit_minimums import check_true_ups
from domain.closing import TRUE_UP_METER
from domain.contract import Contract, check_terms
from domain.invoice_states import InvoiceState
from domain.pricing import PriceList
from tests.fast.fakes import memory_ledger

DEC = "2026-12-01T00:00:00+00:00"
JAN = "2027-01-01T00:00:00+00:00"
LISTED = PriceList({})


def _contracts() -> dict[tuple[str, int], Any]:
    """A minimum of 100.00 USD from December, as the replay holds the stored Set."""
    contract = Contract("acme")
    contract.set(check_terms({}, {"USD": "100.00"}, LISTED), datetime(2026, 12, 1, tzinfo=UTC))
    mapper = memory_ledger().mapper
    sets = [e for e in contract.collect_events() if isinstance(e, Contract.Set)]
    return {
        (str(contract.id), e.number): orjson.loads(mapper.to_stored_event(e).state) for e in sets
    }


def _invoice(
    usage: int, true_up: int | None, state: InvoiceState = InvoiceState.CLOSED
) -> list[str]:
    lines = {"u": LineAudit("u", "acme", "USD", "api", DEC, billed=usage)}
    if true_up is not None:
        lines["t"] = LineAudit("t", "acme", "USD", TRUE_UP_METER, DEC, billed=true_up)
    invoice = InvoiceAudit("i", "acme", "USD", DEC, list(lines), state=state, period_end=JAN)
    return [f.detail for f in check_true_ups([invoice], lines, _contracts())]


def test_a_true_up_of_the_shortfall_is_clean() -> None:
    assert _invoice(2_500, 7_500) == []
    assert _invoice(10_000, None) == []  # the minimum is reached: none owed
    assert _invoice(1, None, InvoiceState.OPEN) == []  # not closed yet: nothing to check


def test_a_wrong_missing_or_unowed_true_up_is_a_finding() -> None:
    line = f"true-up line {TRUE_UP_METER!r} holds"
    owes = "contract version 1 and usage of 25.00 USD owe 75.00 USD"
    assert _invoice(2_500, 7_000) == [f"{line} 70.00 USD, but {owes}"]
    assert _invoice(2_500, None) == [f"{line} 0.00 USD, but {owes}"]
    assert _invoice(10_000, 100) == [
        f"{line} 1.00 USD, but contract version 1 and usage of 100.00 USD owe 0.00 USD"
    ]
    lines = {"t": LineAudit("t", "beta", "USD", TRUE_UP_METER, DEC, billed=5)}
    invoice = InvoiceAudit(
        "j", "beta", "USD", DEC, ["t"], state=InvoiceState.CLOSED, period_end=JAN
    )
    assert [f.detail for f in check_true_ups([invoice], lines, _contracts())] == [
        f"{line} 0.05 USD, but no contract version and usage of 0.00 USD owe 0.00 USD"
    ]
