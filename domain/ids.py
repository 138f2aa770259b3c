"""Deterministic identities: the same usage record always maps to the same transaction.

No clocks and no random numbers: an id is a ``uuid5`` of the record's own key, so
a redelivered or duplicated record names the same aggregate and the event store's
``(originator_id, originator_version)`` constraint rejects the second write.
"""

from __future__ import annotations

from uuid import UUID, uuid5

__all__ = ["ACCOUNT_NAMESPACE", "NAMESPACE", "account_id", "transaction_id"]

NAMESPACE = UUID("6f1c7d36-4d8e-5b8a-9a57-2f0b5e3c9d41")
# Accounts have a namespace of their own, so no usage key can ever name an account.
ACCOUNT_NAMESPACE = UUID("0b7e1f52-93a4-5c61-8d2e-4a6f3b9c1e07")


def transaction_id(customer_id: str, usage_id: str) -> UUID:
    """The id of the billing transaction for one usage record.

    Unambiguous because a customer id cannot contain ``:`` (see ``domain.usage``).
    """
    return uuid5(NAMESPACE, f"{customer_id}:{usage_id}")


def account_id(customer_id: str, currency: str) -> UUID:
    """The id of a customer's account in one currency."""
    return uuid5(ACCOUNT_NAMESPACE, f"{customer_id}:{currency}")
