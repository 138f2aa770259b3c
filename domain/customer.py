"""The ``CustomerLink`` aggregate: a customer and its customer in Stripe.

Recorded once, when the pushers first create (or find) the Stripe customer, so that
no later process has to search Stripe for it (Stripe's search is eventually
consistent, and every search is a request against the rate limit).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.ids import customer_link_id

__all__ = ["CustomerLink"]


class CustomerLink(Aggregate):
    """Which Stripe customer bills ``customer_id``."""

    class Linked(Aggregate.Created):
        customer_id: str
        stripe_customer_id: str

    @staticmethod
    def create_id(customer_id: str, **_: Any) -> UUID:
        return customer_link_id(customer_id)

    @event(Linked)
    def __init__(self, customer_id: str, stripe_customer_id: str) -> None:
        self.customer_id = customer_id
        self.stripe_customer_id = stripe_customer_id
