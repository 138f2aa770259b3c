"""The credit note endpoints: create, retrieve, list.

This module owns the credit note object and Stripe's rules for issuing one:

* only on a finalized invoice that is ``open`` or ``paid``;
* the amount is ``amount``, or the sum of ``lines`` (``invoice_line_item`` lines credit part
  or all of one invoice line, ``custom_line_item`` lines are ``unit_amount * quantity``),
  and both must agree when both are given;
* everything credited on an invoice never exceeds its total, nor a line's credits its amount;
* a credit note first reduces what is still owed (``pre_payment_amount``; the invoice's
  ``pre_payment_credit_notes_amount``, ``amount_due`` and ``amount_remaining``), the rest is
  ``post_payment_amount`` (the invoice's ``post_payment_credit_notes_amount``), which must be
  given out exactly by ``credit_amount`` (to the customer's balance), ``refund_amount`` and
  ``out_of_band_amount``;
* an open invoice whose ``amount_remaining`` reaches zero becomes ``paid``.

Issuing one records ``credit_note.created`` and ``invoice.updated`` (and ``invoice.paid``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import JsonObject, invalid, missing, state_error
from .events import previous_attributes, record_event
from .forms import (
    MAX_AMOUNT,
    check_params,
    metadata,
    new_id,
    opt_amount,
    opt_str,
    parse_int,
    required_str,
)
from .invoice_actions import mark_paid
from .invoices import line_id, render_invoice, require_invoice
from .listing import LIST_PARAMS, created_filter, list_page
from .store import Call, Record, Result, Store, cursor_of

__all__ = ["REASONS", "create_credit_note", "get_credit_note", "list_credit_notes"]

REASONS: Final = ("duplicate", "fraudulent", "order_change", "product_unsatisfactory")

_CREATE: Final = frozenset(
    {
        "invoice",
        "amount",
        "lines",
        "reason",
        "memo",
        "metadata",
        "credit_amount",
        "refund_amount",
        "out_of_band_amount",
        "email_type",
        "expand",
    }
)
_LIST: Final = LIST_PARAMS | {"invoice", "customer", "created"}
_RETRIEVE: Final = frozenset({"expand"})
_LINE_TYPES: Final = ("invoice_line_item", "custom_line_item")


@dataclass(frozen=True)
class _Line:
    type: str
    param: str
    invoice_line_item: str | None
    amount: int | None
    quantity: int
    unit_amount: int | None
    description: str | None


def _parse_line(index: str, raw: object) -> _Line:
    param = f"lines[{index}]"
    if not isinstance(raw, dict):
        raise invalid("Invalid hash", param)
    type_ = opt_str(raw, "type")
    if type_ not in _LINE_TYPES:
        raise invalid(f"Invalid type: must be one of {', '.join(_LINE_TYPES)}", f"{param}[type]")
    quantity = (
        1
        if raw.get("quantity") in (None, "")
        else (parse_int(raw["quantity"], f"{param}[quantity]", low=1, high=MAX_AMOUNT))
    )
    amount = opt_amount(raw, "amount")
    if type_ == "invoice_line_item":
        line_item = opt_str(raw, "invoice_line_item")
        if line_item is None:
            raise invalid(
                "Missing required param: invoice_line_item.", f"{param}[invoice_line_item]"
            )
        return _Line(type_, param, line_item, amount, quantity, None, None)
    unit = opt_amount(raw, "unit_amount")
    description = opt_str(raw, "description")
    if unit is None or description is None:
        missing_name = "unit_amount" if unit is None else "description"
        raise invalid(f"Missing required param: {missing_name}.", f"{param}[{missing_name}]")
    return _Line(type_, param, None, unit * quantity, quantity, unit, description)


def _parse_lines(params: JsonObject) -> list[_Line]:
    raw = params.get("lines")
    if raw in (None, ""):
        return []
    if not isinstance(raw, dict):
        raise invalid("Invalid array", "lines")
    return [_parse_line(index, value) for index, value in raw.items()]


def _credited(store: Store, invoice_id: str) -> list[JsonObject]:
    return [r.obj for r in store.credit_notes.values() if r.obj["invoice"] == invoice_id]


def _resolve_lines(
    store: Store, invoice_id: str, lines: list[_Line], earlier: list[JsonObject]
) -> list[JsonObject]:
    """The credit note's line objects; checks invoice lines exist and are not over-credited."""
    items = {line_id(store, i): store.items[i].obj for i in store.invoice_lines.get(invoice_id, [])}
    out: list[JsonObject] = []
    for line in lines:
        amount = line.amount
        if line.invoice_line_item is not None:
            item = items.get(line.invoice_line_item)
            if item is None:
                raise missing(
                    "line item", line.invoice_line_item, f"{line.param}[invoice_line_item]", 400
                )
            if amount is None:
                amount = int(item["amount"]) * line.quantity
            already = sum(
                int(cn_line["amount"])
                for cn in earlier
                for cn_line in cn["lines"]["data"]
                if cn_line["invoice_line_item"] == line.invoice_line_item
            )
            if already + amount > int(item["amount"]):
                raise state_error(
                    f"The amount credited on line {line.invoice_line_item} ({already + amount}) "
                    f"cannot exceed its amount ({item['amount']}).",
                    f"{line.param}[amount]",
                )
        out.append(
            {
                "id": new_id("cnli_", 24),
                "object": "credit_note_line_item",
                "amount": amount,
                "description": line.description,
                "discount_amount": 0,
                "discount_amounts": [],
                "invoice_line_item": line.invoice_line_item,
                "livemode": False,
                "quantity": line.quantity,
                "type": line.type,
                "unit_amount": line.unit_amount,
            }
        )
    return out


def create_credit_note(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _CREATE)
    invoice_id = required_str(params, "invoice")
    reason = opt_str(params, "reason")
    if reason is not None and reason not in REASONS:
        raise invalid(f"Invalid reason: must be one of {', '.join(REASONS)}", "reason")
    amount = opt_amount(params, "amount", low=1)
    lines = _parse_lines(params)
    if amount is None and not lines:
        raise invalid("One of `amount`, `lines`, or `shipping_cost` must be provided.", "amount")
    allocations = {
        name: opt_amount(params, name)
        for name in ("credit_amount", "refund_amount", "out_of_band_amount")
    }
    memo = opt_str(params, "memo")
    note_metadata = metadata(params)
    # Execution begins here: from now on errors are saved under the idempotency key.
    record = require_invoice(store, invoice_id, "invoice", status=400)
    inv = record.obj
    if inv["status"] not in ("open", "paid"):
        raise state_error(
            f"Credit notes can only be issued on open or paid invoices; invoice {invoice_id} "
            f"is {inv['status']}.",
            "invoice",
        )
    earlier = _credited(store, invoice_id)
    note_lines = _resolve_lines(store, invoice_id, lines, earlier)
    lines_total = sum(int(line["amount"]) for line in note_lines)
    if amount is not None and note_lines and amount != lines_total:
        raise state_error(
            f"The credit note amount ({amount}) must equal the sum of its lines ({lines_total}).",
            "amount",
        )
    total = lines_total if amount is None else amount
    before = render_invoice(store, invoice_id)
    creditable = int(before["total"]) - sum(int(cn["amount"]) for cn in earlier)
    if total > creditable:
        raise state_error(
            f"The credit note total ({total}) exceeds the amount that can still be credited on "
            f"invoice {invoice_id} ({creditable} of its total {before['total']}).",
            "amount",
        )
    pre = min(total, int(before["amount_remaining"])) if inv["status"] == "open" else 0
    post = total - pre
    given = sum(v or 0 for v in allocations.values())
    if given != post:
        raise state_error(
            "The sum of credit_amount, refund_amount and out_of_band_amount "
            f"({given}) must equal the credit note's post-payment amount ({post}).",
        )
    if not note_lines:
        note_lines = [_custom_line(total, memo)]
    note = _issue(
        store, call, inv, lines=note_lines, split=(total, pre, post), allocations=allocations
    )
    note.update(memo=memo, metadata=note_metadata, reason=reason)
    inv["pre_payment_credit_notes_amount"] += pre
    inv["post_payment_credit_notes_amount"] += post
    if allocations["credit_amount"]:
        store.customers[inv["customer"]]["balance"] -= allocations["credit_amount"]
    record_event(store, "credit_note.created", note, call)
    after = render_invoice(store, invoice_id)
    record_event(store, "invoice.updated", after, call, previous_attributes(before, after))
    if inv["status"] == "open" and after["amount_remaining"] == 0:
        mark_paid(store, record, call, attempt=False, collected=False, succeeded_event=False)
    return Result(note, note["id"], mutated=True)


def _custom_line(amount: int, memo: str | None) -> JsonObject:
    return {
        "id": new_id("cnli_", 24),
        "object": "credit_note_line_item",
        "amount": amount,
        "description": memo or "Credit",
        "discount_amount": 0,
        "discount_amounts": [],
        "invoice_line_item": None,
        "livemode": False,
        "quantity": 1,
        "type": "custom_line_item",
        "unit_amount": amount,
    }


def _issue(
    store: Store,
    call: Call,
    inv: JsonObject,
    *,
    lines: list[JsonObject],
    split: tuple[int, int, int],
    allocations: dict[str, int | None],
) -> JsonObject:
    """Store a new credit note of ``split`` = (total, pre-payment, post-payment) amounts."""
    total, pre, post = split
    note_id = new_id("cn_", 24)
    count = 1 + sum(1 for r in store.credit_notes.values() if r.obj["invoice"] == inv["id"])
    refund = allocations["refund_amount"]
    note: JsonObject = {
        "id": note_id,
        "object": "credit_note",
        "amount": total,
        "amount_shipping": 0,
        "created": call.now,
        "currency": inv["currency"],
        "customer": inv["customer"],
        "customer_balance_transaction": new_id("cbtxn_", 24)
        if allocations["credit_amount"]
        else None,
        "discount_amount": 0,
        "discount_amounts": [],
        "effective_at": call.now,
        "invoice": inv["id"],
        "lines": {
            "object": "list",
            "data": lines,
            "has_more": False,
            "url": f"/v1/credit_notes/{note_id}/lines",
        },
        "livemode": False,
        "memo": None,
        "metadata": {},
        "number": f"{inv['number']}-CN-{count:02d}",
        "out_of_band_amount": allocations["out_of_band_amount"],
        "pdf": f"https://pay.stripe.com/credit_notes/emulator/{note_id}/pdf",
        "post_payment_amount": post,
        "pre_payment_amount": pre,
        "reason": None,
        "refunds": [{"amount_refunded": refund, "refund": new_id("re_", 24)}] if refund else [],
        "shipping_cost": None,
        "status": "issued",
        "subtotal": total,
        "subtotal_excluding_tax": total,
        "total": total,
        "total_excluding_tax": total,
        "total_taxes": [],
        "type": "mixed" if pre and post else ("post_payment" if post else "pre_payment"),
        "voided_at": None,
    }
    store.credit_notes[note_id] = Record(note, store.next_seq())
    return note


def get_credit_note(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    note_id = call.path_id or ""
    record = store.credit_notes.get(note_id)
    if record is None:
        raise missing("credit_note", note_id, "id")
    return Result(record.obj, note_id)


def list_credit_notes(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _LIST)
    invoice = opt_str(params, "invoice")
    customer = opt_str(params, "customer")
    in_range = created_filter(params)
    records = [
        (r.seq, r.obj)
        for r in reversed(store.credit_notes.values())
        if (invoice is None or r.obj["invoice"] == invoice)
        and (customer is None or r.obj["customer"] == customer)
        and in_range(int(r.obj["created"]))
    ]
    cursor = cursor_of(store.credit_notes, "credit_note")
    return Result(list_page(records, params, "/v1/credit_notes", cursor))
