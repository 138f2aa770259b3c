"""The API's routing table: method and path to handler.

This module owns which endpoints exist.  A route is a method, a path template such as
``/v1/invoiceitems/{id}`` (the name the per-endpoint rate limit counts under) and its
handler; :func:`resolve` finds the route of a request and the ``{id}`` in its path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from . import customers, invoice_items, invoices
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
    _route("DELETE", "/v1/invoiceitems/{id}", invoice_items.delete_invoice_item),
    _route("POST", "/v1/invoices", invoices.create_invoice),
    _route("GET", "/v1/invoices/{id}", invoices.get_invoice),
)


def resolve(method: str, path: str) -> tuple[Route, str | None] | None:
    """The route serving ``method path`` and the ``{id}`` it names, or None (404)."""
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match is not None and route.method == method:
            return route, match.groupdict().get("id")
    return None
