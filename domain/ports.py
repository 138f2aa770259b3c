"""The ports: what the domain's processes need from the outside, in the domain's terms.

Each outside thing is a small Protocol with one real adapter and one hand-written fake:

* ``PaymentGateway``: Stripe (``adapters.stripe.client.StripeCharges``); failures come
  back as ``domain.saga.ChargeFailure`` values, never as the SDK's exceptions;
* ``DeadLetterSink``: where unbillable usage records are kept with their reason
  (``store.dead_letters.DeadLetterStore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from domain.saga import ChargeFailure, ChargeOutcome
from domain.transaction import BillingTransaction

__all__ = ["DeadLetter", "DeadLetterSink", "PaymentGateway", "Removal"]


@dataclass(frozen=True)
class DeadLetter:
    """A usage record (or a ``billing.events`` message) that could not be handled: where
    it came from, its bytes, and why.

    ``code`` is the reason's short code (the log line's ``error_code``; dead letters are
    counted by it). Read back from the store, ``payload`` may be only a prefix of what
    arrived: ``payload_size`` and ``payload_sha256`` (hex) describe the whole.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes | None
    reason: str
    received_at: datetime | None = None
    code: str = "invalid"
    payload_size: int | None = None
    payload_sha256: str | None = None


class DeadLetterSink(Protocol):
    """Keeps dead letters (idempotent by source position)."""

    def record(self, letters: Sequence[DeadLetter]) -> int:
        """Store the letters not stored before; returns how many were new."""
        ...


Removal = str | None | ChargeFailure
"""The outcome of removing a charge: the id of what was removed, None when there was
nothing to remove, or the failure (then nobody knows whether a charge is still there)."""


class PaymentGateway(Protocol):
    """Charges in the payment provider, each made exactly once by its idempotency key."""

    def charge(self, txn: BillingTransaction, age: timedelta) -> ChargeOutcome:
        """Charge ``txn`` (``age``: how long since it was metered); never raises."""
        ...

    def remove_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> Removal:
        """Remove ``txn``'s charge (by id, else by looking it up); never raises."""
        ...

    def breaker_state(self) -> str:
        """closed, half_open or open."""
        ...
