"""Spend alerts: a customer's thresholds in one currency, and which records cross them.

A threshold is a kind and a whole number (``Threshold``, written ``kind:value``):

* ``percent_of_limit:80``: the account's committed spend (reserved plus charged: what
  counts against the spend limit) reaches 80% of its spend limit. A record the limit
  refuses reaches every percentage up to what it asked for (committed plus its amount):
  the 100% alert fires on the record that found the limit full. Percentages are 1 to
  100; with no limit set they never fire.
* ``spend:10000``: the customer's spend in the billing period reaches 10,000 minor units
  (the exact amounts of the records reserved whose usage occurred in that period, at
  most ``MAX_SPEND_LIMIT_MINOR``).

* ``balance:500``: the account's live prepaid credit (``domain.credits``: what is left
  on the grants usable at the save's moment) falls to 500 minor units or below (0 to
  ``MAX_GRANT_MINOR``). A record's measure is the balance its burn-down left; for a
  record refused (by ``block``, or by the limit), the balance minus what it asked for,
  so ``balance:0`` fires on the record that found the credit exhausted. Only usage
  moves it: an expiry or a void lowers the balance without a record (each is its own
  event), and the next record's measure counts it. An account without any grant
  never fires it.
* ``percent_of_grant:80``: usage has consumed 80% of a grant's amount (1 to 100). It
  fires on the record whose consumption carried that grant across the mark, once per
  grant (consumption only grows, so a grant crosses each mark at most once, whatever
  the period); a grant already past the mark when the threshold is set never fires it.

**Once per threshold per period** (per grant for ``percent_of_grant``). The account
keeps the period it is watching (the latest billing period its usage fell in) and the
thresholds already crossed in it. A threshold fires on the first record that reaches it
in a period and never again in that period; in the next period it is watched afresh (so
a customer still above 80% of an all-time limit hears it once more, on the period's
first record). Usage of an earlier
period (late usage) counts towards the period being watched. Each crossing is an
``AlertCrossed`` event of the ingest save that reserved (or refused) the record, naming
it, with an id derived from the account, the threshold and the period, or the grant
(``alert_id``): the id a receiver deduplicates by.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple
from uuid import UUID

from domain.credits import MAX_GRANT_MINOR
from domain.ids import uuid5
from domain.money import MAX_SPEND_LIMIT_MINOR, running_difference, running_sum

__all__ = [
    "ALERT_NAMESPACE",
    "BALANCE",
    "KINDS",
    "MAX_THRESHOLDS",
    "PERCENT_OF_GRANT",
    "PERCENT_OF_LIMIT",
    "SPEND",
    "Credit",
    "Crossing",
    "Spend",
    "Threshold",
    "Watch",
    "alert_id",
    "crossings",
    "grant_mark",
    "parse_thresholds",
    "quiet_at",
    "quiet_spend",
]

ALERT_NAMESPACE = UUID("7d2c9a41-5e8b-5f16-a3c0-9b4e1d7f2a68")
PERCENT_OF_LIMIT = "percent_of_limit"
SPEND = "spend"
BALANCE = "balance"
PERCENT_OF_GRANT = "percent_of_grant"
KINDS = (PERCENT_OF_LIMIT, SPEND, BALANCE, PERCENT_OF_GRANT)
_PERCENTS = (PERCENT_OF_LIMIT, PERCENT_OF_GRANT)
MAX_THRESHOLDS = 20  # per account: each one is checked for every record reserved


@dataclass(frozen=True, order=True)
class Threshold:
    """One alert threshold: ``kind:value`` (see the module docstring)."""

    kind: str
    value: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"alert kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind in _PERCENTS and not 1 <= self.value <= 100:
            what = "the limit" if self.kind == PERCENT_OF_LIMIT else "a grant"
            raise ValueError(f"a percentage of {what} is 1 to 100, not {self.value}")
        if self.kind == SPEND and not 1 <= self.value <= MAX_SPEND_LIMIT_MINOR:
            raise ValueError(
                f"a spend threshold is 1 to {MAX_SPEND_LIMIT_MINOR} minor units, not {self.value}"
            )
        if self.kind == BALANCE and not 0 <= self.value <= MAX_GRANT_MINOR:
            raise ValueError(
                f"a balance threshold is 0 to {MAX_GRANT_MINOR} minor units, not {self.value}"
            )

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.value}"

    @classmethod
    def parse(cls, key: str) -> Threshold:
        """``kind:value`` (ValueError when it is not one). An account's thresholds are
        parsed for every ingest save: each key's answer is kept (a threshold is frozen)."""
        found = _PARSED.get(key) if cls is Threshold else None
        if found is not None:
            return found
        kind, _, value = key.partition(":")
        if not value.isdigit():
            raise ValueError(f"alert threshold {key!r}: kind:whole number")
        threshold = cls(kind, int(value))
        if cls is Threshold and len(_PARSED) < _MAX_PARSED:
            _PARSED[key] = threshold
        return threshold


# ``Threshold.parse``'s answers, by key (bounded: keys are few, but come from operators).
_PARSED: dict[str, Threshold] = {}
_MAX_PARSED = 10_000


def parse_thresholds(keys: Iterable[str]) -> list[Threshold]:
    """Distinct thresholds in order (ValueError on a bad one or more than the maximum)."""
    found = sorted({Threshold.parse(k) for k in keys})
    if len(found) > MAX_THRESHOLDS:
        raise ValueError(f"at most {MAX_THRESHOLDS} alert thresholds per account")
    return found


class Spend(NamedTuple):
    """A record as the alerts see it: what it asked for, and in which period (a tuple:
    one is made per record of every batch of an account with alerts)."""

    usage_id: str
    transaction_id: UUID
    amount: Decimal
    period: str  # the billing period's key (``Period.key``)


@dataclass(frozen=True)
class Crossing:
    """A threshold reached by a record: what ``AlertCrossed`` records."""

    threshold: Threshold
    period: str
    usage_id: str
    transaction_id: UUID
    value: Decimal  # the measure that reached it (committed, the spend, balance, consumed)
    grant_id: str | None = None  # the grant, for ``percent_of_grant``


@dataclass
class Watch:
    """What the account watches: the period, its spend, the thresholds crossed in it."""

    period: str | None
    spend: Decimal
    crossed: set[str]

    def enter(self, period: str) -> None:
        """A record of ``period``: a later period starts afresh (ISO keys sort in time)."""
        if self.period is None or period > self.period:
            self.period, self.spend, self.crossed = period, Decimal(0), set()


@dataclass
class Credit:
    """The account's prepaid credit as the alerts see it, before a save's first record:
    the live balance, and per grant its amount and what usage had consumed of it; with
    what each record of the save consumed, per grant in burn order. ``crossings``
    advances it record by record (running sums: compared, never stored as they are)."""

    balance: Decimal
    amounts: Mapping[str, int]
    consumed: dict[str, Decimal]
    taken: Mapping[UUID, Sequence[tuple[str, Decimal]]] = field(default_factory=dict)
    _marks: dict[str, list[tuple[Threshold, Decimal]]] = field(default_factory=dict)

    def burn(self, record: Spend, ok: bool) -> Decimal:
        """The record's balance measure: for a record refused, the balance less what it
        asked for; else the balance after what it took (which it becomes)."""
        if not ok:
            return running_difference(self.balance, record.amount)
        for _, part in self.taken.get(record.transaction_id, ()):
            self.balance = running_difference(self.balance, part)
        return self.balance

    def grant_crossings(self, period: str, record: Spend) -> list[Crossing]:
        """The grants whose consumption the record carried across a threshold's mark
        (``percent_of_grant``, as ``mark`` set them), what they consumed advanced past
        it."""
        found = []
        for grant_id, part in self.taken.get(record.transaction_id, ()):
            before = self.consumed[grant_id]
            after = self.consumed[grant_id] = running_sum(before, part)
            for threshold, mark in self._marks[grant_id]:
                if before < mark <= after:
                    found.append(
                        Crossing(threshold, period, record.usage_id, record.transaction_id,
                                 after, grant_id)
                    )  # fmt: skip
        return found

    def mark(self, thresholds: Sequence[Threshold]) -> None:
        """Each threshold's mark on each grant: its share of the grant's amount (once a
        save, before the records)."""
        self._marks = {
            grant_id: [(t, grant_mark(amount, t.value)) for t in thresholds]
            for grant_id, amount in self.amounts.items()
        }


def grant_mark(amount: int, percent: int) -> Decimal:
    """The consumption at which a grant of ``amount`` reaches ``percent_of_grant:percent``
    (exact: a whole amount times a whole percentage, over 100)."""
    return Decimal(amount * percent).scaleb(-2)


def crossings(  # noqa: PLR0917
    thresholds: Sequence[Threshold],
    watch: Watch,
    committed: Decimal,
    limit: int | None,
    records: Sequence[Spend],
    granted: Sequence[bool],
    credit: Credit | None = None,
) -> list[Crossing]:
    """The crossings of ``records`` (in order, ``granted`` saying which the limit took),
    ``committed`` being the account's committed spend before the first and ``credit``
    its prepaid credit (None: no grant, ever); ``watch`` (and ``credit``) are advanced
    as it goes (the caller records the watch)."""
    found: list[Crossing] = []
    per_grant = [t for t in thresholds if t.kind == PERCENT_OF_GRANT]
    watched = [t for t in thresholds if t.kind != PERCENT_OF_GRANT]
    if credit is not None:
        credit.mark(per_grant)
    for record, ok in zip(records, granted, strict=True):
        watch.enter(record.period)
        period = watch.period or record.period
        demand = running_sum(committed, record.amount)
        if ok:
            committed = demand
            watch.spend = running_sum(watch.spend, record.amount)
        balance: Decimal | None = None
        if credit is not None:
            balance = credit.burn(record, ok)
            found += credit.grant_crossings(period, record)
        for threshold in watched:
            if threshold.key in watch.crossed:
                continue
            value = _measure(threshold, demand, watch.spend, limit, balance)
            if value is None:
                continue
            watch.crossed.add(threshold.key)
            found.append(Crossing(threshold, period, record.usage_id, record.transaction_id, value))
    return found


def quiet_spend(  # noqa: PLR0917
    thresholds: Sequence[Threshold],
    watch: Watch,
    committed: Decimal,
    limit: int | None,
    records: Sequence[Spend],
    granted: Sequence[bool],
    balance: Decimal | None,
) -> Decimal | None:
    """The period's spend after ``records`` when none of them can have reached a
    threshold ``crossings`` would find (``percent_of_grant`` aside: the account checks
    its grants), else None; then ``crossings`` walks them one by one.

    ``committed`` and ``balance`` are the committed spend and the live credit after the
    records (None: no grant). When every record was reserved, none is negative and none
    is of a later period than the one watched, every measure moves one way through
    the batch (the committed spend and the period's spend up, the balance down, the
    period and what it crossed unchanged), so a threshold one record reached, the last
    one reaches too: the batch's end decides, in a few comparisons instead of a walk."""
    period = watch.period
    if period is None or len(granted) != len(records) or not all(granted):
        return None  # (unpaired: the walk says so)
    total = Decimal(0)
    for record in records:
        if record.amount < 0 or record.period > period:
            return None
        total = running_sum(total, record.amount)
    spend = running_sum(watch.spend, total)
    return spend if quiet_at(thresholds, watch.crossed, committed, spend, limit, balance) else None


def quiet_at(  # noqa: PLR0917
    thresholds: Sequence[Threshold],
    crossed: Collection[str],
    committed: Decimal,
    spend: Decimal,
    limit: int | None,
    balance: Decimal | None,
) -> bool:
    """Whether a batch's end (the committed spend, the period's spend and the live
    balance after it) reaches no threshold not ``crossed`` yet (``percent_of_grant``
    aside: the account checks its grants): ``quiet_spend``'s test, for a batch known to
    move every measure one way."""
    for threshold in thresholds:
        if threshold.kind == PERCENT_OF_GRANT or threshold.key in crossed:
            continue
        if _measure(threshold, committed, spend, limit, balance) is not None:
            return False
    return True


def _measure(
    threshold: Threshold,
    demand: Decimal,
    spend: Decimal,
    limit: int | None,
    balance: Decimal | None,
) -> Decimal | None:
    """The measure when it reaches ``threshold``, else None (compared exactly: the
    target, a limit of at most 10^15 times a percentage over 100, has 18 digits)."""
    if threshold.kind == PERCENT_OF_LIMIT:
        if limit is None:
            return None
        return demand if demand >= Decimal(limit * threshold.value).scaleb(-2) else None
    if threshold.kind == BALANCE:
        return balance if balance is not None and balance <= threshold.value else None
    return spend if spend >= threshold.value else None


def alert_id(account: UUID, threshold: Threshold, period: str, grant_id: str | None = None) -> UUID:
    """The crossing's id: the same account, threshold and period (or grant, for
    ``percent_of_grant``, which crosses once per grant), the same id."""
    if grant_id is not None:
        return uuid5(ALERT_NAMESPACE, f"{account}:{threshold.key}:grant:{grant_id}")
    return uuid5(ALERT_NAMESPACE, f"{account}:{threshold.key}:{period}")
