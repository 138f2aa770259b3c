"""Duplicates that conflict: the same usage record sent again with a different body.

A usage record's identity is its customer and ``usage_id``: the transaction id is
derived from them (``domain.ids``), so a record sent again names the same transaction
and the event store refuses to record it twice. Most such records are re-sends (a
producer retry, a redelivery after a crash) and stay silent duplicates. A producer that
changed its mind sends the same identity with a different body: the first body stays
billed, and the second must not vanish silently.

**The same record.** A duplicate is the same record as the one recorded when what it
bills is the same, compared with the transaction's ``Metered`` event (its fields, not
raw bytes: JSON whitespace, key order and number spelling may differ):

* ``meter``: equal strings;
* ``quantity``: equal numbers (``1520`` = ``1520.0`` = ``1.52e3``);
* ``occurred_at``: the same instant (``10:15:00Z`` = ``11:15:00+01:00``);
* ``currency``: equal, where a record without one means the meter's currency, which is
  what the ``Metered`` event recorded.

Fields a record may carry beyond these (ignored by decoding) are not compared.

**A conflict** is a duplicate that is not the same record. Its reason names the fields
that differ and the SHA-256 of both bodies' canonical form (``canonical_body``: the
compared fields and the identity as sorted, compact JSON, the quantity without
trailing zeros, the instant in UTC), so two bodies that are the same record have the
same hash, and the recorded one is recomputed from the ``Metered`` event alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from domain.transaction import BillingTransaction
from domain.usage import UsageRecord

__all__ = ["CONFLICT_PREFIX", "Recorded", "canonical_body", "conflict", "differences"]

CONFLICT_PREFIX = "conflicting duplicate: "


@dataclass(frozen=True)
class Recorded:
    """What the first record of an identity billed, as its ``Metered`` event holds it."""

    customer_id: str
    usage_id: str
    meter: str
    quantity: Decimal
    occurred_at: datetime
    currency: str

    @classmethod
    def of(cls, metered: BillingTransaction.Metered) -> Recorded:
        return cls(
            customer_id=metered.customer_id,
            usage_id=metered.usage_id,
            meter=metered.meter,
            quantity=metered.quantity,
            occurred_at=metered.occurred_at,
            currency=metered.currency,
        )

    def body_sha256(self) -> str:
        return _sha256(canonical_body(self))


def differences(record: UsageRecord, recorded: Recorded) -> list[str]:
    """The compared fields in which ``record`` differs from ``recorded`` (none: the
    same record; see the module docstring)."""
    theirs = _as_recorded(record, recorded.currency)
    return [
        name
        for name in ("meter", "quantity", "occurred_at", "currency")
        if getattr(theirs, name) != getattr(recorded, name)
    ]


def conflict(record: UsageRecord, recorded: Recorded) -> str | None:
    """The dead letter's reason when ``record`` conflicts with what was recorded under
    its identity, else None (the same record: a silent duplicate)."""
    changed = differences(record, recorded)
    if not changed:
        return None
    this = _sha256(canonical_body(_as_recorded(record, recorded.currency)))
    return (
        f"{CONFLICT_PREFIX}usage_id {record.usage_id!r} of customer {record.customer_id!r}"
        f" was recorded with another {', '.join(changed)}"
        f" (recorded sha256 {recorded.body_sha256()}, this sha256 {this})"
    )


def canonical_body(recorded: Recorded) -> bytes:
    """The canonical form the hashes are taken of (see the module docstring)."""
    quantity = recorded.quantity if recorded.quantity else Decimal(0)  # -0 and 0E-7 are 0
    return json.dumps(
        {
            "currency": recorded.currency,
            "customer_id": recorded.customer_id,
            "meter": recorded.meter,
            "occurred_at": recorded.occurred_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "quantity": format(quantity.normalize(), "f"),
            "usage_id": recorded.usage_id,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def _as_recorded(record: UsageRecord, meter_currency: str) -> Recorded:
    return Recorded(
        customer_id=record.customer_id,
        usage_id=record.usage_id,
        meter=record.meter,
        quantity=record.quantity,
        occurred_at=record.occurred_at,
        currency=(record.currency or meter_currency).upper(),
    )


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
