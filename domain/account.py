"""The ``CustomerAccount`` aggregate: a customer's spend in one currency, and its limit.

The spend limit caps what the customer owes in that currency: everything held, in
flight or charged. Unlimited by default. A reservation that would take the total
past the limit is refused, and the caller compensates the transaction with the reason.

The charge path does not write the account: a charge moves nothing between held and
free, so ``reserved`` keeps the charged amounts too, and charges never contend with
ingest for the account's next version. A compensation or a reversal releases the
hold. (``settle`` exists for ledgers that want the split on the account; the split
between in flight and charged is read from the transactions: ``tools.summary``.)

Reservations are recorded one event per ingest batch (``AmountsReserved`` lists the
transactions and amounts) because ingest reserves hundreds at once; releases,
settlements and reversals happen one transaction at a time.

Amounts are exact (``Decimal`` minor units, as ``Metered`` records them): a limit holds
exactly what the usage is worth, not what rounding per record would make of it. The
limit itself is a whole number of minor units, at most ``MAX_SPEND_LIMIT_MINOR``.
Histories from before exact amounts (integers) load through upcasting.

**Prepaid credits** live here too (``domain.credits`` has the grant's rules): the grants
are the customer's money in this currency, and a record must be decided against them
in the same save that records it, under the same version check as its reservation,
so that any number of ingest processes keep every balance exact and current without a
lock (a process that loses the race reloads the account and decides again). The
account is already loaded and written by every ingest batch, so the grants cost no
extra read or write there. ``reserve_and_burn`` is the ingest's one call: it expires
grants past their expiry (``CreditExpired``), reserves against the limit, and burns
the reserved usage down the live grants (one ``CreditsConsumed`` per batch, like
``AmountsReserved``); under the ``block`` policy a record the grants cannot cover is
not reserved at all. ``grant_credit``, ``void_credit`` and ``set_credit_policy`` are the
operator's commands. A void takes only what is left of a grant (``CreditVoided`` with
that remainder): what usage consumed stays consumed, and is on its invoices.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.credits import (
    CreditPolicy,
    Grant,
    burn_order,
    check_grant,
)
from domain.ids import account_id
from domain.money import (
    add_exact,
    canonical,
    check_spend_limit,
    format_money,
    running_difference,
    sum_exact,
)

__all__ = ["Burn", "CustomerAccount"]


class Burn(NamedTuple):
    """What ``reserve_and_burn`` decided for one record: reserved (or refused by the
    limit), blocked by the ``block`` policy, and the credit it consumed (a tuple: one
    is made per record, in the ingest's hot loop)."""

    reserved: bool
    blocked: bool = False
    credit: Decimal = Decimal(0)


_NO_GRANTS: dict[str, Grant] = {}
_NOT_BURNT = Burn(reserved=True)
_REFUSED = Burn(reserved=False)


class CustomerAccount(Aggregate):
    """What one customer has reserved and been charged in one currency."""

    class Opened(Aggregate.Created):
        customer_id: str
        currency: str
        spend_limit: int | None

    class LimitSet(Aggregate.Event):
        spend_limit: int | None

    class AmountsReserved(Aggregate.Event):
        class_version = 2
        transaction_ids: list[str]
        amounts: list[str]  # exact minor units, canonical decimal text (v1: integers)

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amounts"] = [str(a) for a in state["amounts"]]

    class ReservationReleased(Aggregate.Event):
        class_version = 2
        transaction_id: str
        amount: Decimal

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amount"] = Decimal(state["amount"])

    class ReservationSettled(Aggregate.Event):
        class_version = 2
        transaction_id: str
        amount: Decimal

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amount"] = Decimal(state["amount"])

    class ChargeReversed(Aggregate.Event):
        class_version = 2
        transaction_id: str
        amount: Decimal

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amount"] = Decimal(state["amount"])

    # Prepaid credits (domain.credits).

    class CreditGranted(Aggregate.Event):
        grant_id: str
        amount: int
        priority: int
        effective_at: datetime
        expires_at: datetime | None
        source: str
        reason: str

    class CreditVoided(Aggregate.Event):
        grant_id: str
        amount: Decimal  # the remainder voided
        reason: str

    class CreditExpired(Aggregate.Event):
        grant_id: str
        amount: Decimal  # the remainder at its expiry
        expires_at: datetime

    class CreditsConsumed(Aggregate.Event):
        """One per ingest batch: each (transaction, grant, exact amount) consumed."""

        transaction_ids: list[str]
        grant_ids: list[str]
        amounts: list[str]  # exact minor units, canonical decimal text
        at: datetime  # the save's moment, which decided which grants were live

    class CreditPolicySet(Aggregate.Event):
        policy: str

    # State added after the first account histories: class defaults, so an older
    # snapshot (which lacks them) loads with them. The dict is replaced, never changed.
    grants = _NO_GRANTS
    credit_policy = CreditPolicy.OVERAGE.value

    @staticmethod
    def create_id(customer_id: str, currency: str, **_: Any) -> UUID:
        return account_id(customer_id, currency)

    @classmethod
    def open(
        cls, customer_id: str, currency: str, spend_limit: int | None = None
    ) -> CustomerAccount:
        """Open an account (the limit, if any, must not be negative)."""
        _check_limit(spend_limit, currency)
        return cls(customer_id=customer_id, currency=currency, spend_limit=spend_limit)

    @event(Opened)
    def __init__(self, customer_id: str, currency: str, spend_limit: int | None = None) -> None:
        self.customer_id = customer_id
        self.currency = currency
        self.spend_limit = spend_limit
        self.reserved = Decimal(0)
        self.charged = Decimal(0)
        self.grants = {}
        self.credit_policy = CreditPolicy.OVERAGE.value

    @property
    def committed(self) -> Decimal:
        """Reserved plus charged: what counts against the limit."""
        return add_exact(self.reserved, self.charged)

    @property
    def available(self) -> Decimal | None:
        """How much more can be reserved; None when unlimited."""
        if self.spend_limit is None:
            return None
        return max(add_exact(Decimal(self.spend_limit), -self.committed), Decimal(0))

    def set_limit(self, spend_limit: int | None) -> None:
        """Set (or with None, remove) the spend limit. Existing reservations stand."""
        _check_limit(spend_limit, self.currency)
        if spend_limit != self.spend_limit:
            self._limit_set(spend_limit)

    @event(LimitSet)
    def _limit_set(self, spend_limit: int | None) -> None:
        self.spend_limit = spend_limit

    def reserve_all(self, requests: Sequence[tuple[UUID, Decimal]]) -> list[bool]:
        """Reserve each (transaction, exact amount) in order while the limit allows.

        Returns, per request, whether it was reserved. One event for the accepted.
        """
        granted: list[bool] = []
        ids: list[str] = []
        amounts: list[str] = []
        headroom = self.available
        for txn_id, amount in requests:
            _check_amount(amount)
            ok = headroom is None or amount <= headroom
            granted.append(ok)
            if ok:
                ids.append(str(txn_id))
                amounts.append(f"{canonical(amount):f}")
                if headroom is not None:
                    headroom = add_exact(headroom, -amount)
        if ids:
            self._amounts_reserved(ids, amounts)
        return granted

    @event(AmountsReserved)
    def _amounts_reserved(self, transaction_ids: list[str], amounts: list[str]) -> None:
        total = self.reserved
        for amount in amounts:
            total = add_exact(total, Decimal(amount))
        self.reserved = total

    def release(self, transaction_id: UUID, amount: Decimal) -> None:
        """Give back a reservation whose transaction was compensated."""
        _check_amount(amount)
        if amount > self.reserved:
            raise ValueError(
                f"cannot release {self._money(amount)}: only {self._money(self.reserved)} reserved"
            )
        self._released(str(transaction_id), amount)

    @event(ReservationReleased)
    def _released(self, transaction_id: str, amount: Decimal) -> None:
        self.reserved = add_exact(self.reserved, -amount)

    def settle(self, transaction_id: UUID, amount: Decimal) -> None:
        """Turn a reservation into a charge."""
        _check_amount(amount)
        if amount > self.reserved:
            raise ValueError(
                f"cannot settle {self._money(amount)}: only {self._money(self.reserved)} reserved"
            )
        self._settled(str(transaction_id), amount)

    @event(ReservationSettled)
    def _settled(self, transaction_id: str, amount: Decimal) -> None:
        self.reserved = add_exact(self.reserved, -amount)
        self.charged = add_exact(self.charged, amount)

    def reverse_charge(self, transaction_id: UUID, amount: Decimal) -> None:
        """Take back a charge that was reversed (refunded) in Stripe."""
        _check_amount(amount)
        if amount > self.charged:
            raise ValueError(
                f"cannot reverse {self._money(amount)}: only {self._money(self.charged)} charged"
            )
        self._reversed(str(transaction_id), amount)

    @event(ChargeReversed)
    def _reversed(self, transaction_id: str, amount: Decimal) -> None:
        self.charged = add_exact(self.charged, -amount)

    # Prepaid credits (domain.credits): the operator's commands, then the ingest's call.

    @property
    def credit_remaining(self) -> Decimal:
        """What is left on every grant (live or not yet effective)."""
        total = Decimal(0)
        for grant in self.grants.values():
            total = add_exact(total, grant.remaining)
        return total

    def grant_credit(
        self,
        grant_id: str,
        amount: int,
        *,
        priority: int = 0,
        effective_at: datetime,
        expires_at: datetime | None = None,
        source: str,
        reason: str,
    ) -> bool:
        """Add a grant; False when the same grant exists already (a repeated command),
        ValueError when the id is taken by other terms or the terms are not valid."""
        terms = Grant(grant_id, amount, priority, effective_at, expires_at, source, reason, -1)
        check_grant(terms)
        found = self.grants.get(grant_id)
        if found is not None:
            if found.terms == terms.terms:
                return False
            raise ValueError(f"grant {grant_id} exists already with other terms")
        self._credit_granted(grant_id, amount, priority, effective_at, expires_at, source, reason)
        return True

    @event(CreditGranted)
    def _credit_granted(  # noqa: PLR0917 (the event's fields)
        self,
        grant_id: str,
        amount: int,
        priority: int,
        effective_at: datetime,
        expires_at: datetime | None,
        source: str,
        reason: str,
    ) -> None:
        grant = Grant(
            grant_id, amount, priority, effective_at, expires_at, source, reason,
            order=len(self.grants),
        )  # fmt: skip
        self.grants = {**self.grants, grant_id: grant}  # never the class's empty default

    def void_credit(self, grant_id: str, reason: str) -> Decimal:
        """Void what is left of a grant (what usage consumed stays consumed); returns
        the amount voided. ValueError for an unknown grant, or one closed already."""
        grant = self._grant(grant_id)
        if not reason.strip():
            raise ValueError("voiding a grant needs a reason")
        if grant.closed:
            raise ValueError(f"grant {grant_id} has nothing left to void")
        remainder = grant.remaining
        self._credit_voided(grant_id, remainder, reason)
        return remainder

    @event(CreditVoided)
    def _credit_voided(self, grant_id: str, amount: Decimal, reason: str) -> None:
        grant = self.grants[grant_id]
        grant.voided = add_exact(grant.voided, amount)

    def set_credit_policy(self, policy: str) -> None:
        """``block`` or ``overage`` (see ``domain.credits``)."""
        chosen = CreditPolicy(policy)
        if chosen != self.credit_policy:
            self._credit_policy_set(str(chosen))

    @event(CreditPolicySet)
    def _credit_policy_set(self, policy: str) -> None:
        self.credit_policy = str(CreditPolicy(policy))

    def expire_credits(self, now: datetime) -> list[str]:
        """Record the expiry of every grant past its expiry with something left."""
        due = [g for g in self.grants.values() if g.due_to_expire(now)]
        for grant in due:
            assert grant.expires_at is not None
            self._credit_expired(grant.grant_id, grant.remaining, grant.expires_at)
        return [g.grant_id for g in due]

    @event(CreditExpired)
    def _credit_expired(self, grant_id: str, amount: Decimal, expires_at: datetime) -> None:
        grant = self.grants[grant_id]
        grant.expired = add_exact(grant.expired, amount)

    def reserve_and_burn(
        self, requests: Sequence[tuple[UUID, Decimal]], now: datetime
    ) -> list[Burn]:
        """The ingest's decision for a batch of this account's records: expire what is
        due, refuse under ``block`` what the live grants cannot cover, reserve the rest
        against the limit (``reserve_all``), and burn the reserved down the live grants
        in order. Per request, what was decided (see ``Burn``)."""
        if not self.grants:  # no credit, ever: only the limit decides
            return [_NOT_BURNT if ok else _REFUSED for ok in self.reserve_all(requests)]
        self.expire_credits(now)
        live = sorted((g for g in self.grants.values() if g.live(now)), key=burn_order)
        block = self.credit_policy == CreditPolicy.BLOCK
        left = [g.remaining for g in live]
        blocked = [False] * len(requests)
        if block:  # what the grants cannot cover is not reserved (nor does it consume)
            available = sum(left, Decimal(0))
            for i, (_, amount) in enumerate(requests):
                if amount > available:
                    blocked[i] = True
                else:
                    available = add_exact(available, -amount)
        wanted = [r for r, b in zip(requests, blocked, strict=True) if not b]
        reserved = iter(self.reserve_all(wanted))
        ids: list[str] = []
        grant_ids: list[str] = []
        amounts: list[str] = []
        burns: list[Burn] = []
        k = 0  # grants before k are used up: usage always burns the first with something left
        for (txn_id, amount), was_blocked in zip(requests, blocked, strict=True):
            if was_blocked:
                burns.append(Burn(reserved=False, blocked=True))
                continue
            if not next(reserved):
                burns.append(_REFUSED)
                continue
            while k < len(live) and left[k] <= 0:
                k += 1
            if k == len(live) or amount <= 0:
                burns.append(_NOT_BURNT)
                continue
            if amount <= left[k]:  # the usual case: one grant covers the record
                left[k] = running_difference(left[k], amount)
                ids.append(str(txn_id))
                grant_ids.append(live[k].grant_id)
                amounts.append(f"{amount:f}")  # canonical: a transaction's exact amount
                burns.append(Burn(reserved=True, credit=amount))
                continue
            burns.append(
                Burn(
                    reserved=True,
                    credit=self._split(txn_id, amount, live, left, k, (ids, grant_ids, amounts)),
                )
            )
        if ids:
            self._credits_consumed(ids, grant_ids, amounts, now)
        return burns

    @staticmethod
    def _split(  # noqa: PLR0917 (the burn-down's state, shared with its loop)
        txn_id: UUID,
        amount: Decimal,
        live: list[Grant],
        left: list[Decimal],
        k: int,
        out: tuple[list[str], list[str], list[str]],
    ) -> Decimal:
        """Burn ``amount`` down the grants from ``k`` on, as far as they go; the credit."""
        credit, owed = Decimal(0), amount
        for i in range(k, len(live)):
            take = min(owed, left[i])
            if take <= 0:
                continue
            left[i] = add_exact(left[i], -take)
            owed = add_exact(owed, -take)
            credit = add_exact(credit, take)
            out[0].append(str(txn_id))
            out[1].append(live[i].grant_id)
            out[2].append(f"{canonical(take):f}")
            if owed <= 0:
                break
        return credit

    @event(CreditsConsumed)
    def _credits_consumed(
        self, transaction_ids: list[str], grant_ids: list[str], amounts: list[str], at: datetime
    ) -> None:
        by_grant: dict[str, list[Decimal]] = {}
        for grant_id, amount in zip(grant_ids, amounts, strict=True):
            by_grant.setdefault(grant_id, []).append(Decimal(amount))
        for grant_id, taken in by_grant.items():
            grant = self.grants[grant_id]
            grant.consumed = add_exact(grant.consumed, sum_exact(taken))

    def _grant(self, grant_id: str) -> Grant:
        grant = self.grants.get(grant_id)
        if grant is None:
            raise ValueError(f"no grant {grant_id} for {self.customer_id} in {self.currency}")
        return grant

    def _money(self, amount: Decimal) -> str:
        return format_money(amount, self.currency)


def _check_limit(spend_limit: int | None, currency: str) -> None:
    check_spend_limit(spend_limit, currency)


def _check_amount(amount: Decimal) -> None:
    if amount < 0:
        raise ValueError(f"an amount cannot be negative: {amount}")
