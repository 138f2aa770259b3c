"""The ``CustomerAccount`` aggregate: a customer's spend in one currency, and its limit.

The spend limit caps what the customer owes in that currency: everything held, in
flight or charged. Unlimited by default. A reservation that would take the total
past the limit is refused, and the caller compensates the transaction with the reason.

The charge path does not write the account: a charge moves nothing between held and
free, so ``reserved`` keeps the charged amounts too, and charges never contend with
ingest for the account's next version. A compensation or a reversal releases the
hold. (``settle`` exists for ledgers that want the split on the account; the split
between in flight and charged is read from the transactions: ``tools.summary``.)

**Re-pricing** (``domain.repricing``): a transaction priced again by a version published
later changes what it holds by the difference (``AmountsRepriced``: one event per line
re-priced, old and new amounts). The spend limit does not refuse it: the usage already
happened and is owed at the price in force when it occurred; a limit exceeded so only
makes later reservations wait for headroom (``available`` is 0).

Reservations are recorded one event per ingest batch (``AmountsReserved`` lists the
transactions and amounts) because ingest reserves hundreds at once; releases,
settlements and reversals happen one transaction at a time.

Amounts are exact (``Decimal`` minor units, as ``Metered`` records them): a limit holds
exactly what the usage is worth, not what rounding per record would make of it. The
limit itself is a whole number of minor units, at most ``MAX_SPEND_LIMIT_MINOR``.
Histories from before exact amounts (integers) load through upcasting.

Spend alerts (``domain.alerts``) live here too, in methods and events of their own
(``set_alerts``, ``check_alerts``; ``AlertsSet``, ``AlertCrossed``, ``AlertPeriodSpent``):
the ingest calls ``check_alerts`` once per account right after ``reserve_all``, so a
crossing is an event of the very save that reserved the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.alerts import Spend, Threshold, Watch, alert_id, crossings, parse_thresholds
from domain.ids import account_id
from domain.money import add_exact, canonical, check_spend_limit, format_money

__all__ = ["CustomerAccount", "Hold"]


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

    class AmountsRepriced(Aggregate.Event):
        transaction_ids: list[str]
        old_amounts: list[str]  # exact minor units, canonical decimal text
        amounts: list[str]  # the new ones

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

    class AlertsSet(Aggregate.Event):
        thresholds: list[str]  # ``kind:value`` (domain.alerts.Threshold.key), sorted

    class AlertCrossed(Aggregate.Event):
        """A threshold reached; plain JSON fields: the relay publishes it as it is."""

        alert_id: str
        customer_id: str
        currency: str
        threshold: str  # ``kind:value``
        period: str  # the billing period's key
        usage_id: str
        transaction_id: str
        value: str  # the measure that reached it, exact minor units as decimal text
        spend_limit: int | None

    class AlertPeriodSpent(Aggregate.Event):
        """The period the alerts watch and its spend so far, once per ingest save."""

        period: str
        spend: str  # exact minor units, decimal text

    # The alerts' state, as class attributes so that accounts (and sealed snapshots)
    # from before alerts load with none set.
    alert_thresholds: Sequence[str] = ()
    alert_period: str | None = None
    alert_period_spend: Decimal = Decimal(0)
    alerts_crossed: Sequence[str] = ()  # in ``alert_period``

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

    def hold(self) -> Hold:
        """Reserve amounts one at a time (``Hold.take``), decided in order against the
        limit, then recorded as one event (``Hold.record``): for a batch whose amounts
        depend on which earlier ones were granted (records priced by line quantity)."""
        return Hold(self)

    @event(AmountsReserved)
    def _amounts_reserved(self, transaction_ids: list[str], amounts: list[str]) -> None:
        total = self.reserved
        for amount in amounts:
            total = add_exact(total, Decimal(amount))
        self.reserved = total

    def reprice(self, entries: Sequence[tuple[UUID, Decimal, Decimal]]) -> None:
        """Hold each transaction's new exact amount instead of its old one (id, old, new),
        in one event; never refused by the limit (see the module docstring)."""
        if not entries:
            return
        total = self.reserved
        for _, old, new in entries:
            _check_amount(old)
            _check_amount(new)
            total = add_exact(add_exact(total, -old), new)
        if total < 0:
            raise ValueError(f"cannot reprice more than {self._money(self.reserved)} reserved")
        self._amounts_repriced(
            [str(i) for i, _, _ in entries],
            [f"{canonical(old):f}" for _, old, _ in entries],
            [f"{canonical(new):f}" for _, _, new in entries],
        )

    @event(AmountsRepriced)
    def _amounts_repriced(
        self, transaction_ids: list[str], old_amounts: list[str], amounts: list[str]
    ) -> None:
        total = self.reserved
        for old, new in zip(old_amounts, amounts, strict=True):
            total = add_exact(add_exact(total, -Decimal(old)), Decimal(new))
        self.reserved = total

    def release(self, transaction_id: UUID, amount: Decimal) -> None:
        """Give back a reservation whose transaction was compensated (a negative amount,
        a volume tier's drop, takes its release back: the hold grows by it)."""
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

    # -- spend alerts (domain.alerts) --------------------------------------------------

    def set_alerts(self, thresholds: Sequence[str]) -> None:
        """Set the alert thresholds (``kind:value``; none clears them). ValueError on a
        bad one. Thresholds already crossed this period stay crossed."""
        keys = [t.key for t in parse_thresholds(thresholds)]
        if keys != list(self.alert_thresholds):
            self._alerts_set(keys)

    @event(AlertsSet)
    def _alerts_set(self, thresholds: list[str]) -> None:
        self.alert_thresholds = tuple(thresholds)

    def check_alerts(self, records: Sequence[Spend], granted: Sequence[bool]) -> None:
        """Record the thresholds ``records`` cross: called once, right after
        ``reserve_all`` reserved them (``granted`` is its answer), with the same records
        in the same order. Nothing when no threshold is set."""
        if not self.alert_thresholds or not records:
            return
        taken = [r.amount for r, ok in zip(records, granted, strict=True) if ok]
        before = self.committed
        for amount in taken:
            before = add_exact(before, -amount)
        watch = Watch(self.alert_period, self.alert_period_spend, set(self.alerts_crossed))
        thresholds = [Threshold.parse(k) for k in self.alert_thresholds]
        for found in crossings(thresholds, watch, before, self.spend_limit, records, granted):
            self._alert_crossed(
                alert_id=str(alert_id(self.id, found.threshold, found.period)),
                customer_id=self.customer_id,
                currency=self.currency,
                threshold=found.threshold.key,
                period=found.period,
                usage_id=found.usage_id,
                transaction_id=str(found.transaction_id),
                value=f"{canonical(found.value):f}",
                spend_limit=self.spend_limit,
            )
        assert watch.period is not None  # records is not empty
        if (watch.period, watch.spend) != (self.alert_period, self.alert_period_spend):
            self._alert_period_spent(watch.period, f"{canonical(watch.spend):f}")

    @event(AlertCrossed)
    def _alert_crossed(
        self,
        *,
        alert_id: str,
        customer_id: str,
        currency: str,
        threshold: str,
        period: str,
        usage_id: str,
        transaction_id: str,
        value: str,
        spend_limit: int | None,
    ) -> None:
        if period != self.alert_period:
            self.alert_period, self.alert_period_spend = period, Decimal(0)
            self.alerts_crossed = ()
        self.alerts_crossed = (*self.alerts_crossed, threshold)

    @event(AlertPeriodSpent)
    def _alert_period_spent(self, period: str, spend: str) -> None:
        if period != self.alert_period:
            self.alert_period, self.alerts_crossed = period, ()
        self.alert_period_spend = Decimal(spend)

    def _money(self, amount: Decimal) -> str:
        return format_money(amount, self.currency)


def _check_limit(spend_limit: int | None, currency: str) -> None:
    check_spend_limit(spend_limit, currency)


def _check_amount(amount: Decimal) -> None:
    if amount < 0:
        raise ValueError(f"an amount cannot be negative: {amount}")


class Hold:
    """Reservations on one account decided one at a time (``CustomerAccount.hold``).

    A negative amount (a record that moved its line to a cheaper volume tier: its line's
    total dropped) is always granted and gives its headroom back: it is a release of
    what the line's earlier records held, recorded in the same ``AmountsReserved``. The
    account's reserved total stays >= 0: per line, the amounts granted in order add up
    to the line's total, ``f(quantity) >= 0``.
    """

    __slots__ = ("_account", "_amounts", "_headroom", "_ids")

    def __init__(self, account: CustomerAccount) -> None:
        self._account = account
        self._headroom = account.available
        self._ids: list[str] = []
        self._amounts: list[str] = []

    def take(self, transaction_id: UUID, amount: Decimal) -> bool:
        """Reserve ``amount`` if the limit allows it; whether it was reserved."""
        headroom = self._headroom
        if headroom is not None:
            if amount > headroom:
                return False
            self._headroom = add_exact(headroom, -amount)
        self._ids.append(str(transaction_id))
        self._amounts.append(f"{canonical(amount):f}")
        return True

    def record(self) -> None:
        """Record what was taken, as one event (nothing when nothing was)."""
        if self._ids:
            self._account._amounts_reserved(self._ids, self._amounts)
            self._ids, self._amounts = [], []
