"""``billing.invoice_events``' rows (``projections.invoices``), built without a database:
the detail a person reads names the expected total in the money format, while the
``amount`` column keeps minor units."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from domain.invoice import Invoice
from domain.invoice_states import StripeInvoiceView
from domain.periods import Period
from projections.base import History
from projections.invoices import _event_row

PERIOD = Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
AT = datetime(2027, 1, 2, tzinfo=UTC)


def _finalizing(currency: str) -> tuple[Invoice, History]:
    """An invoice of ``currency`` expecting 700 minor units, its Opened event remembered."""
    invoice = Invoice.open("acme", currency, PERIOD, UUID(int=1))
    history = History(decode=lambda _: None)
    for event in invoice.collect_events():
        history.remember(event)
    invoice.close("period ended")
    invoice.start_finalizing([(UUID(int=1), 4, 700)])
    invoice.collect_events()
    return invoice, history


def _row(invoice: Invoice, history: History) -> tuple[Any, ...]:
    [*_, event] = invoice.collect_events()
    return _event_row(event, history)


def test_a_drift_row_names_the_expected_total_with_its_currency() -> None:
    invoice, history = _finalizing("USD")
    invoice.record_drift([["l", "0", "4", "ii_1", "700", "600"]], 600, AT + timedelta(1))
    [*_, kind, _, amount, detail] = _row(invoice, history)
    assert (kind, amount, detail) == ("drift_found", 600, "repair 1: 1 item(s), expected 7.00 USD")


def test_a_mismatch_row_names_the_expected_total_with_its_currency() -> None:
    invoice, history = _finalizing("JPY")
    view = StripeInvoiceView(
        status="open", number="INV-9", total=703, amount_paid=0, attempt_count=0,
        next_payment_attempt=None, at=AT, source="evt_1",
    )  # fmt: skip
    invoice.observe(view)
    [*_, kind, _, amount, detail] = _row(invoice, history)
    assert (kind, amount, detail) == ("mismatch", 703, "expected 700 JPY (evt_1)")


def test_a_finalizing_invoice_whose_draft_is_replaced_expects_nothing_until_finalizing_again() -> (
    None
):
    from projections.invoices import _fold

    invoice = Invoice.open("acme", "USD", PERIOD, UUID(int=1))
    invoice.record_draft("in_1", "cus_1")
    invoice.close("period ended")
    invoice.start_finalizing([(UUID(int=1), 4, 700)])
    invoice.need_attention("Stripe refused the read back: http_404: No such invoice")
    invoice.replace_draft("http_404: No such invoice", "deleted by hand", "ops")
    rows: dict[UUID, dict[str, Any]] = {}
    for event in invoice.collect_events():
        _fold(rows, event)
    [row] = rows.values()
    # As the audit's replay folds it (domain.audit_invoices: None, compared as 0).
    assert (row["state"], row["expected_total"], row["stripe_invoice_id"]) == ("closed", 0, None)
