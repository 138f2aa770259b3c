"""The invoice transitions: finalize, pay, void, mark uncollectible.

This module owns Stripe's invoice state machine::

    draft --finalize--> open --pay--> paid
                         |  \\--void--> void
                         \\--mark_uncollectible--> uncollectible --pay--> paid
                                                                 \\--void--> void

* finalizing assigns ``number`` (``{customer.invoice_prefix}-0001``, the customer's
  ``next_invoice_sequence``), sets ``status_transitions.finalized_at`` and freezes the items;
  a total of zero is paid at once, as Stripe does; a non-draft cannot be finalized again;
* paying a draft finalizes it first (as Stripe does); a payment attempt counts in
  ``attempt_count``; a declined one (a customer's card switched to declined, or the
  ``payment_failures`` fault) leaves the invoice open with ``next_payment_attempt`` set and
  answers 402 ``card_error``; ``paid_out_of_band=true`` pays without an attempt;
* every transition records its events (``invoice.finalized``, ``invoice.paid``,
  ``invoice.payment_succeeded``, ``invoice.payment_failed``, ``invoice.voided``,
  ``invoice.marked_uncollectible``).

:func:`settle` and :func:`decline` are the control API's "the customer paid" and "a payment
attempt failed" helpers.
"""

from __future__ import annotations

from typing import Final

from .errors import ApiError, JsonObject, state_error
from .forms import check_params, parse_bool
from .invoices import emit_invoice_event, render_invoice, require_invoice
from .store import Call, Record, Result, Store

__all__ = [
    "PAYMENT_RETRY_S",
    "decline",
    "finalize_invoice",
    "mark_paid",
    "mark_uncollectible",
    "pay_invoice",
    "settle",
    "void_invoice",
]

PAYMENT_RETRY_S: Final = 3 * 86_400
"""After a declined attempt, ``next_payment_attempt`` is set this far ahead."""

_FINALIZE: Final = frozenset({"auto_advance", "expand"})
_PAY: Final = frozenset({"paid_out_of_band", "off_session", "forgive", "expand"})
_ACTION: Final = frozenset({"expand"})
_NOT_OPEN: Final = "You can only pass in open invoices. This invoice isn't open."


def _card_declined() -> ApiError:
    return ApiError(
        402,
        "card_error",
        "Your card was declined.",
        code="card_declined",
        extra={"decline_code": "generic_decline"},
    )


def _finalize(store: Store, record: Record, call: Call) -> None:
    inv = record.obj
    customer = store.customers[inv["customer"]]
    sequence = int(customer["next_invoice_sequence"])
    customer["next_invoice_sequence"] = sequence + 1
    inv["number"] = f"{customer['invoice_prefix']}-{sequence:04d}"
    inv["status"] = "open"
    inv["effective_at"] = call.now
    inv["status_transitions"]["finalized_at"] = call.now
    base = f"https://invoice.stripe.com/i/emulator/{inv['id']}"
    inv["hosted_invoice_url"], inv["invoice_pdf"] = base, base + "/pdf"
    emit_invoice_event(store, inv["id"], "invoice.finalized", call)
    if render_invoice(store, inv["id"])["amount_due"] == 0:
        inv["attempted"] = True  # Stripe settles a zero invoice at once, with no attempt
        mark_paid(store, record, call, attempt=False)


def mark_paid(
    store: Store,
    record: Record,
    call: Call,
    *,
    attempt: bool,
    collected: bool = True,
    succeeded_event: bool = True,
) -> None:
    """open/uncollectible -> paid, with ``invoice.paid``.

    ``attempt``: a payment attempt counts; ``collected``: ``amount_paid`` becomes the amount
    due (not when a credit note settled it); ``succeeded_event``: also record
    ``invoice.payment_succeeded`` (not for a payment out of band or by credit note).
    """
    inv = record.obj
    if collected:
        inv["amount_paid"] = render_invoice(store, inv["id"])["amount_due"]
    if attempt:
        inv["attempt_count"] += 1
        inv["attempted"] = True
    inv["status"] = "paid"
    inv["next_payment_attempt"] = None
    inv["status_transitions"]["paid_at"] = call.now
    emit_invoice_event(store, inv["id"], "invoice.paid", call)
    if succeeded_event:
        emit_invoice_event(store, inv["id"], "invoice.payment_succeeded", call)


def _record_failure(store: Store, record: Record, call: Call) -> None:
    inv = record.obj
    inv["attempt_count"] += 1
    inv["attempted"] = True
    inv["next_payment_attempt"] = call.now + PAYMENT_RETRY_S
    emit_invoice_event(store, inv["id"], "invoice.payment_failed", call)


def finalize_invoice(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _FINALIZE)
    raw = params.get("auto_advance")
    auto = None if raw is None else parse_bool(raw, "auto_advance")
    invoice_id = call.path_id or ""
    record = require_invoice(store, invoice_id)
    if record.obj["status"] != "draft":
        raise state_error(
            "This invoice is already finalized, you can't re-finalize a non-draft invoice."
        )
    if auto is not None:
        record.obj["auto_advance"] = auto
    _finalize(store, record, call)
    return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)


def pay_invoice(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _PAY)
    raw = params.get("paid_out_of_band")
    out_of_band = raw is not None and parse_bool(raw, "paid_out_of_band")
    invoice_id = call.path_id or ""
    record = require_invoice(store, invoice_id)
    status = record.obj["status"]
    if status == "paid":
        raise state_error("Invoice is already paid")
    if status == "void":
        raise state_error(_NOT_OPEN)
    if status == "draft":
        _finalize(store, record, call)
        if record.obj["status"] == "paid":
            return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)
    if out_of_band:
        mark_paid(store, record, call, attempt=False, succeeded_event=False)
    elif store.payment_declined(record.obj["customer"]):
        _record_failure(store, record, call)
        error = _card_declined().payload(call.request_id)
        return Result(error, invoice_id, mutated=True, status=402)
    else:
        mark_paid(store, record, call, attempt=True)
    return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)


def void_invoice(store: Store, call: Call) -> Result:
    check_params(call.params, _ACTION)
    invoice_id = call.path_id or ""
    record = require_invoice(store, invoice_id)
    status = record.obj["status"]
    if status == "paid":
        raise state_error("Invoices with `paid` payments cannot be voided.")
    if status not in ("open", "uncollectible"):
        raise state_error(_NOT_OPEN)
    record.obj["status"] = "void"
    record.obj["next_payment_attempt"] = None
    record.obj["status_transitions"]["voided_at"] = call.now
    rendered = emit_invoice_event(store, invoice_id, "invoice.voided", call)
    return Result(rendered, invoice_id, mutated=True)


def mark_uncollectible(store: Store, call: Call) -> Result:
    check_params(call.params, _ACTION)
    invoice_id = call.path_id or ""
    record = require_invoice(store, invoice_id)
    status = record.obj["status"]
    if status == "uncollectible":
        raise state_error("This invoice has already been marked uncollectible.")
    if status != "open":
        raise state_error(_NOT_OPEN)
    record.obj["status"] = "uncollectible"
    record.obj["next_payment_attempt"] = None
    record.obj["status_transitions"]["marked_uncollectible_at"] = call.now
    rendered = emit_invoice_event(store, invoice_id, "invoice.marked_uncollectible", call)
    return Result(rendered, invoice_id, mutated=True)


def _payable(store: Store, invoice_id: str) -> Record:
    record = store.invoices.get(invoice_id)
    if record is None:
        raise LookupError(f"no such invoice: {invoice_id!r}")
    status = record.obj["status"]
    if status not in ("open", "uncollectible"):
        raise ValueError(f"invoice {invoice_id} is {status}; only open or uncollectible ones pay")
    return record


def settle(store: Store, invoice_id: str, call: Call) -> JsonObject:
    """The customer paid (a successful attempt, whatever the faults): open -> paid."""
    record = _payable(store, invoice_id)
    mark_paid(store, record, call, attempt=True)
    return render_invoice(store, invoice_id)


def decline(store: Store, invoice_id: str, call: Call) -> JsonObject:
    """A payment attempt failed: ``attempt_count`` += 1, ``invoice.payment_failed``."""
    record = _payable(store, invoice_id)
    _record_failure(store, record, call)
    return render_invoice(store, invoice_id)
