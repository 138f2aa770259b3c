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

Kinds to come with credit grants (``percent_of_grant``, ``balance``) add a name to
``KINDS`` and a measure to ``_measure``; nothing else changes.

**Once per threshold per period.** The account keeps the period it is watching (the
latest billing period its usage fell in) and the thresholds already crossed in it. A
threshold fires on the first record that reaches it in a period and never again in that
period; in the next period it is watched afresh (so a customer still above 80% of an
all-time limit hears it once more, on the period's first record). Usage of an earlier
period (late usage) counts towards the period being watched. Each crossing is an
``AlertCrossed`` event of the ingest save that reserved (or refused) the record, naming
it, with an id derived from the account, the threshold and the period (``alert_id``):
the id a receiver deduplicates by.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

from domain.ids import uuid5
from domain.money import MAX_SPEND_LIMIT_MINOR, add_exact

__all__ = [
    "ALERT_NAMESPACE",
    "KINDS",
    "MAX_THRESHOLDS",
    "PERCENT_OF_LIMIT",
    "SPEND",
    "Crossing",
    "Spend",
    "Threshold",
    "Watch",
    "alert_id",
    "crossings",
    "parse_thresholds",
]

ALERT_NAMESPACE = UUID("7d2c9a41-5e8b-5f16-a3c0-9b4e1d7f2a68")
PERCENT_OF_LIMIT = "percent_of_limit"
SPEND = "spend"
KINDS = (PERCENT_OF_LIMIT, SPEND)
MAX_THRESHOLDS = 20  # per account: each one is checked for every record reserved


@dataclass(frozen=True, order=True)
class Threshold:
    """One alert threshold: ``kind:value`` (see the module docstring)."""

    kind: str
    value: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"alert kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind == PERCENT_OF_LIMIT and not 1 <= self.value <= 100:
            raise ValueError(f"a percentage of the limit is 1 to 100, not {self.value}")
        if self.kind == SPEND and not 1 <= self.value <= MAX_SPEND_LIMIT_MINOR:
            raise ValueError(
                f"a spend threshold is 1 to {MAX_SPEND_LIMIT_MINOR} minor units, not {self.value}"
            )

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.value}"

    @classmethod
    def parse(cls, key: str) -> Threshold:
        """``kind:value`` (ValueError when it is not one)."""
        kind, _, value = key.partition(":")
        if not value.isdigit():
            raise ValueError(f"alert threshold {key!r}: kind:whole number")
        return cls(kind, int(value))


def parse_thresholds(keys: Iterable[str]) -> list[Threshold]:
    """Distinct thresholds in order (ValueError on a bad one or more than the maximum)."""
    found = sorted({Threshold.parse(k) for k in keys})
    if len(found) > MAX_THRESHOLDS:
        raise ValueError(f"at most {MAX_THRESHOLDS} alert thresholds per account")
    return found


@dataclass(frozen=True)
class Spend:
    """A record as the alerts see it: what it asked for, and in which period."""

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
    value: Decimal  # the measure that reached it (committed, or the period's spend)


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


def crossings(  # noqa: PLR0917
    thresholds: Sequence[Threshold],
    watch: Watch,
    committed: Decimal,
    limit: int | None,
    records: Sequence[Spend],
    granted: Sequence[bool],
) -> list[Crossing]:
    """The crossings of ``records`` (in order, ``granted`` saying which the limit took),
    ``committed`` being the account's committed spend before the first; ``watch`` is
    advanced as it goes (the caller records it)."""
    found: list[Crossing] = []
    for record, ok in zip(records, granted, strict=True):
        watch.enter(record.period)
        demand = add_exact(committed, record.amount)
        if ok:
            committed = demand
            watch.spend = add_exact(watch.spend, record.amount)
        for threshold in thresholds:
            if threshold.key in watch.crossed:
                continue
            value = _measure(threshold, demand, watch.spend, limit)
            if value is None:
                continue
            watch.crossed.add(threshold.key)
            period = watch.period or record.period
            found.append(Crossing(threshold, period, record.usage_id, record.transaction_id, value))
    return found


def _measure(
    threshold: Threshold, demand: Decimal, spend: Decimal, limit: int | None
) -> Decimal | None:
    """The measure when it reaches ``threshold``, else None (compared exactly: the
    target, a limit of at most 10^15 times a percentage over 100, has 18 digits)."""
    if threshold.kind == PERCENT_OF_LIMIT:
        if limit is None:
            return None
        return demand if demand >= Decimal(limit * threshold.value).scaleb(-2) else None
    return spend if spend >= threshold.value else None


def alert_id(account: UUID, threshold: Threshold, period: str) -> UUID:
    """The crossing's id: the same account, threshold and period, the same id."""
    return uuid5(ALERT_NAMESPACE, f"{account}:{threshold.key}:{period}")
