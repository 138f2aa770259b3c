"""The one way billing-ledger talks to Stripe: the SDK behind bounded pressure.

``StripeCharges`` is the ``domain.ports.PaymentGateway``: one invoice item per
transaction, created with ``Idempotency-Key: charge:{txn_id}`` and always the same
parameters. Every call goes through the process's ``Pressure`` (breaker, AIMD
in-flight limit, rate limit; ``adapters.stripe.pressure``). The SDK's own retries are
off (``max_network_retries=0``): a failed attempt is recorded as ChargeFailed with a
due time, and the reconciler retries it later with the SAME key and parameters.
Failures reach the domain as ``ChargeFailure`` values (``adapters.stripe.errors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import stripe
from stripe.params import InvoiceItemListParams

from adapters.observability import telemetry
from adapters.settings import StripeSettings
from adapters.stripe.errors import classify
from adapters.stripe.pressure import Pressure
from domain.ports import Removal
from domain.saga import Charged, ChargeOutcome, idempotency_key
from domain.transaction import BillingTransaction

__all__ = ["StripeCharges"]

T = TypeVar("T")


class StripeCharges:
    """Invoice items for billing transactions, one per transaction, exactly once."""

    def __init__(self, settings: StripeSettings) -> None:
        self.settings = settings
        self.client = stripe.StripeClient(
            settings.api_key,
            base_addresses={"api": settings.api_base},
            max_network_retries=0,
            http_client=stripe.new_default_http_client(timeout=settings.timeout_s),
        )
        self.pressure = Pressure(settings)
        self.breaker = self.pressure.breaker
        self._customers: dict[str, str] = {}

    # -- the port ------------------------------------------------------------------

    def charge(self, txn: BillingTransaction, age: timedelta) -> ChargeOutcome:
        """Create the transaction's invoice item (or find it); never raises."""
        try:
            return Charged(self.create_charge(txn, age))
        except Exception as exc:  # every failure is classified and recorded, never dropped
            return classify(exc)

    def remove_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> Removal:
        """Delete the transaction's invoice item (by id, else by metadata); never raises."""
        try:
            return self.delete_charge(txn, stripe_object_id)
        except Exception as exc:
            return classify(exc)

    def breaker_state(self) -> str:
        return self.breaker.state

    # -- the calls (they raise) ----------------------------------------------------

    def create_charge(self, txn: BillingTransaction, age: timedelta) -> str:
        """Create the transaction's invoice item (or find it); returns its Stripe id."""
        with _traced("charge", txn):
            customer = self.customer(txn.customer_id)
            if age >= self.settings.key_window:  # Stripe may have forgotten the key
                existing = self.find_charge(txn, customer)
                if existing is not None:
                    return existing
            item = self._call(
                "invoice_items.create",
                lambda: self.client.v1.invoice_items.create(
                    params={
                        "customer": customer,
                        "amount": txn.amount,
                        "currency": txn.currency.lower(),
                        "description": f"{txn.meter} x {txn.quantity}",
                        "metadata": {"txn_id": str(txn.id), "usage_id": txn.usage_id},
                    },
                    options={"idempotency_key": idempotency_key("charge", txn.id)},
                ),
            )
            _http_status(item)
            return str(item.id)

    def delete_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> str | None:
        """Delete the transaction's invoice item (by id, else by metadata); returns its id."""
        with _traced("remove_charge", txn):
            item_id = stripe_object_id or self.find_charge(txn)
            if item_id is None:
                return None
            try:
                self._call(
                    "invoice_items.delete",
                    lambda: self.client.v1.invoice_items.delete(
                        item_id, options={"idempotency_key": idempotency_key("reverse", txn.id)}
                    ),
                )
            except stripe.InvalidRequestError as exc:
                if exc.http_status != 404:  # already gone: the reversal holds
                    raise
            return item_id

    def find_charge(self, txn: BillingTransaction, customer: str | None = None) -> str | None:
        """The live invoice item of ``txn``, looked up by its metadata, if any."""
        for item in self.invoice_items(customer or self.customer(txn.customer_id)):
            if (item.get("metadata") or {}).get("txn_id") == str(txn.id):
                return str(item["id"])
        return None

    def invoice_items(self, customer: str | None = None) -> Iterator[dict[str, Any]]:
        """Every live invoice item (of one Stripe customer, if given), as plain dicts."""
        params: InvoiceItemListParams = {"limit": 100}
        if customer is not None:
            params["customer"] = customer
        page = self._call(
            "invoice_items.list", lambda: self.client.v1.invoice_items.list(params=params)
        )
        for item in page.auto_paging_iter():
            yield item.to_dict()

    def customer(self, customer_id: str) -> str:
        """The Stripe customer of ``customer_id``, created on first use with its own key."""
        if customer_id in self._customers:
            return self._customers[customer_id]
        stripe_id = self.find_customer(customer_id)
        if stripe_id is None:
            created = self._call(
                "customers.create",
                lambda: self.client.v1.customers.create(
                    params={"name": customer_id, "metadata": {"customer_id": customer_id}},
                    options={"idempotency_key": idempotency_key("customer", customer_id)},
                ),
            )
            stripe_id = str(created.id)
        self._customers[customer_id] = stripe_id
        return stripe_id

    def find_customer(self, customer_id: str) -> str | None:
        """The Stripe customer of ``customer_id`` if there is one (never creates it)."""
        found = self._call(
            "customers.search",
            lambda: self.client.v1.customers.search(
                params={"query": f"metadata['customer_id']:'{customer_id}'", "limit": 1}
            ),
        )
        return str(found.data[0].id) if found.data else None

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        return self.pressure.call(operation, fn)


@contextmanager
def _traced(operation: str, txn: BillingTransaction) -> Iterator[None]:
    """A ``stripe <operation>`` span with its outcome: ``billing.outcome`` (ok or error),
    and on error ``error.type`` (the ChargeFailure class), ``billing.retryable`` and
    ``http.response.status_code`` when Stripe answered."""
    with telemetry.span(
        f"stripe {operation}",
        billing__transaction_id=str(txn.id),
        billing__customer_id=txn.customer_id,
    ) as current:
        try:
            yield
        except Exception as exc:
            failure = classify(exc)
            current.set_attributes(
                {
                    "billing.outcome": "error",
                    "error.type": failure.error_class,
                    "billing.retryable": failure.retryable,
                }
            )
            if isinstance(exc, stripe.StripeError) and exc.http_status:
                current.set_attribute("http.response.status_code", exc.http_status)
            raise
        current.set_attribute("billing.outcome", "ok")


def _http_status(obj: stripe.StripeObject) -> None:
    """Put the HTTP status of the response that made ``obj`` on the current span."""
    response = obj.last_response
    if response is not None:
        telemetry.current_span().set_attribute("http.response.status_code", response.code)
