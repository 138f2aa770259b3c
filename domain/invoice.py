"""The ``Invoice`` aggregate: one customer's invoice in one currency for one period.

It is opened when its draft exists in Stripe (the pushers create the draft on first
need, with an idempotency key derived from the invoice's id, and record its Stripe
id here); its lines (``domain.invoice_line``) are the items on it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.ids import invoice_id
from domain.periods import Period

__all__ = ["Invoice"]


class Invoice(Aggregate):
    """A customer's invoice for one currency and period."""

    class Opened(Aggregate.Created):
        customer_id: str
        currency: str
        period_start: datetime
        period_end: datetime
        stripe_invoice_id: str
        stripe_customer_id: str

    @staticmethod
    def create_id(customer_id: str, currency: str, period_start: datetime, **_: Any) -> UUID:
        return invoice_id(customer_id, currency, Period(period_start, period_start).key)

    @classmethod
    def open(
        cls,
        customer_id: str,
        currency: str,
        period: Period,
        *,
        stripe_invoice_id: str,
        stripe_customer_id: str,
    ) -> Invoice:
        """The invoice whose draft ``stripe_invoice_id`` now exists in Stripe."""
        return cls(
            customer_id=customer_id,
            currency=currency,
            period_start=period.start,
            period_end=period.end,
            stripe_invoice_id=stripe_invoice_id,
            stripe_customer_id=stripe_customer_id,
        )

    @event(Opened)
    def __init__(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        customer_id: str,
        currency: str,
        period_start: datetime,
        period_end: datetime,
        stripe_invoice_id: str,
        stripe_customer_id: str,
    ) -> None:
        self.customer_id = customer_id
        self.currency = currency
        self.period_start = period_start
        self.period_end = period_end
        self.stripe_invoice_id = stripe_invoice_id
        self.stripe_customer_id = stripe_customer_id

    @property
    def period(self) -> Period:
        return Period(self.period_start, self.period_end)
