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
the ingest calls ``check_alerts`` once per account right after the reservation (and the
credits' burn-down, which leaves the spend the limit counts alone), so a crossing is an
event of the very save that reserved the record.
**Prepaid credits** live here too (``domain.credits`` has the grant's rules): the grants
are the customer's money in this currency, and a record must be decided against them
in the same save that records it, under the same version check as its reservation,
so that any number of ingest processes keep every balance exact and current without a
lock (a process that loses the race reloads the account and decides again). The
account is already loaded and written by every ingest batch, so the grants cost no
extra read or write there. ``reserve_and_burn`` is the ingest's one call: it expires
grants past their expiry (``CreditExpired``), reserves against the limit, and burns
the reserved usage down the live grants: one ``CreditsConsumed`` per batch, listing
each (transaction, grant, amount). The usual batch, every record burnt whole from one
grant, can instead record that on its ``AmountsReserved`` (``burnt_from``,
``burnt_at``: one event per account and save, as the alerts' period spend is carried),
which ``consumption`` reads like a ``CreditsConsumed``; see ``RESERVATION_CARRIES_CREDIT``
for why it is not written yet. Under the ``block`` policy a record the grants cannot
cover is not reserved at all. ``grant_credit``, ``void_credit`` and ``set_credit_policy`` are the
operator's commands. A void takes only what is left of a grant (``CreditVoided`` with
that remainder): what usage consumed stays consumed, and is on its invoices.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from itertools import compress, repeat
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.alerts import (
    PERCENT_OF_GRANT,
    Credit,
    Spend,
    Threshold,
    Watch,
    alert_id,
    crossings,
    grant_mark,
    parse_thresholds,
    quiet_at,
    quiet_spend,
)
from domain.credits import (
    CreditPolicy,
    CreditSource,
    CreditTotals,
    Grant,
    GrantState,
    TopUp,
    burn_order,
    check_grant,
    check_price,
    check_top_up,
    credit_totals,
    top_up_grant_id,
)
from domain.ids import account_id, purchase_id
from domain.money import (
    add_exact,
    canonical,
    check_spend_limit,
    format_money,
    running_difference,
    running_sum,
    subtract_exact,
    sum_exact,
)

__all__ = [
    "CREDIT_EVENTS",
    "RESERVATION_CARRIES_CREDIT",
    "Burn",
    "Burner",
    "CustomerAccount",
    "Hold",
    "consumption",
    "moves_credit",
]


class Burn(NamedTuple):
    """What ``reserve_and_burn`` decided for one record: reserved (or refused by the
    limit), blocked by the ``block`` policy, and the credit it consumed (a tuple: one
    is made per record, in the ingest's hot loop)."""

    reserved: bool
    blocked: bool = False
    credit: Decimal = Decimal(0)


_NO_GRANTS: dict[str, Grant] = {}
_NO_REQUESTS: dict[str, list[int]] = {}


class _Reserved(NamedTuple):
    """What ``CustomerAccount._reserve_all`` decided: per request whether it was reserved,
    and the reserved ones' ids, amounts as recorded (text) and amounts."""

    granted: list[bool]
    ids: list[str]
    texts: list[str]
    amounts: list[Decimal]


RESERVATION_CARRIES_CREDIT = False
"""Whether the usual batch (every reserved record burnt whole from one grant) records its
consumption on its ``AmountsReserved`` (``burnt_from``, ``burnt_at``: one event fewer per
account and save) instead of a ``CreditsConsumed``. Off in this release, which reads
both: a build before it reads such a reservation without error and counts none of its
credit (it would burn the grant again, and its credit lane would not read it), so the
ledger writes it only once no build before this one can still be running, from the next
release on (a rolling restart runs both builds side by side)."""

_new_tuple = tuple.__new__
_NOT_BURNT = Burn(reserved=True)
_REFUSED = Burn(reserved=False)
_BLOCKED = Burn(reserved=False, blocked=True)


class CustomerAccount(Aggregate):
    """What one customer has reserved and been charged in one currency."""

    class Opened(Aggregate.Created):
        customer_id: str
        currency: str
        spend_limit: int | None

    class LimitSet(Aggregate.Event):
        spend_limit: int | None

    class AmountsReserved(Aggregate.Event):
        class_version = 4
        transaction_ids: list[str]
        amounts: list[str]  # exact minor units, canonical decimal text (v1: integers)
        # The alerts' period every one of these counts in (their spend in it grows by
        # their sum, a later one starting afresh), so that the save records no
        # ``AlertPeriodSpent`` for them; None: they do not move it (v2 and before).
        alert_period: str | None
        # The grant every one of these amounts was burnt from, whole, at the save's moment
        # ``burnt_at`` (the usual batch of an account with credit), so that the save
        # records no ``CreditsConsumed`` for them; None: no credit (v3 and before).
        burnt_from: str | None
        burnt_at: datetime | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["amounts"] = [str(a) for a in state["amounts"]]

        @staticmethod
        def upcast_v2_v3(state: dict[str, Any]) -> None:
            state["alert_period"] = None

        @staticmethod
        def upcast_v3_v4(state: dict[str, Any]) -> None:
            state["burnt_from"] = state["burnt_at"] = None

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

        class_version = 2

        alert_id: str
        customer_id: str
        currency: str
        threshold: str  # ``kind:value``
        period: str  # the billing period's key
        usage_id: str
        transaction_id: str
        value: str  # the measure that reached it, exact minor units as decimal text
        spend_limit: int | None
        grant_id: str | None  # the grant a ``percent_of_grant`` threshold watched

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["grant_id"] = None  # crossings before grant thresholds watched no grant

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

    class CreditAwaitingPayment(Aggregate.Event):
        """A purchased grant (recorded just before, in the same save) waits for its
        one-off invoice to be paid (``domain.purchase``): it is not live until then."""

        grant_id: str
        purchase_id: str
        price: int  # what its invoice asks, whole minor units
        top_up: bool  # bought by the automatic top-up rule

    class CreditActivated(Aggregate.Event):
        """The purchased grant's invoice was paid: it is live from here."""

        grant_id: str
        purchase_id: str
        stripe_invoice_id: str

    class CreditReinstated(Aggregate.Event):
        """A purchase paid after its grant was voided, settled by an operator: the credit
        bought granted again (``grant_id``, recorded just before in the same save)."""

        grant_id: str
        voided_grant_id: str
        purchase_id: str
        stripe_invoice_id: str

    class TopUpSet(Aggregate.Event):
        below: int
        buy: int
        price: int
        version: int

    class TopUpCleared(Aggregate.Event):
        version: int

    class TopUpStarted(Aggregate.Event):
        """The live balance fell below the rule's threshold in this save: buy once.
        Plain JSON fields; ``purchase_id`` is derived from the account, the rule's version
        and the crossing's number (``grant_id``), never from a clock."""

        customer_id: str
        currency: str
        grant_id: str
        purchase_id: str
        version: int
        crossing: int
        below: int
        buy: int
        price: int
        balance: str  # the live balance after the save, exact minor units

    class TopUpRearmed(Aggregate.Event):
        """The live balance is at or above the threshold again: the next fall buys."""

        version: int
        balance: str

    # State added after the first account histories: class defaults, so an older
    # snapshot (which lacks them) loads with them. The dict is replaced, never changed.
    grants = _NO_GRANTS
    credit_policy = CreditPolicy.OVERAGE.value
    # The automatic top-up rule (plain values, so snapshots need no transcoding of it).
    top_up_below: int | None = None
    top_up_buy = 0
    top_up_price = 0
    top_up_version = 0  # rules set so far (a cleared rule counts)
    top_up_crossings = 0  # purchases started under the current version
    top_up_armed = False  # the next fall below the threshold starts a purchase
    # Top-ups started and not granted yet: grant id -> [buy, price] (replaced, never changed).
    top_up_requests = _NO_REQUESTS

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
        return max(subtract_exact(Decimal(self.spend_limit), self.committed), Decimal(0))

    def set_limit(self, spend_limit: int | None) -> None:
        """Set (or with None, remove) the spend limit. Existing reservations stand."""
        _check_limit(spend_limit, self.currency)
        if spend_limit != self.spend_limit:
            self._limit_set(spend_limit)

    @event(LimitSet)
    def _limit_set(self, spend_limit: int | None) -> None:
        self.spend_limit = spend_limit

    def reserve_all(
        self, requests: Sequence[tuple[UUID, Decimal]], alert_period: str | None = None
    ) -> list[bool]:
        """Reserve each (transaction, exact amount) in order while the limit allows.

        Returns, per request, whether it was reserved. One event for the accepted, which
        carries ``alert_period`` (``alert_period_of``: the alerts' period they all count
        in, or None) for ``check_alerts`` to find the period's spend moved already.
        """
        keys = [str(txn_id) for txn_id, _ in requests]
        return self._reserve_all(requests, keys, alert_period).granted

    def _reserve_all(
        self,
        requests: Sequence[tuple[UUID, Decimal]],
        keys: Sequence[str],
        alert_period: str | None = None,
    ) -> _Reserved:
        """``reserve_all``, given each request's transaction id as text (``keys``: the
        caller's, who needs the same text for the credit it burns); what it reserved."""
        done = self._decide_reserve(requests, keys)
        if done.ids:
            self._amounts_reserved(done.ids, done.texts, alert_period)
        return done

    def _decide_reserve(
        self, requests: Sequence[tuple[UUID, Decimal]], keys: Sequence[str]
    ) -> _Reserved:
        """What ``_reserve_all`` reserves, decided and not recorded."""
        granted: list[bool] = []
        ids: list[str] = []
        texts: list[str] = []
        amounts: list[Decimal] = []
        headroom = self.available
        for (_, amount), key in zip(requests, keys, strict=True):
            _check_amount(amount)
            ok = headroom is None or amount <= headroom
            granted.append(ok)
            if ok:
                ids.append(key)
                texts.append(f"{canonical(amount):f}")
                amounts.append(amount)
                if headroom is not None:
                    headroom = subtract_exact(headroom, amount)
        return _Reserved(granted, ids, texts, amounts)

    def hold(self) -> Hold:
        """Reserve amounts one at a time (``Hold.take``), decided in order against the
        limit, then recorded as one event (``Hold.record``): for a batch whose amounts
        depend on which earlier ones were granted (records priced by line quantity)."""
        return Hold(self)

    @event(AmountsReserved)
    def _amounts_reserved(
        self,
        transaction_ids: list[str],
        amounts: list[str],
        alert_period: str | None = None,
        burnt_from: str | None = None,
        burnt_at: datetime | None = None,
    ) -> None:
        values = [Decimal(amount) for amount in amounts]
        spend = _sum_onto(values)
        if spend is None:  # a negative amount, or a sum that is not exact on its own
            total = self.reserved
            for value in values:
                total = add_exact(total, value)
            self.reserved = total
        else:
            self.reserved = add_exact(self.reserved, spend)
        if burnt_from is not None:  # as ``CreditsConsumed`` of each of them from the grant
            if spend is None:
                spend = sum_exact(values)
            grant = self.grants[burnt_from]
            grant.consumed = add_exact(grant.consumed, spend)
        if alert_period is not None:  # as ``Watch.enter`` then its spend, for each of them
            if self.alert_period is None or alert_period > self.alert_period:
                self.alert_period, self.alert_period_spend = alert_period, Decimal(0)
                self.alerts_crossed = ()
            if spend is None:
                spend = sum_exact(values)
            self.alert_period_spend = add_exact(self.alert_period_spend, spend)

    def alert_period_of(self, periods: Collection[str]) -> str | None:
        """The alerts' period a batch's records (of ``periods``, their period keys) all
        count in, when there is one: the watched period when none is later, or their
        one period when it is later (it starts afresh); None without thresholds, or when
        the batch spans a later period and another (then ``check_alerts`` walks them and
        records ``AlertPeriodSpent``)."""
        if not self.alert_thresholds or not periods:
            return None
        watched, latest = self.alert_period, max(periods)
        if watched is not None and latest <= watched:
            return watched
        return latest if len(periods) == 1 else None

    def alert_watch(self) -> tuple[str | None, Decimal, Sequence[str]]:
        """What the alerts watch now (period, its spend, the thresholds crossed in it):
        taken before a reservation that carries ``alert_period``, for ``check_alerts``."""
        return self.alert_period, self.alert_period_spend, self.alerts_crossed

    def reprice(self, entries: Sequence[tuple[UUID, Decimal, Decimal]]) -> None:
        """Hold each transaction's new exact amount instead of its old one (id, old, new),
        in one event; never refused by the limit (see the module docstring)."""
        if not entries:
            return
        total = self.reserved
        for _, old, new in entries:
            _check_amount(old)
            _check_amount(new)
            total = add_exact(subtract_exact(total, old), new)
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
            total = add_exact(subtract_exact(total, Decimal(old)), Decimal(new))
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
        self.reserved = subtract_exact(self.reserved, amount)

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
        self.reserved = subtract_exact(self.reserved, amount)
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
        self.charged = subtract_exact(self.charged, amount)

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

    def check_alerts(
        self,
        records: Sequence[Spend],
        granted: Sequence[bool],
        now: datetime | None = None,
        watched: tuple[str | None, Decimal, Sequence[str]] | None = None,
    ) -> None:
        """Record the thresholds ``records`` cross: called once, right after
        ``reserve_all`` or ``reserve_and_burn`` decided them (``granted``: which were
        reserved), with the same records in the same order, in the same save (its
        moment ``now`` decides which grants count in the balance). Nothing when no
        threshold is set. ``watched``: ``alert_watch`` from before a reservation that
        carried ``alert_period`` (the period's spend is then moved already, and no
        ``AlertPeriodSpent`` is recorded for it)."""
        if not self.alert_thresholds or not records:
            return
        period, spent, crossed = watched if watched is not None else self.alert_watch()
        watch = Watch(period, spent, set(crossed))
        thresholds = [Threshold.parse(k) for k in self.alert_thresholds]
        # The usual batch crosses nothing, which its end shows (``quiet_spend``).
        balance = self._live_balance(now) if self.grants else None
        spend = quiet_spend(
            thresholds, watch, self.committed, self.spend_limit, records, granted, balance
        )
        if spend is not None and not self._grant_marks_passed(thresholds):
            if spend != self.alert_period_spend:
                assert self.alert_period is not None  # quiet_spend needs a watched period
                self._alert_period_spent(self.alert_period, f"{canonical(spend):f}")
            return
        # Committed before the first record: less what this save reserved of them
        # (``crossings`` checks that records and decisions pair up).
        before = self.committed
        for record in compress(records, granted):
            before = subtract_exact(before, record.amount)
        credit = self._credit_before(records, now) if self.grants else None
        found = crossings(thresholds, watch, before, self.spend_limit, records, granted, credit)
        for crossing in found:
            self._alert_crossed(
                alert_id=str(
                    alert_id(self.id, crossing.threshold, crossing.period, crossing.grant_id)
                ),
                customer_id=self.customer_id,
                currency=self.currency,
                threshold=crossing.threshold.key,
                period=crossing.period,
                usage_id=crossing.usage_id,
                transaction_id=str(crossing.transaction_id),
                value=f"{canonical(crossing.value):f}",
                spend_limit=self.spend_limit,
                grant_id=crossing.grant_id,
            )
        assert watch.period is not None  # records is not empty
        if (watch.period, watch.spend) != (self.alert_period, self.alert_period_spend):
            self._alert_period_spent(watch.period, f"{canonical(watch.spend):f}")

    def quiet_after(
        self, watched: tuple[str | None, Decimal, Sequence[str]], now: datetime | None = None
    ) -> bool:
        """Whether ``check_alerts`` would record nothing for a batch every record of was
        reserved (``reserve_all``: none negative) by a reservation that carried the period
        the alerts watched before it (``watched``: that watch). The reservation moved the
        period's spend already and every measure moved one way (``quiet_spend``'s case),
        so the batch's end decides, here, before its records are made into ``Spend``, and
        its grants passed no mark. False otherwise: the caller calls ``check_alerts``,
        which decides the same."""
        period, _, crossed = watched
        if period is None or period != self.alert_period:
            return False
        thresholds = [Threshold.parse(k) for k in self.alert_thresholds]
        balance = self._live_balance(now) if self.grants else None
        spend, limit = self.alert_period_spend, self.spend_limit
        return quiet_at(
            thresholds, crossed, self.committed, spend, limit, balance
        ) and not self._grant_marks_passed(thresholds)

    def _live_balance(self, now: datetime | None) -> Decimal:
        """What the grants live at ``now`` hold (all of them when ``now`` is None): the
        balance the alerts measure."""
        balance = Decimal(0)
        for grant in self.grants.values():
            if now is None or grant.live(now):
                balance = running_sum(balance, grant.remaining)
        return balance

    def _grant_marks_passed(self, thresholds: Sequence[Threshold]) -> bool:
        """Whether this save's consumption may have carried a grant across a
        ``percent_of_grant`` mark: some grant consumed at least a mark now, and less
        than it before what the save's pending consumption took (``consumption``: all of
        it, a superset of the records checked, so never a crossing missed)."""
        percents = [t.value for t in thresholds if t.kind == PERCENT_OF_GRANT]
        if not percents:
            return False
        lowest = min(percents)
        reached = {
            g.grant_id: g
            for g in self.grants.values()
            if g.consumed >= grant_mark(g.amount, lowest)
        }
        if not reached:
            return False
        taken = dict.fromkeys(reached, Decimal(0))
        for pending in self.pending_events:
            for _, grant_id, text in consumption(pending):
                if grant_id in taken:
                    taken[grant_id] = running_sum(taken[grant_id], Decimal(text))
        for grant_id, grant in reached.items():
            before = running_difference(grant.consumed, taken[grant_id])
            for percent in percents:
                if before < grant_mark(grant.amount, percent) <= grant.consumed:
                    return True
        return False

    def _credit_before(self, records: Sequence[Spend], now: datetime | None) -> Credit:
        """The credit as it was before ``records`` burnt it: this save's consumption
        (its pending events' ``consumption``) given back, per grant and in all."""
        ids = {str(r.transaction_id): r.transaction_id for r in records}
        taken: dict[UUID, list[tuple[str, Decimal]]] = {}
        consumed = {g.grant_id: g.consumed for g in self.grants.values()}
        balance = self._live_balance(now)
        for pending in self.pending_events:
            for txn, grant_id, text in consumption(pending):
                record = ids.get(txn)
                if record is None:
                    continue
                amount = Decimal(text)
                taken.setdefault(record, []).append((grant_id, amount))
                consumed[grant_id] = running_difference(consumed[grant_id], amount)
                balance = running_sum(balance, amount)
        amounts = {g.grant_id: g.amount for g in self.grants.values()}
        return Credit(balance, amounts, consumed, taken)

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
        grant_id: str | None = None,
    ) -> None:
        if period != self.alert_period:
            self.alert_period, self.alert_period_spend = period, Decimal(0)
            self.alerts_crossed = ()
        if grant_id is None:  # a grant's crossings are once per grant, by its consumption
            self.alerts_crossed = (*self.alerts_crossed, threshold)

    @event(AlertPeriodSpent)
    def _alert_period_spent(self, period: str, spend: str) -> None:
        if period != self.alert_period:
            self.alert_period, self.alerts_crossed = period, ()
        self.alert_period_spend = Decimal(spend)

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
        if grant.awaiting_payment:
            grant.note = f"never live: {reason}"

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
        self,
        requests: Sequence[tuple[UUID, Decimal]],
        now: datetime,
        alert_period: str | None = None,
    ) -> list[Burn]:
        """The ingest's decision for a batch of this account's records: expire what is
        due, refuse under ``block`` what the live grants cannot cover, reserve the rest
        against the limit (``reserve_all``), and burn the reserved down the live grants
        in order. Per request, what was decided (see ``Burn``). The same decisions, one
        record at a time, are ``burner`` with ``hold`` (records priced by line quantity)."""
        if not self.grants:  # no credit, ever: only the limit decides
            granted = self.reserve_all(requests, alert_period)
            return [_NOT_BURNT if ok else _REFUSED for ok in granted]
        burner = self.burner(now)
        keys = [str(txn_id) for txn_id, _ in requests]  # each id's text, made once
        if burner.may_block:
            blocked = [burner.blocks(amount) for _, amount in requests]
        else:  # ``overage``: nothing is blocked (the usual case: no list to filter)
            blocked = [False] * len(requests)
        if any(blocked):
            wanted = [(r, k) for r, k, b in zip(requests, keys, blocked, strict=True) if not b]
            done = self._reserve_all([r for r, _ in wanted], [k for _, k in wanted], alert_period)
        else:
            done = self._decide_reserve(requests, keys)
            grant_id = burner.burn_all(done.amounts)
            if grant_id is not None:  # the usual batch: every record burnt from one grant
                self._reserved_and_burnt(done, alert_period, grant_id, now)
                return [
                    _new_tuple(Burn, (True, False, amount)) if ok else _REFUSED
                    for (_, amount), ok in zip(requests, done.granted, strict=True)
                ]
            if done.ids:
                self._amounts_reserved(done.ids, done.texts, alert_period)
        reserved = iter(done.granted)
        burns: list[Burn] = []
        for (txn_id, amount), key, was_blocked in zip(requests, keys, blocked, strict=True):
            if was_blocked:
                burns.append(_BLOCKED)
            elif not next(reserved):
                burns.append(_REFUSED)
            else:
                credit = burner.burn(txn_id, amount, key)
                burns.append(Burn(True, False, credit) if credit else _NOT_BURNT)
        burner.record()
        return burns

    def _reserved_and_burnt(
        self, done: _Reserved, alert_period: str | None, grant_id: str, now: datetime
    ) -> None:
        """Record the usual batch: reserved, and every record burnt whole from one grant
        (on the reservation when ``RESERVATION_CARRIES_CREDIT``)."""
        if RESERVATION_CARRIES_CREDIT:
            self._amounts_reserved(done.ids, done.texts, alert_period, grant_id, now)
        else:
            self._amounts_reserved(done.ids, done.texts, alert_period)
            self._credits_consumed(done.ids, [grant_id] * len(done.ids), done.texts, now)

    def burner(self, now: datetime) -> Burner:
        """Expire the grants due at ``now``, then burn records down the live grants one at
        a time (``Burner``): ``reserve_and_burn``'s steps, for a batch whose amounts are
        decided in order (``hold``)."""
        self.expire_credits(now)
        return Burner(self, now)

    @event(CreditsConsumed)
    def _credits_consumed(
        self, transaction_ids: list[str], grant_ids: list[str], amounts: list[str], at: datetime
    ) -> None:
        if grant_ids and grant_ids.count(grant_ids[0]) == len(grant_ids) == len(amounts):
            grant = self.grants[grant_ids[0]]  # one grant (the usual batch): one sum
            grant.consumed = add_exact(grant.consumed, sum_exact(map(Decimal, amounts)))
            return
        by_grant: dict[str, list[Decimal]] = {}
        for grant_id, amount in zip(grant_ids, amounts, strict=True):
            by_grant.setdefault(grant_id, []).append(Decimal(amount))
        for grant_id, taken in by_grant.items():
            grant = self.grants[grant_id]
            grant.consumed = add_exact(grant.consumed, sum_exact(taken))

    # -- purchased credit and the automatic top-up --------------------------------------

    def purchase_credit(
        self,
        grant_id: str,
        amount: int,
        price: int,
        *,
        effective_at: datetime,
        reason: str,
        priority: int = 0,
        expires_at: datetime | None = None,
    ) -> UUID | None:
        """Grant purchased credit that waits for its invoice to be paid; the purchase's
        id (``domain.purchase``), None when the same purchase is recorded already,
        ValueError when the terms or the price are not acceptable."""
        check_price(price)
        new = self.grant_credit(
            grant_id, amount, priority=priority, effective_at=effective_at,
            expires_at=expires_at, source=CreditSource.PURCHASED.value, reason=reason,
        )  # fmt: skip
        bought = purchase_id(self.customer_id, self.currency, grant_id)
        if not new:
            found = self.grants[grant_id]
            if found.purchase_id != str(bought):
                raise ValueError(f"grant {grant_id} exists already and was not purchased")
            return None
        top_up = grant_id in self.top_up_requests
        self._credit_awaiting_payment(grant_id, str(bought), price, top_up)
        return bought

    @event(CreditAwaitingPayment)
    def _credit_awaiting_payment(
        self, grant_id: str, purchase_id: str, price: int, top_up: bool
    ) -> None:
        grant = self.grants[grant_id]
        grant.awaiting_payment, grant.purchase_id = True, purchase_id
        grant.note = "awaiting payment of its invoice"
        if grant_id in self.top_up_requests:
            self.top_up_requests = {
                g: terms for g, terms in self.top_up_requests.items() if g != grant_id
            }

    def settle_purchase(
        self, grant_id: str, *, paid: bool, reason: str, stripe_invoice_id: str
    ) -> bool:
        """Its invoice was paid (the grant is live from now) or will never be (what is
        left of it is voided with ``reason``); whether anything was recorded. A grant not
        awaiting payment (settled already, or voided by an operator) is left as it is."""
        grant = self._grant(grant_id)
        if not grant.awaiting_payment or grant.voided > 0 or grant.purchase_id is None:
            return False
        if paid:
            self._credit_activated(grant_id, grant.purchase_id, stripe_invoice_id)
        else:
            self._credit_voided(grant_id, grant.remaining, reason)
        return True

    @event(CreditActivated)
    def _credit_activated(self, grant_id: str, purchase_id: str, stripe_invoice_id: str) -> None:
        grant = self.grants[grant_id]
        grant.awaiting_payment = False
        grant.note = f"paid: invoice {stripe_invoice_id}"

    def pending_purchase(self, grant_id: str) -> str | None:
        """The purchase of a grant awaiting payment (not voided yet), else None."""
        grant = self.grants.get(grant_id)
        if grant is None or grant.state is not GrantState.PENDING:
            return None
        return grant.purchase_id

    def reinstate_credit(
        self, grant_id: str, new_grant_id: str, *, purchase_id: str, stripe_invoice_id: str,
        amount: int, effective_at: datetime, reason: str,
    ) -> bool:  # fmt: skip
        """Grant again, as ``new_grant_id`` (live, purchased), the credit a purchase bought
        whose grant ``grant_id`` was voided before its invoice was paid
        (``CreditPurchase.reinstate``): same priority, and its expiry if still ahead.
        False when it is granted already; ValueError when ``grant_id`` is not that
        purchase's voided grant."""
        voided = self._grant(grant_id)
        if voided.purchase_id != purchase_id or not voided.voided:
            raise ValueError(f"grant {grant_id} is not the voided grant of purchase {purchase_id}")
        expires = voided.expires_at
        if expires is not None and expires <= effective_at:
            expires = None  # past already: the credit paid for is not taken away at once
        new = self.grant_credit(
            new_grant_id, amount, priority=voided.priority, effective_at=effective_at,
            expires_at=expires, source=CreditSource.PURCHASED.value, reason=reason,
        )  # fmt: skip
        if new:
            self._credit_reinstated(new_grant_id, grant_id, purchase_id, stripe_invoice_id)
        return new

    @event(CreditReinstated)
    def _credit_reinstated(
        self, grant_id: str, voided_grant_id: str, purchase_id: str, stripe_invoice_id: str
    ) -> None:
        self.grants[grant_id].note = (
            f"reinstates grant {voided_grant_id}: its invoice {stripe_invoice_id} was paid"
            f" after the void (purchase {purchase_id})"
        )

    def credit_totals(self) -> CreditTotals:
        """Every grant's terms summed (I11's terms, exactly) and the policy: what
        ``billing.credit_balances`` shows for this account as of its last save."""
        return credit_totals(self.grants.values(), self.credit_policy)

    def live_credit(self, now: datetime) -> Decimal:
        """What the live grants hold at ``now`` (pending and expired credit excluded)."""
        total = Decimal(0)
        for grant in self.grants.values():
            if grant.live(now):
                total = add_exact(total, grant.remaining)
        return total

    @property
    def top_up(self) -> TopUp | None:
        if self.top_up_below is None:
            return None
        return TopUp(self.top_up_below, self.top_up_buy, self.top_up_price, self.top_up_version)

    def set_top_up(self, below: int, buy: int, price: int | None = None) -> bool:
        """Buy ``buy`` for ``price`` (default ``buy``) whenever the live balance falls
        below ``below`` in an ingest save; whether a new rule was recorded (the same rule
        again records nothing). ValueError when it is not acceptable
        (``domain.credits.check_top_up``). A new rule is armed: a balance already below
        it buys at the next usage."""
        price = buy if price is None else price
        check_top_up(below, buy, price)
        if self.top_up == TopUp(below, buy, price, self.top_up_version):
            return False
        self._top_up_set(below, buy, price, self.top_up_version + 1)
        return True

    @event(TopUpSet)
    def _top_up_set(self, below: int, buy: int, price: int, version: int) -> None:
        self.top_up_below, self.top_up_buy, self.top_up_price = below, buy, price
        self.top_up_version, self.top_up_crossings, self.top_up_armed = version, 0, True

    def clear_top_up(self) -> bool:
        """No automatic top-up any more; whether there was one. Purchases started stay."""
        if self.top_up_below is None:
            return False
        self._top_up_cleared(self.top_up_version + 1)
        return True

    @event(TopUpCleared)
    def _top_up_cleared(self, version: int) -> None:
        self.top_up_below, self.top_up_version, self.top_up_armed = None, version, False

    def check_top_up(self, before: Decimal, now: datetime) -> UUID | None:
        """Called once per ingest save of this account, after the burn-down (``before``:
        the live credit before it): re-arm the rule when the balance stood at or above
        its threshold, and start a purchase when it is armed and the balance is now below
        (``TopUpStarted``, once per crossing: a second save deciding the same crossing
        loses the version race and, reloaded, finds it started). The purchase's id."""
        rule = self.top_up
        if rule is None:
            return None
        after = self.live_credit(now)
        if not self.top_up_armed and max(before, after) >= rule.below:
            self._top_up_rearmed(rule.version, f"{canonical(max(before, after)):f}")
        if not self.top_up_armed or after >= rule.below:
            return None
        crossing = self.top_up_crossings + 1
        grant_id = top_up_grant_id(rule.version, crossing)
        bought = purchase_id(self.customer_id, self.currency, grant_id)
        self._top_up_started(
            customer_id=self.customer_id, currency=self.currency, grant_id=grant_id,
            purchase_id=str(bought), version=rule.version, crossing=crossing,
            below=rule.below, buy=rule.buy, price=rule.price, balance=f"{canonical(after):f}",
        )  # fmt: skip
        return bought

    @event(TopUpRearmed)
    def _top_up_rearmed(self, version: int, balance: str) -> None:
        self.top_up_armed = True

    @event(TopUpStarted)
    def _top_up_started(
        self,
        *,
        customer_id: str,
        currency: str,
        grant_id: str,
        purchase_id: str,
        version: int,
        crossing: int,
        below: int,
        buy: int,
        price: int,
        balance: str,
    ) -> None:
        self.top_up_armed, self.top_up_crossings = False, crossing
        self.top_up_requests = {**self.top_up_requests, grant_id: [buy, price]}

    def buy_top_up(self, grant_id: str, now: datetime) -> UUID | None:
        """Turn a started top-up into a purchased grant awaiting payment (the worker's
        step); its purchase id, None when it was granted already or never started."""
        if grant_id not in self.top_up_requests or grant_id in self.grants:
            return None
        buy, price = self.top_up_requests[grant_id]
        return self.purchase_credit(
            grant_id, buy, price, effective_at=now, reason="automatic top-up"
        )

    def _grant(self, grant_id: str) -> Grant:
        grant = self.grants.get(grant_id)
        if grant is None:
            raise ValueError(f"no grant {grant_id} for {self.customer_id} in {self.currency}")
        return grant

    def _money(self, amount: Decimal) -> str:
        return format_money(amount, self.currency)


CREDIT_EVENTS: frozenset[type[CustomerAccount.Event]] = frozenset({
    CustomerAccount.AmountsReserved,
    CustomerAccount.CreditGranted,
    CustomerAccount.CreditsConsumed,
    CustomerAccount.CreditExpired,
    CustomerAccount.CreditVoided,
    CustomerAccount.CreditPolicySet,
    CustomerAccount.CreditAwaitingPayment,
    CustomerAccount.CreditActivated,
})  # fmt: skip
"""The account's events that can move its credit read models (``billing.credit_grants``,
``billing.credit_balances``): ``AmountsReserved`` only when it was burnt from a grant
(``moves_credit`` says of one event whether it does)."""


def moves_credit(event: object) -> bool:
    """Whether an account's event moves its credit: a save with one changes its balance row."""
    if isinstance(event, CustomerAccount.AmountsReserved):
        return event.burnt_from is not None
    return type(event) in CREDIT_EVENTS


def consumption(event: object) -> Iterable[tuple[str, str, str]]:
    """What an account's event consumed of its grants: (transaction id, grant id, exact
    amount as decimal text), in the order burnt. A ``CreditsConsumed`` lists them; an
    ``AmountsReserved`` burnt from a grant (the usual batch) consumed each of its amounts
    whole from that grant; any other event, nothing."""
    if isinstance(event, CustomerAccount.CreditsConsumed):
        return zip(event.transaction_ids, event.grant_ids, event.amounts, strict=True)
    if isinstance(event, CustomerAccount.AmountsReserved) and event.burnt_from is not None:
        return zip(event.transaction_ids, repeat(event.burnt_from), event.amounts)
    return ()


def _check_limit(spend_limit: int | None, currency: str) -> None:
    check_spend_limit(spend_limit, currency)


def _sum_onto(values: Sequence[Decimal]) -> Decimal | None:
    """The exact sum of ``values`` when adding it at once gives what adding each in turn
    gives (``AmountsReserved``'s mutator, on every load of every stored event): when none
    is negative, the running totals only rise, so the bound is passed by the last or by
    none, and the same total comes out. None (add each in turn) when one is negative, or
    when the sum alone is beyond the bound or not exact in 60 digits (a running total
    can be, where the sum is not: -10^10 + 10^10 + 10^-50)."""
    if not values or min(values) < 0:
        return None
    try:
        return sum_exact(values)
    except (ArithmeticError, ValueError):
        return None


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
            self._headroom = subtract_exact(headroom, amount)
        self._ids.append(str(transaction_id))
        self._amounts.append(f"{canonical(amount):f}")
        return True

    def record(self) -> None:
        """Record what was taken, as one event (nothing when nothing was)."""
        if self._ids:
            self._account._amounts_reserved(self._ids, self._amounts)
            self._ids, self._amounts = [], []


class Burner:
    """The burn-down of one account's live grants, decided one record at a time
    (``CustomerAccount.burner``), then recorded as one ``CreditsConsumed``.

    Per record, in order: ``blocks`` (under ``block``, whether the grants cannot cover
    it; a record it lets through counts against what they can cover whether or not the
    limit then reserves it), then, when the limit reserved it, ``burn``. Only positive
    amounts consume credit: a negative one (a record that moved its line to a cheaper
    volume tier) is never blocked and gives nothing back to the grants, so what a grant
    consumed only grows (I11 holds) and the credit line is not reduced by it either.
    """

    __slots__ = (
        "_account", "_amounts", "_available", "_block", "_grant_ids", "_ids", "_k",
        "_left", "_live", "_now",
    )  # fmt: skip

    def __init__(self, account: CustomerAccount, now: datetime) -> None:
        self._account = account
        self._now = now
        self._live = sorted((g for g in account.grants.values() if g.live(now)), key=burn_order)
        self._left = [g.remaining for g in self._live]
        self._block = account.credit_policy == CreditPolicy.BLOCK
        self._available = sum(self._left, Decimal(0)) if self._block else Decimal(0)
        self._k = 0  # grants before k are used up: usage burns the first with something left
        self._ids: list[str] = []
        self._grant_ids: list[str] = []
        self._amounts: list[str] = []

    @property
    def may_block(self) -> bool:
        """Whether ``blocks`` can ever answer True (the policy is ``block``)."""
        return self._block

    def blocks(self, amount: Decimal) -> bool:
        """Under ``block``, whether the grants cannot cover ``amount`` (then it is not
        reserved at all, nor does it consume)."""
        if not self._block or amount <= 0:
            return False
        if amount > self._available:
            return True
        self._available = subtract_exact(self._available, amount)
        return False

    def burn(self, txn_id: UUID, amount: Decimal, key: str | None = None) -> Decimal:
        """Burn a reserved record's ``amount`` down the live grants; the credit taken
        (``key``: ``str(txn_id)``, when the caller has it already)."""
        live, left = self._live, self._left
        k = self._k
        while k < len(live) and left[k] <= 0:
            k += 1
        self._k = k
        if k == len(live) or amount <= 0:
            return Decimal(0)
        if key is None:
            key = str(txn_id)
        if amount <= left[k]:  # the usual case: one grant covers the record
            left[k] = running_difference(left[k], amount)
            self._ids.append(key)
            self._grant_ids.append(live[k].grant_id)
            self._amounts.append(f"{canonical(amount):f}")  # as ``AmountsReserved`` has it
            return amount
        credit, owed = Decimal(0), amount
        for i in range(k, len(live)):
            take = min(owed, left[i])
            if take <= 0:
                continue
            left[i] = subtract_exact(left[i], take)
            owed = subtract_exact(owed, take)
            credit = add_exact(credit, take)
            self._ids.append(key)
            self._grant_ids.append(live[i].grant_id)
            self._amounts.append(f"{canonical(take):f}")
            if owed <= 0:
                break
        return credit

    def burn_all(self, amounts: Sequence[Decimal]) -> str | None:
        """Burn every one of ``amounts`` (reserved records, in order) whole from the grant
        the burner is at (a fresh one's: the first live grant in burn order), when that
        grant covers their sum and each is positive (the usual batch), in one step: what
        ``burn`` decides for each in turn then (and where an amount has so many digits
        that ``burn``'s running balance could not be kept exactly, the exact sum instead
        of ``Inexact``). The grant's id, which the caller records on the reservation
        (``AmountsReserved.burnt_from``: this burner records nothing of them); None,
        nothing burnt, otherwise."""
        live, left, k = self._live, self._left, self._k
        if k == len(live) or not amounts or min(amounts) <= 0:
            return None
        total = sum_exact(amounts)  # > 0: a grant used up (after ``burn``) never covers it
        if total > left[k]:
            return None
        left[k] = running_difference(left[k], total)
        return live[k].grant_id

    def record(self) -> None:
        """Record what was consumed, as one event (nothing when nothing was)."""
        if self._ids:
            self._account._credits_consumed(self._ids, self._grant_ids, self._amounts, self._now)
            self._ids, self._grant_ids, self._amounts = [], [], []
