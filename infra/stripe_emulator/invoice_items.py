"""The invoice item endpoints: create, retrieve, update, delete, list, and search by
metadata; and the bulk update of a draft's lines (``POST /v1/invoices/{id}/update_lines``).

This module owns the invoice item object and its handlers, including Stripe's rules for
items on an invoice: ``invoice=in_...`` attaches a new item to a draft invoice of the same
customer and currency; an invoice holds at most 250 items; an item can be updated
(``amount``, ``description``, ``metadata``) or deleted while it is pending or its invoice is
a draft, and not once the invoice is finalized.  ``GET /v1/invoiceitems/search`` does not
exist in real Stripe; the emulator serves it so a client can look an item up by metadata.

``update_lines`` sets several lines of one draft invoice in one request, each named by its
*line item* id (``il_...``, from the invoice's ``lines``; an invoice item's ``ii_`` id is
refused, as Stripe refuses it): an invoice item line takes ``amount``, ``description`` and
``metadata`` (merged), which change the invoice item behind it. Every line is checked
before any is changed, so a refused request changes nothing: an invoice that is not a
draft, a line id that is not on this invoice, the same line twice, more than
``MAX_LINES_PER_UPDATE`` lines. It answers the invoice, as Stripe does.

``add_lines`` adds several lines to one draft invoice in one request: each a new invoice
item of the invoice's customer and currency (``amount``, ``description``, ``metadata``,
``period``, ``discountable``), or an unassigned (pending) invoice item of that customer
named by its ``ii_`` id (``invoice_item``; a line item id is refused, as Stripe refuses
it). The same checks first, so a refused request makes nothing: an invoice that is not a
draft, more than ``MAX_LINES_PER_UPDATE`` lines, more items than an invoice holds, an
item that is not pending or not the customer's, or given twice. It answers the invoice
(its ``lines`` the first page), as Stripe does.
"""

from __future__ import annotations

import re
import time
from typing import Final

from .customers import require_customer
from .errors import JsonObject, invalid, missing, state_error
from .events import previous_attributes, record_event
from .forms import (
    MAX_AMOUNT,
    check_params,
    merge_metadata,
    metadata,
    new_id,
    opt_amount,
    opt_str,
    parse_bool,
    parse_int,
    required_str,
)
from .invoices import MAX_ITEMS_PER_INVOICE, line_id, render_invoice, require_invoice
from .listing import LIST_PARAMS, list_page, matches, parse_query, search_page
from .store import Call, ItemRecord, Result, Store

__all__ = [
    "MAX_LINES_PER_UPDATE",
    "add_invoice_lines",
    "create_invoice_item",
    "delete_invoice_item",
    "get_invoice_item",
    "list_invoice_items",
    "live_item",
    "search_invoice_items",
    "update_invoice_item",
    "update_invoice_lines",
]

MAX_LINES_PER_UPDATE: Final = 50
"""The most lines one ``update_lines`` request may name here. Stripe's API reference and
its guide to bulk line items (read 2026-12-05) state no number; the OpenAPI spec was not
reachable. The emulator enforces this bound so a client that does not chunk is caught;
the ledger's pushes send at most ``domain.pushing.MAX_LINES_PER_UPDATE``, the same."""

_CREATE: Final = frozenset(
    {"customer", "amount", "currency", "description", "metadata", "invoice", "expand"}
)
_UPDATE: Final = frozenset({"amount", "description", "metadata", "expand"})
_UPDATE_LINES: Final = frozenset({"lines", "invoice_metadata", "expand"})
_LINE_UPDATE: Final = frozenset({"id", "amount", "description", "metadata"})
_ADD_LINES: Final = frozenset({"lines", "invoice_metadata", "expand"})
_LINE_ADD: Final = frozenset(
    {"amount", "description", "metadata", "period", "discountable", "invoice_item"}
)
_LIST: Final = LIST_PARAMS | {"customer", "pending", "invoice"}
_RETRIEVE: Final = frozenset({"expand"})
_SEARCH: Final = frozenset({"query", "limit", "page", "expand"})
_NOT_EDITABLE: Final = "invoice_not_editable"


def live_item(store: Store, item_id: str) -> ItemRecord:
    record = store.items.get(item_id)
    if record is None or record.deleted:
        raise missing("invoiceitem", item_id, "id")
    return record


def _attach_target(store: Store, invoice_id: str, customer_id: str, currency: str | None) -> str:
    """Check that a new item may join ``invoice_id``; return the item's currency."""
    inv = require_invoice(store, invoice_id, "invoice", status=400).obj
    if inv["status"] != "draft":
        raise state_error(
            "Invalid invoice: This invoice is no longer editable", "invoice", code=_NOT_EDITABLE
        )
    if inv["customer"] != customer_id:
        raise state_error(
            f"The invoice item's customer ({customer_id}) must match the customer of invoice "
            f"{invoice_id} ({inv['customer']}).",
            "invoice",
        )
    if currency is not None and currency != inv["currency"]:
        raise state_error(
            f"The currency of the invoice item ({currency}) must match the currency of invoice "
            f"{invoice_id} ({inv['currency']}).",
            "currency",
        )
    if len(store.invoice_lines.get(invoice_id, [])) >= MAX_ITEMS_PER_INVOICE:
        raise state_error(
            f"An invoice can have at most {MAX_ITEMS_PER_INVOICE} invoice items; invoice "
            f"{invoice_id} already has {MAX_ITEMS_PER_INVOICE}. Create a new invoice for more.",
            "invoice",
        )
    return str(inv["currency"])


def _check_editable(store: Store, record: ItemRecord, verb: str) -> str | None:
    """The draft invoice the item is on (None if pending); refuse if it is finalized."""
    invoice_id: str | None = record.obj["invoice"]
    if invoice_id is not None and store.invoices[invoice_id].obj["status"] != "draft":
        raise state_error(
            f"Can't {verb} an invoice item that is attached to an invoice that is no longer "
            "editable",
            code=_NOT_EDITABLE,
        )
    return invoice_id


def _invoice_changed(store: Store, invoice_id: str, before: JsonObject, call: Call) -> None:
    after = render_invoice(store, invoice_id)
    previous = previous_attributes(before, after)
    if previous:
        record_event(store, "invoice.updated", after, call, previous)


def create_invoice_item(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _CREATE)
    customer_id = required_str(params, "customer")
    raw_amount = params.get("amount")
    if raw_amount in (None, ""):
        raise invalid("Missing required param: amount.", "amount", code="parameter_missing")
    # Negative: a credit or discount on the invoice, as Stripe allows.
    amount = parse_int(raw_amount, "amount", low=-MAX_AMOUNT, high=MAX_AMOUNT)
    currency = opt_str(params, "currency")
    if currency is not None:
        currency = currency.lower()
        if not re.fullmatch(r"[a-z]{3}", currency):
            raise invalid(f"Invalid currency: {currency}", "currency")
    invoice_id = opt_str(params, "invoice")
    description = opt_str(params, "description")
    item_metadata = metadata(params)
    # Execution begins here: from now on errors are saved under the idempotency key.
    require_customer(store, customer_id)
    before: JsonObject | None = None
    if invoice_id is not None:
        currency = _attach_target(store, invoice_id, customer_id, currency)
        before = render_invoice(store, invoice_id)
    item = _new_item(
        store, call, customer_id, currency or "usd", amount, description, item_metadata
    )
    if invoice_id is not None and before is not None:
        item["invoice"] = invoice_id
        store.invoice_lines.setdefault(invoice_id, []).append(item["id"])
    record_event(store, "invoiceitem.created", item, call)
    if invoice_id is not None and before is not None:
        _invoice_changed(store, invoice_id, before, call)
    return Result(item, item["id"], mutated=True)


def _new_item(  # noqa: PLR0917 (an item's fields)
    store: Store,
    call: Call,
    customer_id: str,
    currency: str,
    amount: int,
    description: str | None,
    item_metadata: dict[str, str],
    period: JsonObject | None = None,
    discountable: bool = True,
) -> JsonObject:
    """A new pending invoice item, stored (with the random id of the line it makes)."""
    item_id = new_id("ii_", 24)
    item: JsonObject = {
        "id": item_id,
        "object": "invoiceitem",
        "amount": amount,
        "currency": currency,
        "customer": customer_id,
        "date": call.now,
        "description": description,
        "discountable": discountable,
        "discounts": [],
        "invoice": None,
        "livemode": False,
        "metadata": item_metadata,
        "net_amount": amount,
        "parent": None,
        "period": period or {"end": call.now, "start": call.now},
        "proration": False,
        "quantity": 1,
        "tax_rates": [],
        "test_clock": None,
    }
    store.items[item_id] = ItemRecord(item, store.next_seq(), new_id("il_", 24))
    return item


def get_invoice_item(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    record = live_item(store, call.path_id or "")
    return Result(record.obj, record.obj["id"])


def update_invoice_item(store: Store, call: Call) -> Result:
    """``POST /v1/invoiceitems/{id}``: metadata merges; an empty value unsets a key."""
    params = call.params
    check_params(params, _UPDATE)
    amount = opt_amount(params, "amount", low=-MAX_AMOUNT)
    description = opt_str(params, "description")
    record = live_item(store, call.path_id or "")
    new_metadata = merge_metadata(record.obj["metadata"], params)
    invoice_id = _check_editable(store, record, "update")
    before = None if invoice_id is None else render_invoice(store, invoice_id)
    item = record.obj
    if amount is not None:
        item["amount"] = item["net_amount"] = amount
    if "description" in params:
        item["description"] = description
    item["metadata"] = new_metadata
    if invoice_id is not None and before is not None:
        _invoice_changed(store, invoice_id, before, call)
    return Result(item, item["id"], mutated=True)


def delete_invoice_item(store: Store, call: Call) -> Result:
    check_params(call.params, frozenset())
    record = live_item(store, call.path_id or "")
    invoice_id = _check_editable(store, record, "delete")
    before = None if invoice_id is None else render_invoice(store, invoice_id)
    record.deleted = True
    record.deleted_at = time.time()
    item_id: str = record.obj["id"]
    record_event(store, "invoiceitem.deleted", record.obj, call)
    if invoice_id is not None and before is not None:
        store.invoice_lines[invoice_id].remove(item_id)
        _invoice_changed(store, invoice_id, before, call)
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


def _lines_param(params: JsonObject, verb: str) -> list[tuple[str, JsonObject]]:
    """``lines[n][...]`` in order: (its parameter name, its fields); at most
    ``MAX_LINES_PER_UPDATE`` of them (``verb``: what the request does to them)."""
    raw = params.get("lines")
    if raw in (None, ""):
        raise invalid("Missing required param: lines.", "lines", code="parameter_missing")
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise invalid("Invalid array", "lines")
    if not all(k.isdigit() for k in raw):
        raise invalid("Invalid array", "lines")
    ordered = sorted(raw.items(), key=lambda kv: int(kv[0]))
    if len(ordered) > MAX_LINES_PER_UPDATE:
        raise invalid(
            f"You can {verb} at most {MAX_LINES_PER_UPDATE} lines in one request;"
            f" {len(ordered)} were given.",
            "lines",
        )
    return [(f"lines[{k}]", v) for k, v in ordered]


def update_invoice_lines(store: Store, call: Call) -> Result:
    """``POST /v1/invoices/{id}/update_lines``: set the named lines of a draft (see the
    module docstring); every line is checked before any changes."""
    params = call.params
    check_params(params, _UPDATE_LINES)
    lines = _lines_param(params, "update")
    changes: list[tuple[str, int | None, JsonObject]] = []
    for param, fields in lines:
        for name in fields:
            if name not in _LINE_UPDATE:
                raise invalid(f"Received unknown parameter: {param}[{name}]", f"{param}[{name}]")
        line = fields.get("id")
        if not isinstance(line, str) or not line:
            raise invalid(
                f"Missing required param: {param}[id].", f"{param}[id]", code="parameter_missing"
            )
        changes.append((line, opt_amount(fields, "amount", low=-MAX_AMOUNT), fields))
    invoice_id, inv, invoice_metadata = _editable_draft(store, call)
    by_line = {line_id(store, i): i for i in store.invoice_lines.get(invoice_id, [])}
    seen: set[str] = set()
    updates: list[tuple[ItemRecord, int | None, JsonObject, dict[str, str]]] = []
    for index, (line, amount, fields) in enumerate(changes):
        param = f"lines[{index}][id]"
        if line in seen:
            raise state_error(f"Line item {line} is given more than once.", param)
        seen.add(line)
        item_id = by_line.get(line)
        if item_id is None:
            raise missing("line item", line, param, status=400)
        record = store.items[item_id]
        updates.append((record, amount, fields, merge_metadata(record.obj["metadata"], fields)))
    before = render_invoice(store, invoice_id)
    for record, amount, fields, new_metadata in updates:
        item = record.obj
        if amount is not None:
            item["amount"] = item["net_amount"] = amount
        if "description" in fields:
            item["description"] = opt_str(fields, "description")
        item["metadata"] = new_metadata
    inv["metadata"] = invoice_metadata
    _invoice_changed(store, invoice_id, before, call)
    return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)


def _line_period(fields: JsonObject, param: str) -> JsonObject | None:
    raw = fields.get("period")
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"start", "end"}:
        raise invalid(f"Invalid {param}[period]: start and end are required", f"{param}[period]")
    start = parse_int(raw["start"], f"{param}[period][start]", low=0, high=2**40)
    end = parse_int(raw["end"], f"{param}[period][end]", low=start, high=2**40)
    return {"end": end, "start": start}


def _new_lines(params: JsonObject) -> list[tuple[str, JsonObject]]:
    """The ``lines`` of an ``add_lines`` request, their fields checked (validation)."""
    lines = _lines_param(params, "add")
    for param, fields in lines:
        for name in fields:
            if name not in _LINE_ADD:
                raise invalid(f"Received unknown parameter: {param}[{name}]", f"{param}[{name}]")
        if "invoice_item" in fields:
            if set(fields) != {"invoice_item"}:
                raise invalid(
                    f"{param}[invoice_item] assigns an existing item: it takes no other field.",
                    param,
                )
            continue
        if fields.get("amount") in (None, ""):
            raise invalid(
                f"Missing required param: {param}[amount].",
                f"{param}[amount]",
                code="parameter_missing",
            )
        opt_amount(fields, "amount", low=-MAX_AMOUNT)
        _line_period(fields, param)
        metadata(fields)
    return lines


def add_invoice_lines(store: Store, call: Call) -> Result:
    """``POST /v1/invoices/{id}/add_lines``: new lines on a draft (see the module
    docstring); every line is checked before any is made."""
    params = call.params
    check_params(params, _ADD_LINES)
    lines = _new_lines(params)
    invoice_id, inv, invoice_metadata = _editable_draft(store, call)
    held = len(store.invoice_lines.get(invoice_id, []))
    if held + len(lines) > MAX_ITEMS_PER_INVOICE:
        raise state_error(
            f"An invoice can have at most {MAX_ITEMS_PER_INVOICE} invoice items; invoice "
            f"{invoice_id} has {held}, and {len(lines)} were given.",
            "lines",
        )
    assigned: list[ItemRecord] = []
    for param, fields in lines:
        if "invoice_item" in fields:
            assigned.append(_assignable(store, inv, str(fields["invoice_item"]), param, assigned))
    before = render_invoice(store, invoice_id)
    made = iter(assigned)
    for _, fields in lines:
        if "invoice_item" in fields:
            item = next(made).obj
        else:
            item = _new_item(
                store, call, inv["customer"], inv["currency"],
                opt_amount(fields, "amount", low=-MAX_AMOUNT) or 0,
                opt_str(fields, "description"), metadata(fields),
                _line_period(fields, "lines"),
                parse_bool(fields.get("discountable", "true"), "discountable"),
            )  # fmt: skip
            record_event(store, "invoiceitem.created", item, call)
        item["invoice"] = invoice_id
        store.invoice_lines.setdefault(invoice_id, []).append(item["id"])
    inv["metadata"] = invoice_metadata
    _invoice_changed(store, invoice_id, before, call)
    return Result(render_invoice(store, invoice_id), invoice_id, mutated=True)


def _assignable(
    store: Store, inv: JsonObject, item_id: str, param: str, taken: list[ItemRecord]
) -> ItemRecord:
    """A pending item of the invoice's customer and currency, named once."""
    record = store.items.get(item_id)
    if record is None or record.deleted:
        raise missing("invoiceitem", item_id, f"{param}[invoice_item]", status=400)
    item = record.obj
    if item["invoice"] is not None or record in taken:
        raise state_error(
            f"Invoice item {item_id} is already on an invoice.", f"{param}[invoice_item]"
        )
    if item["customer"] != inv["customer"] or item["currency"] != inv["currency"]:
        raise state_error(
            f"Invoice item {item_id} must be of the invoice's customer and currency.",
            f"{param}[invoice_item]",
        )
    return record


def _editable_draft(store: Store, call: Call) -> tuple[str, JsonObject, dict[str, str]]:
    """The invoice a bulk request names, and its metadata after the request's
    ``invoice_metadata`` (validation); refused when it is not a draft (execution: from
    then on errors are saved under the idempotency key)."""
    invoice_id = call.path_id or ""
    inv = require_invoice(store, invoice_id).obj
    invoice_metadata = merge_metadata(inv["metadata"], _as_metadata(call.params))
    if inv["status"] != "draft":
        raise state_error(
            "Invalid invoice: This invoice is no longer editable", "invoice", code=_NOT_EDITABLE
        )
    return invoice_id, inv, invoice_metadata


def _as_metadata(params: JsonObject) -> JsonObject:
    """``invoice_metadata`` in the shape ``merge_metadata`` reads (``metadata``)."""
    return {"metadata": params["invoice_metadata"]} if "invoice_metadata" in params else {}
