"""The ``Contract`` aggregate: one customer's overrides of list prices, and its minimums.

**What a contract holds.** Each version is a whole contract (a file): for any meters, a
*replacement* price (the same table as a price file's meter, parsed by the same function,
so whatever a price file can say a contract can) or a *discount*, an exact percentage off
the list price (``"12.5"``: 12.5 percent off); and optionally a *minimum* per billing
period, per currency (the invoice's currency), for the whole invoice or for a meter (in
the meter's list currency): when an invoice's lines (of that meter) sum below it, the
invoice gets a true-up line for the shortfall (``true_up``; ``domain.closing``).

**Which contract version prices a moment** (``ContractSchedule.at``): as the price book,
the version with the latest ``effective_from`` at or before the moment, ties to the one
set last; before its first version the customer pays list prices. A record is priced by
that version if it overrides the record's meter, else by the list (the price book version
in force); its ``Metered`` names both (``domain.transaction``). A discount applies to the
list price *in force at the record's moment*, so a new price book version moves a
discounted price with it; a replacement does not move. The list still decides which
meters exist: a meter the book does not price at a moment is unknown whatever a contract
says, and a replacement in another currency than the list's at that moment cannot price
it (the record is set aside with that reason).

**Which version's minimum applies to a period** (``minimum_for``): the version in force
at the period's last moment (the contract the customer has when its invoice closes).

**One aggregate per customer, id derived from the customer id** (``domain.ids.contract_id``):
a worker finds any customer's contract from the record alone, with no lookup table and
no read when the customer has none (one indexed query per batch asks which of the batch's
customers have a contract newer than the one it holds); its versions are one ordered
history whose version numbers are the aggregate's own order; two operators setting a
customer's contract at once are settled by the store's version check, the loser re-decides
on the winner's version. A contract is small (a customer's overrides), so a customer with
many versions still loads in one read.

**Limits**: ``MAX_OVERRIDES`` overrides per version, ``MAX_VERSIONS`` versions per
contract (each loads with the contract), a minimum at most ``MAX_ITEM_AMOUNT`` minor
units (one Stripe invoice item), a discount with at most ``MAX_DISCOUNT_DECIMALS``
decimals.

Public methods decide (check, compute); the private ``@event`` methods only apply.
"""

from __future__ import annotations

import tomllib
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import InvalidUsage, PriceListError
from domain.ids import contract_id
from domain.money import MAX_ITEM_AMOUNT, format_money, parse_exact_amount
from domain.pricing import Price, PriceList

__all__ = [
    "MAX_DISCOUNT_DECIMALS",
    "MAX_OVERRIDES",
    "MAX_VERSIONS",
    "Contract",
    "ContractError",
    "ContractSchedule",
    "ContractTerms",
    "ContractVersion",
    "Override",
    "check_terms",
    "discounted",
    "true_up",
]

MAX_OVERRIDES = 10_000
"""Meters one contract version may override."""
MAX_VERSIONS = 1_000
"""Versions one customer's contract may have (each is loaded with it)."""
MAX_DISCOUNT_DECIMALS = 6
"""Decimals a discount may have (``12.5`` has one): exact, and short enough to read."""

_EXACT = Context(prec=38, traps=[Inexact, InvalidOperation])
_HUNDRED = Decimal(100)


class ContractError(PriceListError):
    """Raised when a contract (a version to set) is not valid; ``problems`` lists every
    problem found, each with its reason."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


def discounted(price: Price, percent: Decimal) -> Price:
    """``price`` less ``percent`` percent, exactly (InvalidUsage when the result cannot be
    written in a price's digits). The one place a discount touches a price: a pricing
    model with more amounts than a unit price discounts each of them here."""

    def off(amount: Decimal) -> Decimal:
        try:
            return _EXACT.divide(_EXACT.multiply(amount, _HUNDRED - percent), _HUNDRED)
        except (Inexact, InvalidOperation):
            raise InvalidUsage(
                f"{percent} percent off {amount} is not exact in 38 digits"
            ) from None

    return replace(
        price,
        unit_price=off(price.unit_price),
        tiers=tuple(replace(t, unit_price=off(t.unit_price)) for t in price.tiers),
        flat_fee=off(price.flat_fee),
    )


@dataclass(frozen=True)
class Override:
    """One meter's contract price: a replacement ``price``, or ``discount`` percent off
    the list price (exactly one of the two)."""

    price: Price | None = None
    discount: Decimal | None = None

    def applied_to(self, listed: Price) -> Price:
        """The price this override makes of ``listed`` (the list price at the moment);
        InvalidUsage when a replacement is in another currency than the list."""
        if self.price is None:
            assert self.discount is not None
            return discounted(listed, self.discount)
        if self.price.currency != listed.currency:
            raise InvalidUsage(
                f"the contract prices the meter in {self.price.currency}, the price book in"
                f" {listed.currency}"
            )
        return self.price

    def to_spec(self) -> dict[str, Any]:
        """As stored in a ``Contract.Set`` event (and written in a contract file)."""
        if self.price is None:
            return {"discount": str(self.discount)}
        spec: dict[str, Any] = PriceList({"m": self.price}).to_meters()["m"]
        return spec


@dataclass(frozen=True)
class ContractTerms:
    """A contract file's content, checked: overrides by meter, minimums by currency
    (minor units)."""

    overrides: Mapping[str, Override]
    minimums: Mapping[str, int]
    meter_minimums: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # by currency

    @classmethod
    def from_toml(cls, text: str, listed: PriceList) -> ContractTerms:
        """Parse and check a contract file against the list prices ``listed`` (every
        problem listed in one ContractError)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ContractError([f"not valid TOML: {exc}"]) from None
        unknown = sorted(set(data) - {"meters", "minimum"})
        problems = [
            f"unknown table or key {k!r} (expected [meters.NAME], [minimum])" for k in unknown
        ]
        try:
            terms = check_terms(data.get("meters", {}), data.get("minimum", {}), listed)
        except ContractError as exc:
            problems += exc.problems
        if problems:
            raise ContractError(problems)
        return terms

    def to_event(self) -> dict[str, Any]:
        """The ``Contract.Set`` fields these terms are."""
        return {
            "meters": {m: o.to_spec() for m, o in self.overrides.items()},
            "minimums": dict(self.minimums),
            "meter_minimums": {c: dict(m) for c, m in self.meter_minimums.items()},
        }


def check_terms(meters: Any, minimums: Any, listed: PriceList) -> ContractTerms:
    """The overrides ``meters`` (a contract file's ``[meters]`` table) and ``minimums``
    (its ``[minimum]`` table: currency -> amount in major units), checked against the list
    prices ``listed``: ContractError naming every problem, or the terms."""
    problems: list[str] = []
    overrides: dict[str, Override] = {}
    if not isinstance(meters, Mapping):
        problems.append("[meters] must be a table of [meters.NAME] tables")
        meters = {}
    if len(meters) > MAX_OVERRIDES:
        problems.append(f"{len(meters)} meters: a contract overrides at most {MAX_OVERRIDES:,}")
    for name, spec in meters.items():
        try:
            overrides[name] = _override(name, spec, listed)
        except PriceListError as exc:
            problems.append(str(exc))
    per_meter: Any = {}
    if isinstance(minimums, Mapping) and "meters" in minimums:
        per_meter = minimums["meters"]
        minimums = {k: v for k, v in minimums.items() if k != "meters"}
    checked_minimums = _minimums(minimums, problems)
    meter_minimums = _meter_minimums(per_meter, listed, problems)
    if not overrides and not checked_minimums and not meter_minimums and not problems:
        problems.append("the contract overrides no meter and sets no minimum")
    if problems:
        raise ContractError(problems)
    return ContractTerms(overrides, checked_minimums, meter_minimums)


def _override(name: str, spec: Any, listed: PriceList) -> Override:
    listed_price = listed.prices.get(name)
    if listed_price is None:
        raise PriceListError(f"meter {name!r}: not in the price book (no list price to override)")
    if isinstance(spec, Mapping) and set(spec) == {"discount"}:
        return Override(discount=_discount(name, spec["discount"], listed_price))
    if isinstance(spec, Mapping) and "discount" in spec:
        raise PriceListError(f"meter {name!r}: a discount or a price, not both")
    # The price file's own parser: whatever a price file's meter can say, a contract can.
    price = PriceList.from_meters({name: spec}).prices[name]
    if price.currency != listed_price.currency:
        raise PriceListError(
            f"meter {name!r}: currency {price.currency} differs from its list price's"
            f" ({listed_price.currency})"
        )
    return Override(price=price)


def _discount(name: str, raw: Any, listed: Price) -> Decimal:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise PriceListError(f'meter {name!r}: discount must be a percentage like "12.5"')
    try:
        percent = Decimal(str(raw))
    except InvalidOperation:
        raise PriceListError(f"meter {name!r}: discount {raw!r} is not a number") from None
    if not percent.is_finite() or not 0 <= percent <= _HUNDRED:
        raise PriceListError(f"meter {name!r}: discount {raw!r} is not a percentage from 0 to 100")
    exponent = percent.as_tuple().exponent
    assert isinstance(exponent, int)
    if -exponent > MAX_DISCOUNT_DECIMALS:
        raise PriceListError(
            f"meter {name!r}: discount {raw!r} has more than {MAX_DISCOUNT_DECIMALS} decimals"
        )
    try:
        discounted(listed, percent).exact_amount(Decimal(1))
    except InvalidUsage as exc:
        raise PriceListError(
            f"meter {name!r}: discount {raw!r} makes a rate that is not exact: {exc}"
        ) from None
    return percent


def _minimums(raw: Any, problems: list[str]) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        problems.append('[minimum] must be a table: CURRENCY = "amount"')
        return {}
    out: dict[str, int] = {}
    for currency, amount in raw.items():
        minor = _minimum(f"minimum {currency}", amount, str(currency), problems)
        if minor is not None:
            out[str(currency).upper()] = minor
    return out


def _meter_minimums(raw: Any, listed: PriceList, problems: list[str]) -> dict[str, dict[str, int]]:
    """``[minimum.meters]``: meter -> amount, in the meter's list currency."""
    if not isinstance(raw, Mapping):
        problems.append('[minimum.meters] must be a table: "METER" = "amount"')
        return {}
    out: dict[str, dict[str, int]] = {}
    for meter, amount in raw.items():
        price = listed.prices.get(meter)
        if price is None:
            problems.append(f"minimum of meter {meter!r}: not in the price book")
            continue
        minor = _minimum(f"minimum of meter {meter!r}", amount, price.currency, problems)
        if minor is not None:
            out.setdefault(price.currency, {})[meter] = minor
    return out


def _minimum(what: str, amount: Any, currency: str, problems: list[str]) -> int | None:
    """A minimum written as text in major units, in minor units (None: a problem noted)."""
    try:
        if isinstance(amount, bool) or not isinstance(amount, str | int):
            raise ValueError(f'{amount!r} is not an amount: write it as text ("100.00")')
        minor = parse_exact_amount(str(amount), currency)
    except (ValueError, InvalidUsage) as exc:
        problems.append(f"{what}: {exc}")
        return None
    if minor > MAX_ITEM_AMOUNT:
        problems.append(
            f"{what}: above {format_money(MAX_ITEM_AMOUNT, currency)} (one Stripe item)"
        )
        return None
    return minor


class ContractVersion:
    """One version of a customer's contract, as pricing reads it."""

    __slots__ = (
        "_priced", "customer_id", "effective_from", "meter_minimums", "minimums", "number",
        "overrides",
    )  # fmt: skip

    def __init__(  # noqa: PLR0917 (a Set event's fields)
        self,
        customer_id: str,
        number: int,
        effective_from: datetime,
        overrides: Mapping[str, Override],
        minimums: Mapping[str, int],
        meter_minimums: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self.customer_id = customer_id
        self.meter_minimums = meter_minimums or {}  # currency -> meter -> minor units
        self.number = number
        self.effective_from = effective_from
        self.overrides = overrides
        self.minimums = minimums
        self._priced: dict[tuple[str, Price], Price] = {}  # a discount computed once per list price

    def price_of(self, meter: str, listed: Price) -> Price | None:
        """This version's price of ``meter`` given its list price, or None when it does
        not override the meter (InvalidUsage: it cannot price it, see the module)."""
        override = self.overrides.get(meter)
        if override is None:
            return None
        key = (meter, listed)
        found = self._priced.get(key)
        if found is None:
            found = self._priced[key] = override.applied_to(listed)
        return found


class ContractSchedule:
    """A customer's contract versions as a worker holds them (immutable)."""

    __slots__ = ("_order", "_starts", "customer_id", "versions")

    def __init__(self, customer_id: str, versions: Sequence[ContractVersion]) -> None:
        self.customer_id = customer_id
        self.versions = tuple(versions)
        self._order = sorted(self.versions, key=lambda v: (v.effective_from, v.number))
        self._starts = [v.effective_from for v in self._order]

    def version(self, number: int) -> ContractVersion | None:
        if 1 <= number <= len(self.versions):
            return self.versions[number - 1]
        return None

    def at(self, moment: datetime) -> ContractVersion | None:
        """The version in force at ``moment``; None before the first (list prices)."""
        i = bisect_right(self._starts, moment)
        return self._order[i - 1] if i else None

    def at_end_of(self, period_end: datetime) -> ContractVersion | None:
        """The version whose minimums apply to a period ending at ``period_end``: the one
        in force at the period's last moment."""
        return self.at(period_end - timedelta(microseconds=1))

    def minimum_for(self, period_end: datetime, currency: str) -> tuple[int, int] | None:
        """(version number, minimum in minor units) for a period ending at ``period_end``
        in ``currency`` (``at_end_of``); None when it sets no minimum in that currency."""
        version = self.at_end_of(period_end)
        if version is None or currency not in version.minimums:
            return None
        return version.number, version.minimums[currency]


def true_up(minimum: int, billed_total: int) -> int:
    """The true-up a period owes: ``max(0, minimum - billed_total)``. Both are whole minor
    units (lines are rounded once each, the minimum is written in minor units), so the
    true-up needs no rounding of its own."""
    return max(0, minimum - billed_total)


class Contract(Aggregate):
    """One customer's contract: numbered versions, each in force from a moment."""

    class Opened(Aggregate.Created):
        customer_id: str

    class Set(Aggregate.Event):
        number: int
        effective_from: datetime
        meters: dict[str, dict[str, Any]]  # meter -> {"discount": "12.5"} or a price table
        minimums: dict[str, int]  # currency -> minor units, the whole invoice
        meter_minimums: dict[str, dict[str, int]]  # currency -> meter -> minor units

    @staticmethod
    def create_id(customer_id: str, **_: Any) -> UUID:
        return contract_id(customer_id)

    @event(Opened)
    def __init__(self, customer_id: str) -> None:
        self.customer_id = customer_id
        self.versions: list[ContractVersion] = []

    def set(self, terms: ContractTerms, effective_from: datetime) -> ContractVersion:
        """Record ``terms`` (checked: ``ContractTerms``) as the next version, in force
        from ``effective_from`` (which must name its time zone)."""
        if effective_from.utcoffset() is None:
            raise ContractError(
                [f"effective_from {effective_from.isoformat()} has no time zone: give one"]
            )
        if len(self.versions) >= MAX_VERSIONS:
            raise ContractError([f"the contract has {MAX_VERSIONS:,} versions, the most it may"])
        try:
            moment = effective_from.astimezone(UTC)
        except OverflowError:
            raise ContractError(
                [f"effective_from {effective_from.isoformat()} is not in years 1 to 9999 in UTC"]
            ) from None
        self._set(len(self.versions) + 1, moment, **terms.to_event())
        return self.versions[-1]

    @event(Set)
    def _set(
        self,
        number: int,
        effective_from: datetime,
        meters: dict[str, dict[str, Any]],
        minimums: dict[str, int],
        meter_minimums: dict[str, dict[str, int]],
    ) -> None:
        self.versions.append(
            ContractVersion(
                self.customer_id,
                number,
                effective_from,
                stored_overrides(meters),
                minimums,
                meter_minimums,
            )
        )

    @property
    def schedule(self) -> ContractSchedule:
        return ContractSchedule(self.customer_id, self.versions)


def stored_overrides(meters: Mapping[str, Mapping[str, Any]]) -> dict[str, Override]:
    """The overrides a ``Set`` event holds, as stored (checked when set: loaded as they
    were, whatever the rules are now)."""
    out: dict[str, Override] = {}
    for name, spec in meters.items():
        if "discount" in spec:
            out[name] = Override(discount=Decimal(spec["discount"]))
        else:
            out[name] = Override(price=Price.from_spec(spec))
    return out
