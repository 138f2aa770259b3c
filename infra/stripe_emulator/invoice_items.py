"""The invoice item endpoints: create, retrieve, delete, list, and search by metadata.

This module owns the invoice item object's shape and its handlers.  ``GET
/v1/invoiceitems/search`` does not exist in real Stripe; the emulator serves it so a client
can look an item up by its metadata.
"""

from __future__ import annotations

import re
import time
from typing import Final

from .customers import require_customer
from .errors import JsonObject, invalid, missing
from .forms import (
    MAX_AMOUNT,
    check_params,
    metadata,
    new_id,
    opt_str,
    parse_bool,
    parse_int,
    required_str,
)
from .listing import LIST_PARAMS, list_page, matches, parse_query, search_page
from .store import Call, ItemRecord, Result, Store

__all__ = [
    "create_invoice_item",
    "delete_invoice_item",
    "get_invoice_item",
    "list_invoice_items",
    "live_item",
    "search_invoice_items",
]

_CREATE: Final = frozenset({"customer", "amount", "currency", "description", "metadata", "expand"})
_LIST: Final = LIST_PARAMS | {"customer", "pending", "invoice"}
_RETRIEVE: Final = frozenset({"expand"})
_SEARCH: Final = frozenset({"query", "limit", "page", "expand"})


def live_item(store: Store, item_id: str) -> ItemRecord:
    record = store.items.get(item_id)
    if record is None or record.deleted:
        raise missing("invoiceitem", item_id, "id")
    return record


def create_invoice_item(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _CREATE)
    customer_id = required_str(params, "customer")
    raw_amount = params.get("amount")
    if raw_amount in (None, ""):
        raise invalid("Missing required param: amount.", "amount", code="parameter_missing")
    amount = parse_int(raw_amount, "amount", low=0, high=MAX_AMOUNT)
    currency = (opt_str(params, "currency") or "usd").lower()
    if not re.fullmatch(r"[a-z]{3}", currency):
        raise invalid(f"Invalid currency: {currency}", "currency")
    description = opt_str(params, "description")
    item_metadata = metadata(params)
    # Execution begins here: from now on errors are saved under the idempotency key.
    require_customer(store, customer_id)
    item_id = new_id("ii_", 24)
    item: JsonObject = {
        "id": item_id,
        "object": "invoiceitem",
        "amount": amount,
        "currency": currency,
        "customer": customer_id,
        "date": call.now,
        "description": description,
        "discountable": True,
        "discounts": [],
        "invoice": None,
        "livemode": False,
        "metadata": item_metadata,
        "net_amount": amount,
        "parent": None,
        "period": {"end": call.now, "start": call.now},
        "proration": False,
        "quantity": 1,
        "tax_rates": [],
        "test_clock": None,
    }
    store.items[item_id] = ItemRecord(item, store.next_seq())
    return Result(item, item_id, mutated=True)


def get_invoice_item(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    record = live_item(store, call.path_id or "")
    return Result(record.obj, record.obj["id"])


def delete_invoice_item(store: Store, call: Call) -> Result:
    check_params(call.params, frozenset())
    record = live_item(store, call.path_id or "")
    record.deleted = True
    record.deleted_at = time.time()
    item_id: str = record.obj["id"]
    deleted = {"id": item_id, "object": "invoiceitem", "deleted": True}
    return Result(deleted, item_id, mutated=True)


def list_invoice_items(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _LIST)
    customer = opt_str(params, "customer")
    invoice = opt_str(params, "invoice")
    pending = None if params.get("pending") is None else parse_bool(params["pending"], "pending")
    records = [
        (r.seq, r.obj)
        for r in reversed(store.items.values())
        if not r.deleted
        and (customer is None or r.obj["customer"] == customer)
        and (invoice is None or r.obj["invoice"] == invoice)
        and (pending is None or (r.obj["invoice"] is None) == pending)
    ]
    return Result(list_page(records, params, "/v1/invoiceitems", store.item_cursor))


def search_invoice_items(store: Store, call: Call) -> Result:
    check_params(call.params, _SEARCH)
    clauses = parse_query(required_str(call.params, "query"))
    found = [
        r.obj for r in reversed(store.items.values()) if not r.deleted and matches(r.obj, clauses)
    ]
    return Result(search_page(found, call.params, "/v1/invoiceitems/search"))
