"""The invoice endpoints: create (a draft), retrieve, update, list, search, and lines.

This module owns the invoice object: what is stored, and how the rendered object is
derived from it and from the invoice's items (``lines``, ``subtotal``, ``total``,
``amount_due``, ``amount_remaining``).  Totals follow the items while the invoice is a
draft; once finalized its items are frozen (see :mod:`.invoice_items`), so they stay.
``amount_due`` is the total less pre-payment credit notes; ``amount_remaining`` is what is
still owed.  The transitions (finalize, pay, void, uncollectible) are in
:mod:`.invoice_actions`.  A draft never advances by itself, whatever ``auto_advance`` says.
"""

from __future__ import annotations

from typing import Final

from .customers import require_customer
from .errors import JsonObject, invalid, missing, state_error
from .events import previous_attributes, record_event
from .forms import (
    check_params,
    merge_metadata,
    metadata,
    new_id,
    opt_str,
    parse_bool,
    parse_int,
    required_str,
)
from .listing import LIST_PARAMS, created_filter, list_page, matches, parse_query, search_page
from .store import Call, Record, Result, Store, cursor_of

__all__ = [
    "LINES_EMBEDDED",
    "MAX_ITEMS_PER_INVOICE",
    "STATUSES",
    "create_invoice",
    "delete_invoice",
    "emit_invoice_event",
    "get_invoice",
    "line_id",
    "list_invoice_lines",
    "list_invoices",
    "render_invoice",
    "require_invoice",
    "search_invoices",
    "update_invoice",
]

MAX_ITEMS_PER_INVOICE: Final = 250
"""Stripe's limit of invoice items on one invoice (since API version 2016-02-22)."""
LINES_EMBEDDED: Final = 10
"""How many lines an invoice object embeds; the rest are paged at ``.../lines``."""
STATUSES: Final = ("draft", "open", "paid", "uncollectible", "void")

_CREATE: Final = frozenset(
    {
        "customer",
        "metadata",
        "description",
        "auto_advance",
        "collection_method",
        "days_until_due",
        "currency",
        "pending_invoice_items_behavior",
        "expand",
    }
)
_UPDATE: Final = frozenset({"metadata", "description", "auto_advance", "expand"})
_UPDATE_FINALIZED: Final = frozenset({"metadata", "auto_advance", "expand"})
_LIST: Final = LIST_PARAMS | {"customer", "status", "collection_method", "created"}
_LINES: Final = LIST_PARAMS
_RETRIEVE: Final = frozenset({"expand"})
_SEARCH: Final = frozenset({"query", "limit", "page", "expand"})
_SEARCH_FIELDS: Final = frozenset({"customer", "status", "currency", "number"})


def require_invoice(store: Store, invoice_id: str, param: str = "id", status: int = 404) -> Record:
    record = store.invoices.get(invoice_id)
    if record is None:
        raise missing("invoice", invoice_id, param, status=status)
    return record


def line_id(store: Store, item_id: str) -> str:
    """The id of the invoice line (``il_...``) invoice item ``item_id`` makes: its own
    random id, unrelated to the item's (Stripe's are too)."""
    return store.items[item_id].line_item_id


def create_invoice(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _CREATE)
    customer_id = required_str(params, "customer")
    behavior = opt_str(params, "pending_invoice_items_behavior") or "exclude"
    if behavior not in ("include", "exclude"):
        raise invalid(
            f"Invalid pending_invoice_items_behavior: {behavior}",
            "pending_invoice_items_behavior",
        )
    collection = opt_str(params, "collection_method") or "charge_automatically"
    if collection not in ("charge_automatically", "send_invoice"):
        raise invalid(f"Invalid collection_method: {collection}", "collection_method")
    auto_advance = params.get("auto_advance")
    auto = False if auto_advance is None else parse_bool(auto_advance, "auto_advance")
    days = params.get("days_until_due")
    days_until_due = (
        None if days in (None, "") else parse_int(days, "days_until_due", low=0, high=730)
    )
    invoice_metadata = metadata(params)
    customer = require_customer(store, customer_id)
    invoice_id = new_id("in_", 24)
    pending = [
        r
        for r in store.items.values()
        if not r.deleted and r.obj["customer"] == customer_id and r.obj["invoice"] is None
    ]
    currency = (
        opt_str(params, "currency") or (pending[0].obj["currency"] if pending else "usd")
    ).lower()
    lines: list[str] = []
    if behavior == "include":
        for record in pending:
            if record.obj["currency"] == currency and len(lines) < MAX_ITEMS_PER_INVOICE:
                record.obj["invoice"] = invoice_id
                lines.append(record.obj["id"])
    store.invoice_lines[invoice_id] = lines
    due_date = None if days_until_due is None else call.now + days_until_due * 86_400
    store.invoices[invoice_id] = Record(
        {
            "id": invoice_id,
            "object": "invoice",
            "account_country": "US",
            "amount_paid": 0,
            "amount_shipping": 0,
            "attempt_count": 0,
            "attempted": False,
            "auto_advance": auto,
            "billing_reason": "manual",
            "collection_method": collection,
            "created": call.now,
            "currency": currency,
            "customer": customer_id,
            "customer_email": customer["email"],
            "customer_name": customer["name"],
            "days_until_due": days_until_due,
            "description": opt_str(params, "description"),
            "due_date": due_date,
            "effective_at": None,
            "hosted_invoice_url": None,
            "invoice_pdf": None,
            "livemode": False,
            "metadata": invoice_metadata,
            "next_payment_attempt": None,
            "number": None,
            "period_end": call.now,
            "period_start": call.now,
            "post_payment_credit_notes_amount": 0,
            "pre_payment_credit_notes_amount": 0,
            "starting_balance": 0,
            "status": "draft",
            "status_transitions": {
                "finalized_at": None,
                "marked_uncollectible_at": None,
                "paid_at": None,
                "voided_at": None,
            },
        },
        store.next_seq(),
    )
    rendered = emit_invoice_event(store, invoice_id, "invoice.created", call)
    return Result(rendered, invoice_id, mutated=True)


def get_invoice(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    invoice_id = call.path_id or ""
    require_invoice(store, invoice_id)
    return Result(render_invoice(store, invoice_id), invoice_id)


def delete_invoice(store: Store, call: Call) -> Result:
    """``DELETE /v1/invoices/{id}``: a draft is deleted for good (its items with it: they
    were made for it); a finalized invoice is refused (Stripe: void it instead). Deleted,
    it is gone: retrieving it again is a 404."""
    check_params(call.params, frozenset())
    invoice_id = call.path_id or ""
    record = require_invoice(store, invoice_id)
    if record.obj["status"] != "draft":
        raise state_error(
            "You can only delete draft invoices. Void finalized invoices instead.",
            code="invoice_not_editable",
        )
    rendered = render_invoice(store, invoice_id)
    for item in store.items.values():
        if item.obj["invoice"] == invoice_id and not item.deleted:
            item.deleted, item.deleted_at = True, float(call.now)
    del store.invoices[invoice_id]
    record_event(store, "invoice.deleted", rendered, call)
    return Result({"id": invoice_id, "object": "invoice", "deleted": True}, invoice_id,
                  mutated=True)  # fmt: skip


def update_invoice(store: Store, call: Call) -> Result:
    """``POST /v1/invoices/{id}``: a draft takes description, metadata and auto_advance; a
    finalized invoice only metadata and auto_advance."""
    params = call.params
    check_params(params, _UPDATE)
    auto_advance = params.get("auto_advance")
    auto = None if auto_advance is None else parse_bool(auto_advance, "auto_advance")
    description = opt_str(params, "description")
    invoice_id = call.path_id or ""
    inv = require_invoice(store, invoice_id).obj
    new_metadata = merge_metadata(inv["metadata"], params)
    if inv["status"] != "draft":
        refused = sorted(set(params) - _UPDATE_FINALIZED)
        if refused:
            raise state_error("Finalized invoices can't be updated in this way", refused[0])
    before = render_invoice(store, invoice_id)
    inv["metadata"] = new_metadata
    if auto is not None:
        inv["auto_advance"] = auto
    if "description" in params:
        inv["description"] = description
    after = render_invoice(store, invoice_id)
    previous = previous_attributes(before, after)
    if previous:
        record_event(store, "invoice.updated", after, call, previous)
    return Result(after, invoice_id, mutated=True)


def list_invoices(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _LIST)
    customer = opt_str(params, "customer")
    status = opt_str(params, "status")
    if status is not None and status not in STATUSES:
        raise invalid(f"Invalid status: must be one of {', '.join(STATUSES)}", "status")
    collection = opt_str(params, "collection_method")
    in_range = created_filter(params)
    records = [
        (r.seq, render_invoice(store, r.obj["id"]))
        for r in reversed(store.invoices.values())
        if (customer is None or r.obj["customer"] == customer)
        and (status is None or r.obj["status"] == status)
        and (collection is None or r.obj["collection_method"] == collection)
        and in_range(int(r.obj["created"]))
    ]
    return Result(list_page(records, params, "/v1/invoices", cursor_of(store.invoices, "invoice")))


def search_invoices(store: Store, call: Call) -> Result:
    check_params(call.params, _SEARCH)
    clauses = parse_query(required_str(call.params, "query"), _SEARCH_FIELDS)
    found = [
        render_invoice(store, r.obj["id"])
        for r in reversed(store.invoices.values())
        if matches(r.obj, clauses)
    ]
    return Result(search_page(found, call.params, "/v1/invoices/search"))


def list_invoice_lines(store: Store, call: Call) -> Result:
    """``GET /v1/invoices/{id}/lines``: the invoice's lines, newest first, paginated."""
    params = call.params
    check_params(params, _LINES)
    invoice_id = call.path_id or ""
    require_invoice(store, invoice_id, "invoice")
    items = [store.items[i] for i in reversed(store.invoice_lines.get(invoice_id, []))]
    by_line = {line_id(store, r.obj["id"]): r.seq for r in items}

    def cursor(object_id: str, param: str) -> int:
        if object_id not in by_line:
            raise invalid(f"No such line item: '{object_id}'", param, code="resource_missing")
        return by_line[object_id]

    records = [(r.seq, _render_line(store, r.obj, invoice_id)) for r in items]
    return Result(list_page(records, params, f"/v1/invoices/{invoice_id}/lines", cursor))


def emit_invoice_event(
    store: Store, invoice_id: str, type_: str, call: Call, previous: JsonObject | None = None
) -> JsonObject:
    """Record a ``type_`` event about the invoice as it is now; return the rendered invoice."""
    rendered = render_invoice(store, invoice_id)
    record_event(store, type_, rendered, call, previous)
    return rendered


def _render_line(store: Store, item: JsonObject, invoice_id: str) -> JsonObject:
    return {
        "id": line_id(store, item["id"]),
        "object": "line_item",
        "amount": item["amount"],
        "currency": item["currency"],
        "description": item["description"],
        "discount_amounts": [],
        "discountable": True,
        "discounts": [],
        "invoice": invoice_id,
        "invoice_item": item["id"],
        "livemode": False,
        "metadata": item["metadata"],
        "parent": {
            "type": "invoice_item_details",
            "invoice_item_details": {"invoice_item": item["id"], "proration": False},
            "subscription_item_details": None,
        },
        "period": item["period"],
        "quantity": 1,
    }


def render_invoice(store: Store, invoice_id: str) -> JsonObject:
    """The invoice object as the API answers it, derived from the stored one and its items."""
    base = store.invoices[invoice_id].obj
    item_ids = store.invoice_lines.get(invoice_id, [])
    total = sum(int(store.items[i].obj["amount"]) for i in item_ids)
    newest = [store.items[i].obj for i in reversed(item_ids[-LINES_EMBEDDED:])]
    amount_due = max(total - int(base["pre_payment_credit_notes_amount"]), 0)
    paid = int(base["amount_paid"])
    remaining = 0 if base["status"] == "paid" else max(amount_due - paid, 0)
    return {
        **base,
        "amount_due": amount_due,
        "amount_remaining": remaining,
        "lines": {
            "object": "list",
            "data": [_render_line(store, item, invoice_id) for item in newest],
            "has_more": len(item_ids) > LINES_EMBEDDED,
            "total_count": len(item_ids),
            "url": f"/v1/invoices/{invoice_id}/lines",
        },
        "subtotal": total,
        "subtotal_excluding_tax": total,
        "total": total,
        "total_excluding_tax": total,
    }
