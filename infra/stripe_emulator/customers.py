"""The customer endpoints: create, retrieve and search by metadata.

This module owns the customer object's shape (including ``invoice_prefix`` and
``next_invoice_sequence``, which invoice numbers use) and its three handlers.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

from .errors import JsonObject, invalid, missing
from .forms import check_params, metadata, new_id, opt_str, required_str
from .listing import matches, parse_query, search_page
from .store import Call, Result, Store

__all__ = ["create_customer", "get_customer", "require_customer", "search_customers"]

_CREATE: Final = frozenset({"email", "name", "description", "phone", "metadata", "expand"})
_RETRIEVE: Final = frozenset({"expand"})
_SEARCH: Final = frozenset({"query", "limit", "page", "expand"})
_SEARCH_FIELDS: Final = frozenset({"email", "name", "phone"})


def require_customer(store: Store, customer_id: str, param: str = "customer") -> JsonObject:
    """The customer named by a request parameter, or Stripe's 400 ``resource_missing``."""
    customer = store.customers.get(customer_id)
    if customer is None:
        raise missing("customer", customer_id, param, status=400)
    return customer


def create_customer(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _CREATE)
    email = opt_str(params, "email")
    if email is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+", email):
        raise invalid(f"Invalid email address: {email}", "email", code="email_invalid")
    customer_id = new_id("cus_", 14)
    customer: JsonObject = {
        "id": customer_id,
        "object": "customer",
        "address": None,
        "balance": 0,
        "created": call.now,
        "currency": None,
        "default_source": None,
        "delinquent": False,
        "description": opt_str(params, "description"),
        "discount": None,
        "email": email,
        "invoice_prefix": secrets.token_hex(4).upper(),
        "invoice_settings": {
            "custom_fields": None,
            "default_payment_method": None,
            "footer": None,
            "rendering_options": None,
        },
        "livemode": False,
        "metadata": metadata(params),
        "name": opt_str(params, "name"),
        "next_invoice_sequence": 1,
        "phone": opt_str(params, "phone"),
        "preferred_locales": [],
        "shipping": None,
        "tax_exempt": "none",
        "test_clock": None,
    }
    store.customers[customer_id] = customer
    return Result(customer, customer_id, mutated=True)


def get_customer(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    customer_id = call.path_id or ""
    customer = store.customers.get(customer_id)
    if customer is None:
        raise missing("customer", customer_id, "id")
    return Result(customer, customer_id)


def search_customers(store: Store, call: Call) -> Result:
    check_params(call.params, _SEARCH)
    clauses = parse_query(required_str(call.params, "query"), _SEARCH_FIELDS)
    found = [c for c in reversed(store.customers.values()) if matches(c, clauses)]
    return Result(search_page(found, call.params, "/v1/customers/search"))
