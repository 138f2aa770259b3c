"""The one way billing-ledger talks to Stripe: the SDK behind bounded pressure.

Every call goes through, in order:

1. a circuit breaker (``adapters.breaker``): after ``breaker_fail_max`` consecutive
   retryable failures it opens and refuses calls without sending them; after
   ``breaker_reset_s`` it lets one probe through;
2. an adaptive concurrency limit (AIMD: +1/limit on success, halved on 429/5xx/timeout);
3. a sliding-window rate limit (pyrate-limiter; default 25 requests/s, Stripe's
   test-mode limit);
4. the ``stripe`` SDK with ``max_network_retries=0``: this client does not retry in
   process. A failed attempt is recorded as ChargeFailed with a due time, and the
   reconciler retries it later with the SAME idempotency key and parameters.

Errors become ``domain.saga.ChargeFailure`` (retryable or permanent). A timeout or a
dropped connection is an unknown outcome: retryable, and the retry with the same key
gets Stripe's saved result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import stripe
from pyrate_limiter import Duration, Limiter, Rate
from stripe.params import InvoiceItemListParams

from adapters import telemetry
from adapters.breaker import BreakerOpen, CircuitBreaker
from adapters.metrics import metrics
from domain.saga import ChargeFailure, idempotency_key
from domain.transaction import BillingTransaction

__all__ = ["AimdLimit", "StripeCharges", "StripeSettings", "classify"]

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StripeSettings:
    api_key: str = "sk_test_billing_ledger"
    api_base: str = "https://api.stripe.com"
    rate_per_s: int = 25
    max_concurrency: int = 8
    breaker_fail_max: int = 5
    breaker_reset_s: float = 5.0
    timeout_s: float = 10.0
    # Stripe keeps idempotency keys for at least 24 hours; past this age, look first.
    key_window: timedelta = timedelta(hours=23)


class AimdLimit:
    """Adaptive concurrency: additive increase on success, multiplicative decrease on overload.

    Hand-written: a counter and a condition variable. The limiters on PyPI bound
    rates, not in-flight calls that adapt to the error rate.
    """

    def __init__(self, maximum: int, minimum: int = 1) -> None:
        self.maximum = maximum
        self.minimum = minimum
        self.limit = float(maximum)
        self.in_flight = 0
        self._cond = threading.Condition()

    def acquire(self, timeout: float) -> bool:
        with self._cond:
            ok = self._cond.wait_for(lambda: self.in_flight < int(self.limit), timeout)
            if ok:
                self.in_flight += 1
            return ok

    def release(self, overloaded: bool) -> None:
        with self._cond:
            self.in_flight -= 1
            if overloaded:
                self.limit = max(self.minimum, self.limit / 2)
            else:
                self.limit = min(self.maximum, self.limit + 1 / self.limit)
            self._cond.notify_all()


class CallRefused(Exception):
    """Raised when a call is not sent: the breaker is open or a limit is saturated."""


def classify(exc: BaseException) -> ChargeFailure:
    """Translate an exception from a Stripe call into a domain ChargeFailure."""
    if isinstance(exc, BreakerOpen):
        return ChargeFailure("circuit_open", "Stripe circuit breaker is open", retryable=True)
    if isinstance(exc, CallRefused):
        return ChargeFailure("throttled", str(exc), retryable=True)
    if isinstance(exc, stripe.APIConnectionError):
        return ChargeFailure("connection", _msg(exc), retryable=True)  # unknown outcome
    if isinstance(exc, stripe.RateLimitError):
        return ChargeFailure("rate_limited", _msg(exc), True, _retry_after(exc))
    if isinstance(exc, stripe.AuthenticationError | stripe.PermissionError):
        # A configuration fault, not the customer's: keep retrying until fixed or the horizon.
        return ChargeFailure("auth", _msg(exc), retryable=True)
    if isinstance(exc, stripe.StripeError):
        status = exc.http_status or 0
        should = _header(exc, "stripe-should-retry")
        retryable = (
            should == "true"
            if should in ("true", "false")
            else status in (409, 429) or status >= 500 or status == 0
        )
        name = f"http_{status}" if status else type(exc).__name__
        return ChargeFailure(name, _msg(exc), retryable, _retry_after(exc))
    return ChargeFailure(type(exc).__name__, str(exc) or type(exc).__name__, retryable=True)


def _msg(exc: BaseException) -> str:
    if isinstance(exc, stripe.StripeError) and exc.user_message:
        return str(exc.user_message)
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _retry_after(exc: stripe.StripeError) -> timedelta | None:
    value = _header(exc, "retry-after")
    try:
        return timedelta(seconds=float(value)) if value is not None else None
    except ValueError:
        return None


def _header(exc: stripe.StripeError, name: str) -> str | None:
    """A response header, whatever its case."""
    for key, value in (exc.headers or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def _overload(exc: BaseException) -> bool:
    if isinstance(exc, stripe.APIConnectionError | stripe.RateLimitError):
        return True
    return isinstance(exc, stripe.StripeError) and (exc.http_status or 0) >= 500


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


def _timed(operation: str, fn: Callable[[], T]) -> T:
    """``fn()``, its latency recorded: the time on the wire and at Stripe, no queueing."""
    started = time.perf_counter()
    outcome = "ok"
    try:
        return fn()
    except Exception as exc:
        outcome = classify(exc).error_class
        raise
    finally:
        metrics().stripe_latency.record(
            time.perf_counter() - started, {"operation": operation, "outcome": outcome}
        )


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
        self.breaker = CircuitBreaker(
            fail_max=settings.breaker_fail_max,
            reset_s=settings.breaker_reset_s,
            counts=lambda e: classify(e).retryable,  # a 4xx answer is not an outage
            on_transition=self._breaker_moved,
        )
        self.breaker_name = metrics().watch_breaker(self.breaker)
        self.concurrency = AimdLimit(settings.max_concurrency)
        self.limiter = Limiter(Rate(settings.rate_per_s, Duration.SECOND))
        self._customers: dict[str, str] = {}

    # -- the charge path ---------------------------------------------------------

    def charge(self, txn: BillingTransaction, now_age: timedelta) -> str:
        """Create the transaction's invoice item (or find it); returns its Stripe id."""
        with _traced("charge", txn):
            return self._charge(txn, now_age)

    def _charge(self, txn: BillingTransaction, now_age: timedelta) -> str:
        customer = self.customer(txn.customer_id)
        if now_age >= self.settings.key_window:
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

    def remove_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> str | None:
        """Delete the transaction's invoice item (by id, else by metadata); returns its id."""
        with _traced("remove_charge", txn):
            return self._remove_charge(txn, stripe_object_id)

    def _remove_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> str | None:
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

    # -- pressure ------------------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """One Stripe call through the breaker and the limits, counted by outcome (a
        call the breaker or a limit refused is counted as such, and never sent)."""
        outcome = "ok"
        try:
            return self.breaker.call(lambda: self._limited(lambda: _timed(operation, fn)))
        except Exception as exc:
            outcome = classify(exc).error_class
            raise
        finally:
            metrics().stripe_requests.add(1, {"operation": operation, "outcome": outcome})

    def _breaker_moved(self, old: str, new: str) -> None:
        metrics().breaker_transitions.add(1, {"from_state": old, "to_state": new})
        log.warning(
            "Stripe circuit breaker %s", new,
            extra={"step": "breaker", "status": new, "from_state": old},
        )  # fmt: skip

    def _limited(self, fn: Callable[[], T]) -> T:
        if not self.concurrency.acquire(timeout=self.settings.timeout_s):
            raise CallRefused("too many Stripe calls in flight")
        overloaded = False
        try:
            if not self.limiter.try_acquire(
                "stripe", blocking=True, timeout=self.settings.timeout_s
            ):
                raise CallRefused("Stripe rate limit saturated")
            return fn()
        except Exception as exc:
            overloaded = _overload(exc)
            raise
        finally:
            self.concurrency.release(overloaded)

    def breaker_state(self) -> str:
        return self.breaker.state
