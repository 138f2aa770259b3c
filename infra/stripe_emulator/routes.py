"""The API's routing table: method and path to handler.

This module owns which endpoints exist.  A route is a method, a path template such as
``/v1/invoiceitems/{id}`` (the name the per-endpoint rate limit counts under) and its
handler; :func:`resolve` finds the route of a request and the ``{id}`` in its path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from . import credit_notes, customers, events, invoice_actions, invoice_items, invoices
from .store import Handler

__all__ = ["ROUTES", "Route", "resolve"]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    handler: Handler
    pattern: re.Pattern[str]

    @property
    def endpoint(self) -> str:
        """``METHOD template``, e.g. ``POST /v1/invoiceitems/{id}``."""
        return f"{self.method} {self.template}"


def _route(method: str, template: str, handler: Handler) -> Route:
    regex = re.escape(template).replace(re.escape("{id}"), r"(?P<id>[^/]+)")
    return Route(method, template, handler, re.compile(regex))


# Fixed paths come before the {id} patterns they would also match.
ROUTES: Final[tuple[Route, ...]] = (
    _route("POST", "/v1/customers", customers.create_customer),
    _route("GET", "/v1/customers/search", customers.search_customers),
    _route("GET", "/v1/customers/{id}", customers.get_customer),
    _route("POST", "/v1/invoiceitems", invoice_items.create_invoice_item),
    _route("GET", "/v1/invoiceitems", invoice_items.list_invoice_items),
    _route("GET", "/v1/invoiceitems/search", invoice_items.search_invoice_items),
    _route("GET", "/v1/invoiceitems/{id}", invoice_items.get_invoice_item),
    _route("POST", "/v1/invoiceitems/{id}", invoice_items.update_invoice_item),
    _route("DELETE", "/v1/invoiceitems/{id}", invoice_items.delete_invoice_item),
    _route("POST", "/v1/invoices", invoices.create_invoice),
    _route("GET", "/v1/invoices", invoices.list_invoices),
    _route("GET", "/v1/invoices/search", invoices.search_invoices),
    _route("GET", "/v1/invoices/{id}", invoices.get_invoice),
    _route("POST", "/v1/invoices/{id}", invoices.update_invoice),
    _route("DELETE", "/v1/invoices/{id}", invoices.delete_invoice),
    _route("GET", "/v1/invoices/{id}/lines", invoices.list_invoice_lines),
    _route("POST", "/v1/invoices/{id}/add_lines", invoice_items.add_invoice_lines),
    _route("POST", "/v1/invoices/{id}/update_lines", invoice_items.update_invoice_lines),
    _route("POST", "/v1/invoices/{id}/finalize", invoice_actions.finalize_invoice),
    _route("POST", "/v1/invoices/{id}/pay", invoice_actions.pay_invoice),
    _route("POST", "/v1/invoices/{id}/void", invoice_actions.void_invoice),
    _route("POST", "/v1/invoices/{id}/mark_uncollectible", invoice_actions.mark_uncollectible),
    _route("POST", "/v1/credit_notes", credit_notes.create_credit_note),
    _route("GET", "/v1/credit_notes", credit_notes.list_credit_notes),
    _route("GET", "/v1/credit_notes/{id}", credit_notes.get_credit_note),
    _route("GET", "/v1/events", events.list_events),
    _route("GET", "/v1/events/{id}", events.get_event),
)


def resolve(method: str, path: str) -> tuple[Route, str | None] | None:
    """The route serving ``method path`` and the ``{id}`` it names, or None (404)."""
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match is not None and route.method == method:
            return route, match.groupdict().get("id")
    return None
