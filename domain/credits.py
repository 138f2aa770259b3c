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

**Purchased credit is paid first.** A grant bought with ``credits grant --source
purchased`` (or by an automatic top-up) is recorded *awaiting payment*: it counts in
conservation like any grant but is not live until its one-off invoice is paid
(``domain.purchase``); an invoice voided or uncollectible voids what is left of it, with
the reason, so it never becomes live. Its price is whole minor units, from 0 (a gift
invoiced at nothing) to ``MAX_GRANT_MINOR``.

**Automatic top-up.** A rule per account (``TopUp``): when the live balance falls below
``below`` in an ingest save, buy ``buy`` at ``price``. ``buy`` must be more than
``below`` (a purchase that cannot lift the balance above the threshold again would
leave the rule spent after one crossing, which is never what an operator meant).

**Policy.** ``overage`` (the default): usage beyond the live grants is billed as
always. ``block``: a record the live grants cannot cover in full is refused (the
transaction is compensated with the reason ``credits exhausted``, and consumes
nothing), so the customer's credit never goes below zero and nothing is billed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import NamedTuple, Protocol

from domain.money import add_exact, subtract_exact, sum_exact

__all__ = [
    "CREDITS_EXHAUSTED",
    "MAX_GRANT_MINOR",
    "MAX_REASON_LENGTH",
    "CreditPolicy",
    "CreditSource",
    "CreditTotals",
    "Grant",
    "GrantState",
    "TopUp",
    "burn_order",
    "check_grant",
    "check_price",
    "check_top_up",
    "credit_totals",
    "top_up_grant_id",
]

MAX_GRANT_MINOR = 10**13
MAX_REASON_LENGTH = 500
CREDITS_EXHAUSTED = "credits exhausted"


class CreditPolicy(StrEnum):
    """What happens to usage when the live grants run out."""

    OVERAGE = "overage"
    BLOCK = "block"


class GrantState(StrEnum):
    """Whether a grant can be used at all (its moments and balance aside)."""

    LIVE = "live"  # usable between its effective moment and its expiry
    PENDING = "pending"  # purchased, its invoice not paid yet: not consumable
    UNPAID = "unpaid"  # purchased, its invoice void or uncollectible: voided, never live


class CreditSource(StrEnum):
    PURCHASED = "purchased"
    PROMOTIONAL = "promotional"
    MANUAL = "manual"


class CreditTotals(NamedTuple):
    """One account's grants in sum (``CustomerAccount.credit_totals``): how many, what
    they granted and where it went, exactly; ``granted - consumed - expired - voided``
    is what is left (pending purchased credit included)."""

    grants: int
    granted: int
    consumed: Decimal
    expired: Decimal
    voided: Decimal
    policy: str


class _Summed(Protocol):
    """What ``credit_totals`` reads of a grant (``Grant``, the audit's ``GrantAudit``)."""

    amount: int
    consumed: Decimal
    expired: Decimal
    voided: Decimal


def credit_totals(grants: Collection[_Summed], policy: str) -> CreditTotals:
    """``grants`` summed, exactly, with the account's ``policy``: one account's row of
    ``billing.credit_balances``, as its state says (``CustomerAccount.credit_totals``) or
    as its history does (the audit)."""
    return CreditTotals(
        grants=len(grants),
        granted=sum(g.amount for g in grants),
        consumed=sum_exact(g.consumed for g in grants),
        expired=sum_exact(g.expired for g in grants),
        voided=sum_exact(g.voided for g in grants),
        policy=policy,
    )


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
    # Purchased credit (later than the first grants: defaults, so older snapshots load).
    awaiting_payment: bool = False  # recorded pending; False again once paid
    purchase_id: str | None = None
    note: str = ""  # why it is live or not: its payment, or why it never became live

    @property
    def state(self) -> GrantState:
        if not self.awaiting_payment:
            return GrantState.LIVE
        return GrantState.UNPAID if self.voided > 0 else GrantState.PENDING

    @property
    def remaining(self) -> Decimal:
        """What is left: ``amount - consumed - expired - voided`` (I11)."""
        used = self.consumed
        if self.expired or self.voided:  # closed: the usual grant is neither
            used = add_exact(add_exact(used, self.expired), self.voided)
        return subtract_exact(Decimal(self.amount), used)

    @property
    def closed(self) -> bool:
        """Expired or voided: nothing of it can be consumed any more."""
        return self.expired > 0 or self.voided > 0 or self.remaining == 0

    def live(self, now: datetime) -> bool:
        """Usable at ``now``: paid for (not awaiting payment), effective, not past its
        expiry, neither expired nor voided, something left (the cheap tests first: every
        ingest save asks, for each grant)."""
        return (
            not self.awaiting_payment
            and self.effective_at <= now
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


def check_price(price: int) -> None:
    """ValueError, in one line, when a purchase's price is not whole minor units from 0
    to ``MAX_GRANT_MINOR``."""
    if isinstance(price, bool) or not isinstance(price, int):
        raise ValueError(f"a price must be whole minor units, got {price!r}")
    if not 0 <= price <= MAX_GRANT_MINOR:
        raise ValueError(f"a price must be from 0 to {MAX_GRANT_MINOR:,} minor units")


@dataclass(frozen=True)
class TopUp:
    """An automatic top-up rule: below ``below`` live credit, buy ``buy`` for ``price``
    (all whole minor units); ``version`` counts the rules set on the account."""

    below: int
    buy: int
    price: int
    version: int


def check_top_up(below: int, buy: int, price: int) -> None:
    """ValueError, in one line, when a top-up rule is not acceptable."""
    for name, value in (("threshold", below), ("amount to buy", buy)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"a top-up's {name} must be whole minor units, got {value!r}")
    if not 1 <= below < MAX_GRANT_MINOR:
        raise ValueError(f"a top-up's threshold must be from 1 to {MAX_GRANT_MINOR - 1:,}")
    if not 1 <= buy <= MAX_GRANT_MINOR:
        raise ValueError(f"a top-up's amount to buy must be from 1 to {MAX_GRANT_MINOR:,}")
    if buy <= below:
        raise ValueError(
            "a top-up must buy more than its threshold (or one purchase could not"
            " lift the balance above it again)"
        )
    check_price(price)


def top_up_grant_id(version: int, crossing: int) -> str:
    """The grant an automatic top-up buys: named by its rule's version and the crossing
    (never a clock), so two saves deciding the same crossing name the same grant."""
    return f"top-up-{version}-{crossing}"
