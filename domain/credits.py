"""Prepaid credit grants: what one grant holds, the burn-down order, and the policy.

A grant is credit in one currency given to a customer: an amount of whole minor units
(``1 .. MAX_GRANT_MINOR``, 10^13 minor units: 100 billion USD, ten times the largest
transaction, and a hundredth of the largest spend limit), a priority, the moment it
becomes usable and optionally the moment it expires (both with a time zone, expiry
after effective), a source (``purchased``, ``promotional``, ``manual``) and a reason.
The grants live on the customer's ``CustomerAccount`` (see ``domain.account``): the
account decides each usage record against them in the save that records the record.

**Conservation (I11).** Per grant, ``granted = consumed + expired + voided +
remaining``, exactly (``Decimal`` minor units: usage is fractions of a cent, so a
grant's consumption is too). ``remaining`` never goes below zero: consumption takes
at most what is left, an expiry or a void takes exactly what is left.

**Live.** A grant is *live* in a save when ``effective_at <= now < expires_at`` and it
has something left, where ``now`` is the save's moment (not the record's
``occurred_at``): the decision is about money available when the record is recorded,
and a record that arrives late cannot consume a grant that has expired since, even
if no ``CreditExpired`` event has been written yet (the save that finds the grant
past its expiry records that event first).

**Order.** Usage consumes live grants by priority (lower number first), then the
soonest expiry (a grant that never expires last), then the oldest (the order they
were granted in).

**Policy.** ``overage`` (the default): usage beyond the live grants is billed as
always. ``block``: a record the live grants cannot cover in full is refused (the
transaction is compensated with the reason ``credits exhausted``, and consumes
nothing), so the customer's credit never goes below zero and nothing is billed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from domain.money import add_exact

__all__ = [
    "CREDITS_EXHAUSTED",
    "MAX_GRANT_MINOR",
    "MAX_REASON_LENGTH",
    "CreditPolicy",
    "CreditSource",
    "Grant",
    "burn_order",
    "check_grant",
]

MAX_GRANT_MINOR = 10**13
MAX_REASON_LENGTH = 500
CREDITS_EXHAUSTED = "credits exhausted"


class CreditPolicy(StrEnum):
    """What happens to usage when the live grants run out."""

    OVERAGE = "overage"
    BLOCK = "block"


class CreditSource(StrEnum):
    PURCHASED = "purchased"
    PROMOTIONAL = "promotional"
    MANUAL = "manual"


@dataclass
class Grant:
    """One grant's terms and its exact balance (the account's state, not an event)."""

    grant_id: str
    amount: int
    priority: int
    effective_at: datetime
    expires_at: datetime | None
    source: str
    reason: str
    order: int  # its place among the account's grants (oldest first)
    consumed: Decimal = Decimal(0)
    expired: Decimal = Decimal(0)
    voided: Decimal = Decimal(0)

    @property
    def remaining(self) -> Decimal:
        """What is left: ``amount - consumed - expired - voided`` (I11)."""
        used = add_exact(add_exact(self.consumed, self.expired), self.voided)
        return add_exact(Decimal(self.amount), -used)

    @property
    def closed(self) -> bool:
        """Expired or voided: nothing of it can be consumed any more."""
        return self.expired > 0 or self.voided > 0 or self.remaining == 0

    def live(self, now: datetime) -> bool:
        """Usable at ``now``: effective, not past its expiry, neither expired nor voided,
        something left (the cheap tests first: every ingest save asks, for each grant)."""
        return (
            self.effective_at <= now
            and (self.expires_at is None or now < self.expires_at)
            and not self.expired
            and not self.voided
            and self.remaining > 0
        )

    @property
    def terms(self) -> tuple[object, ...]:
        """What it was granted with (a repeated grant command has the same)."""
        return (self.amount, self.priority, self.effective_at, self.expires_at,
                self.source, self.reason)  # fmt: skip

    def due_to_expire(self, now: datetime) -> bool:
        """Past its expiry with something left that no event has expired yet."""
        return self.expires_at is not None and now >= self.expires_at and self.remaining > 0


def burn_order(grant: Grant) -> tuple[int, int, datetime | None, int]:
    """Priority, then the soonest expiry (never expiring last), then the oldest."""
    never = grant.expires_at is None
    return (grant.priority, int(never), grant.expires_at if not never else None, grant.order)


def check_grant(grant: Grant) -> None:
    """ValueError, in one line, when a grant's terms are not acceptable."""
    grant_id, amount, priority = grant.grant_id, grant.amount, grant.priority
    effective_at, expires_at = grant.effective_at, grant.expires_at
    source, reason = grant.source, grant.reason
    if not grant_id or not grant_id.isprintable() or len(grant_id) > 100:
        raise ValueError("a grant id must be 1 to 100 printable characters")
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise ValueError(f"a grant's amount must be whole minor units, got {amount!r}")
    if not 1 <= amount <= MAX_GRANT_MINOR:
        raise ValueError(f"a grant's amount must be from 1 to {MAX_GRANT_MINOR:,} minor units")
    if not -1_000_000 <= priority <= 1_000_000:
        raise ValueError("a grant's priority must be from -1,000,000 to 1,000,000")
    for name, moment in (("effective", effective_at), ("expiry", expires_at)):
        if moment is not None and moment.utcoffset() is None:
            raise ValueError(f"a grant's {name} moment needs a time zone")
    if expires_at is not None and expires_at <= effective_at:
        raise ValueError("a grant's expiry must be after its effective moment")
    if source not in set(CreditSource):
        choices = ", ".join(CreditSource)
        raise ValueError(f"a grant's source must be one of {choices}, got {source!r}")
    if not reason.strip() or len(reason) > MAX_REASON_LENGTH:
        raise ValueError(f"a grant needs a reason of 1 to {MAX_REASON_LENGTH} characters")
