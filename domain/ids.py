"""Deterministic identities: the same usage record always maps to the same transaction.

No clocks and no random numbers: an id is a ``uuid5`` of the record's own key, so
a redelivered or duplicated record names the same aggregate and the event store's
``(originator_id, originator_version)`` constraint rejects the second write.
"""

from __future__ import annotations

import json
from functools import lru_cache
from hashlib import sha1
from uuid import UUID

__all__ = [
    "ACCOUNT_NAMESPACE",
    "NAMESPACE",
    "account_id",
    "contract_id",
    "customer_link_id",
    "invoice_id",
    "line_id",
    "line_push_id",
    "partition_claim_id",
    "price_book_id",
    "purchase_id",
    "transaction_id",
    "true_up_id",
]

NAMESPACE = UUID("6f1c7d36-4d8e-5b8a-9a57-2f0b5e3c9d41")
# Accounts have a namespace of their own, so no usage key can ever name an account.
ACCOUNT_NAMESPACE = UUID("0b7e1f52-93a4-5c61-8d2e-4a6f3b9c1e07")


# RFC 4122 name-based ids, computed as ``uuid.uuid5`` computes them (a test compares
# the two on arbitrary names): ``uuid5`` imports hashlib, reads the namespace's bytes and
# runs ``UUID.__init__``'s checks on every call; a record pays for one transaction id,
# and this is 2.5x faster.
_VERSION_BITS = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_5 = (5 << 76) | (0x8000 << 48)


def uuid5(namespace: UUID, name: str) -> UUID:
    """``uuid.uuid5(namespace, name)``."""
    return _name_based(namespace.bytes, name)


def _name_based(namespace: bytes, name: str) -> UUID:
    digest = sha1(namespace + name.encode(), usedforsecurity=False).digest()
    return UUID(int=int.from_bytes(digest[:16]) & _VERSION_BITS | _VERSION_5)


_TRANSACTION_PREFIX = NAMESPACE.bytes


def transaction_id(customer_id: str, usage_id: str) -> UUID:
    """The id of the billing transaction for one usage record.

    Unambiguous because a customer id cannot contain ``:`` (see ``domain.usage``).
    """
    return _name_based(_TRANSACTION_PREFIX, f"{customer_id}:{usage_id}")


def account_id(customer_id: str, currency: str) -> UUID:
    """The id of a customer's account in one currency."""
    return uuid5(ACCOUNT_NAMESPACE, f"{customer_id}:{currency}")


# Each kind of aggregate has a namespace of its own, so no key of one can name another.
LINE_NAMESPACE = UUID("3d1f0c4e-7b2a-5e96-8c41-0a9b6e2f5d13")
PUSH_NAMESPACE = UUID("8a6e2b1d-4c3f-5a07-9e58-1f2d7c6b0e94")
INVOICE_NAMESPACE = UUID("5c0b9e7a-2d4f-5183-a6e2-7f3c1b8d9a05")
CUSTOMER_NAMESPACE = UUID("e2a47c19-6b5d-5f30-8d1e-4c9a0f7b3e68")
CLAIM_NAMESPACE = UUID("9b3d5e71-0c2a-5f48-b6d9-3e7a1c0f4b26")
PRICE_BOOK_NAMESPACE = UUID("c4f2a9e8-1d6b-5e37-9a0c-7b5e3d2f8a61")
CONTRACT_NAMESPACE = UUID("7d3e9b20-5a1c-5f64-8e2b-1c9f4a6d0e35")
TRUE_UP_NAMESPACE = UUID("2f8c6a14-9e3b-5d70-a1c5-6b0e8d4f2a97")
PURCHASE_NAMESPACE = UUID("a81d3c5e-6f29-5b04-9c7e-2d5b8f1a3e60")


def _key(*parts: str) -> str:
    """Parts joined unambiguously (a meter or a period key may contain ':')."""
    return json.dumps(parts, separators=(",", ":"))


# Asked for every line of every account of every ingest batch (its own and its credit
# line's, to read them and to choose them): the same few ids again and again.
@lru_cache(maxsize=32768)
def line_id(customer_id: str, currency: str, meter: str, period_key: str) -> UUID:
    """The invoice line of one customer's usage of one meter in one period (each answer
    kept, a bounded number: a hash and a UUID object made once)."""
    return uuid5(LINE_NAMESPACE, _key(customer_id, currency, meter, period_key))


def line_push_id(line: UUID) -> UUID:
    """The record of what Stripe holds for one line (written by the pushers only)."""
    return uuid5(PUSH_NAMESPACE, str(line))


def invoice_id(customer_id: str, currency: str, period_key: str) -> UUID:
    """The invoice of one customer in one currency for one period."""
    return uuid5(INVOICE_NAMESPACE, _key(customer_id, currency, period_key))


def customer_link_id(customer_id: str) -> UUID:
    """The link between a customer and its customer in the payment provider."""
    return uuid5(CUSTOMER_NAMESPACE, customer_id)


def partition_claim_id(topic: str, partition: int) -> UUID:
    """The claims of one partition of a topic by the processes that consumed it."""
    return uuid5(CLAIM_NAMESPACE, _key(topic, str(partition)))


def price_book_id() -> UUID:
    """The ledger's one price book (``domain.price_book``: one for all currencies)."""
    return uuid5(PRICE_BOOK_NAMESPACE, "prices")


def contract_id(customer_id: str) -> UUID:
    """The contract of one customer (``domain.contract``: one per customer)."""
    return uuid5(CONTRACT_NAMESPACE, customer_id)


def true_up_id(invoice: UUID, meter: str) -> UUID:
    """A true-up of one invoice (a minimum commitment's shortfall; ``meter``: its true-up
    line's meter): the one entry of its true-up line, where a line holds a transaction's id."""
    return uuid5(TRUE_UP_NAMESPACE, _key(str(invoice), meter))


def purchase_id(customer_id: str, currency: str, grant_id: str) -> UUID:
    """The purchase of one purchased grant (``domain.purchase``): its one-off invoice's
    ledger id, from which its Stripe keys are derived (a grant id is unique per account,
    and an automatic top-up's grant id names its rule version and crossing)."""
    return uuid5(PURCHASE_NAMESPACE, _key(customer_id, currency, grant_id))
