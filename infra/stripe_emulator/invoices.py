"""The invoice endpoints: create (a draft) and retrieve.

This module owns the invoice object's shape: what is stored, and how the rendered object
(lines, totals and amounts) is derived from the stored invoice and its items.
"""

from __future__ import annotations

from typing import Final

from .customers import require_customer
from .errors import JsonObject, invalid, missing
from .forms import check_params, metadata, new_id, opt_str, parse_bool, required_str
from .store import Call, Result, Store

__all__ = ["create_invoice", "get_invoice", "render_invoice"]

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
_RETRIEVE: Final = frozenset({"expand"})


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
    invoice_metadata = metadata(params)
    require_customer(store, customer_id)
    invoice_id = new_id("in_", 24)
    pending = [
        r
        for r in store.items.values()
        if not r.deleted and r.obj["customer"] == customer_id and r.obj["invoice"] is None
    ]
    currency = (
        opt_str(params, "currency") or (pending[0].obj["currency"] if pending else "usd")
    ).lower()
    if behavior == "include":
        for record in pending:
            if record.obj["currency"] == currency:
                record.obj["invoice"] = invoice_id
    store.invoices[invoice_id] = {
        "id": invoice_id,
        "object": "invoice",
        "auto_advance": auto,
        "collection_method": collection,
        "created": call.now,
        "currency": currency,
        "customer": customer_id,
        "description": opt_str(params, "description"),
        "livemode": False,
        "metadata": invoice_metadata,
        "number": None,
        "status": "draft",
    }
    return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)


def get_invoice(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    invoice_id = call.path_id or ""
    if invoice_id not in store.invoices:
        raise missing("invoice", invoice_id, "id")
    return Result(render_invoice(store, invoice_id), invoice_id)


def render_invoice(store: Store, invoice_id: str) -> JsonObject:
    base = store.invoices[invoice_id]
    lines = [
        {
            "id": "il_" + r.obj["id"].removeprefix("ii_"),
            "object": "line_item",
            "amount": r.obj["amount"],
            "currency": r.obj["currency"],
            "description": r.obj["description"],
            "invoice": invoice_id,
            "invoice_item": r.obj["id"],
            "livemode": False,
            "metadata": r.obj["metadata"],
            "period": r.obj["period"],
            "quantity": 1,
        }
        for r in store.items.values()
        if not r.deleted and r.obj["invoice"] == invoice_id
    ]
    total = sum(int(line["amount"]) for line in lines)
    return {
        **base,
        "amount_due": total,
        "amount_paid": 0,
        "amount_remaining": total,
        "lines": {
            "object": "list",
            "data": lines,
            "has_more": False,
            "total_count": len(lines),
            "url": f"/v1/invoices/{invoice_id}/lines",
        },
        "subtotal": total,
        "total": total,
    }
