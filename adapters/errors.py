"""The errors adapters raise on their own, one base per boundary.

::

    AdapterError                 raised by an adapter; never by the domain or the store
     +-- StripeRefused           a Stripe call was not sent
     |    +-- BreakerOpen        the circuit breaker is open (or its one probe is out)
     |    +-- CallRefused        the in-flight or rate limit stayed saturated
     +-- PaymentFailed           Stripe refused an operator's command, or was unreachable
     +-- BrokerUnreachable       no Kafka bootstrap server accepts a connection
     +-- WorkerFailed           a worker role stopped on an error, or on its own
     +-- AnchorError            the anchor cannot sign (no key, short key, bad file)

Errors of the other layers have their own trees: ``domain.errors`` (a rule is
broken), ``store.errors`` (the event store), ``projections.base`` (a read model's
query). Errors of the libraries (psycopg, kafka-python, stripe) are translated where
they cross into the domain (``adapters.stripe.errors.classify``) or reported by the
CLI's boundary as one line.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "AnchorError",
    "BreakerOpen",
    "BrokerUnreachable",
    "CallRefused",
    "PaymentFailed",
    "StripeRefused",
    "WorkerFailed",
]


class AdapterError(Exception):
    """Raised by an adapter for a failure of its own; the base of every adapter error."""


class StripeRefused(AdapterError):
    """Raised when a Stripe call is not sent: the client protects Stripe (or itself)."""


class BreakerOpen(StripeRefused):
    """Raised when the breaker refuses a call (open, or half-open with a probe in flight)."""


class CallRefused(StripeRefused):
    """Raised when a call waited too long for a slot under the in-flight or rate limit."""


class PaymentFailed(AdapterError):
    """Raised when an operator's command (a reversal) could not be done in Stripe."""


class BrokerUnreachable(AdapterError, ConnectionError):
    """Raised when no Kafka bootstrap server accepts a TCP connection."""


class WorkerFailed(AdapterError):
    """Raised when a worker role stopped on an error or returned on its own."""


class AnchorError(AdapterError):
    """Raised when the anchor cannot sign: no key or path, a short key, or a checkpoint
    file whose lines do not verify under the key."""
