"""The price list: meter name -> price, and the pricing models.

A price is given in *major* units of its currency per ``per`` units of the meter
(``2.50`` USD per 1,000,000 input tokens), because that is how AI products publish
prices. A price list whose rate does not terminate as a decimal (``per = 3``) is
refused when it is loaded, not record by record.

**A pricing model is a function of a line's total quantity in its period**: ``f(Q)``,
exact minor units (``Price.total``), where ``Q`` is the sum of the quantities of the
usage an invoice line holds (one customer, meter and period). **A record's exact
amount is what it adds to that total**: ``f(Q_before + q) - f(Q_before)``, where
``Q_before`` is the line's quantity when the record is settled into it
(``Price.increment``). The models (``model = ...`` in a price file):

* ``per_unit`` (the default): ``Q x unit_price / per``. Linear, so a record's amount is
  ``q x unit_price / per`` whatever the line holds: ingest prices it alone
  (``Price.exact_amount``), as it always has;
* ``graduated``: ``tiers``, each ``{up_to = N, unit_price = "..."}``, the last with no
  ``up_to`` (unbounded); each unit is priced at the tier it falls in (units
  ``1..up_to[0]`` at the first tier's price, the next ones at the second's, ...);
* ``volume``: the same ``tiers``; *every* unit is priced at the tier the total reaches
  (the first whose ``up_to`` is at or above ``Q``; ``up_to`` is inclusive, as Stripe's);
* ``package``: blocks of ``package_size`` units, a started block counting whole, at
  ``unit_price`` per block (``per`` does not apply: it must be 1).

Each model takes an optional ``flat_fee`` (major units) per line and period, charged
when the line's quantity becomes more than 0: ``f(0) = 0`` and every ``f(Q > 0)``
includes the fee, so a period without usage costs nothing and the record that starts
the period's usage carries the fee. A per-unit price with a fee is priced by the line
too (it is not linear).

Limits: at most ``MAX_TIERS`` (32) tiers; tier bounds are whole numbers from 1 to
10^30, strictly increasing; prices and fees are numbers >= 0 whose rate terminates
(exact in 38 digits for one unit). A volume price can make a record's amount negative
(the total moves to a cheaper tier): see ``docs/concepts/money.md``. A price file is
checked whole, and every problem is listed, not only the first.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

from domain.errors import InvalidUsage, PriceListError, UnknownMeter
from domain.money import (
    CURRENCY_EXPONENTS,
    MAX_LINE_MINOR,
    add_quantity,
    canonical,
    check_currency,
    check_increment,
    exact_minor,
    line_add,
    line_minor,
    line_product,
)

__all__ = ["MAX_TIERS", "MAX_TIER_BOUND", "MODELS", "Price", "PriceList", "Tier"]

MODELS = ("per_unit", "graduated", "volume", "package")
MAX_TIERS = 32
MAX_TIER_BOUND = 10**30  # a usage quantity has at most 30 digits
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Tier:
    """One tier of a graduated or volume price: units up to ``up_to`` (inclusive; None:
    unbounded, the last tier) at ``unit_price`` per ``per`` units."""

    up_to: int | None
    unit_price: Decimal


@dataclass(frozen=True)
class Price:
    """The price of one meter: its model and its numbers (see the module docstring).
    ``unit_price`` of a tiered price is its first tier's (informative)."""

    unit_price: Decimal
    currency: str
    per: int = 1
    model: str = "per_unit"
    tiers: tuple[Tier, ...] = ()
    package_size: int = 1
    flat_fee: Decimal = _ZERO  # major units, per line and period
    # Whether a record's amount depends on what its line holds (every model but a
    # per-unit price without a fee): an attribute, read once per record by ingest.
    by_line: bool = field(init=False, repr=False, compare=False)
    # f's pieces in minor units, computed once (``_Plan``); None when a rate does not
    # terminate (a price file refuses it: ``_unpriceable``).
    _plan: _Plan | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_line", self.model != "per_unit" or bool(self.flat_fee))
        object.__setattr__(self, "_plan", _Plan.of(self))

    def exact_amount(self, quantity: Decimal) -> Decimal:
        """The exact amount, in minor units, of ``quantity`` of this meter priced alone
        (a per-unit price; InvalidUsage when it is out of bounds: see ``domain.money``)."""
        return exact_minor(quantity, self.unit_price, self.per, self.currency)

    def total(self, quantity: Decimal) -> Decimal:
        """``f(quantity)``: a line holding ``quantity`` of this meter in one period, exact
        minor units (InvalidUsage when it is not exact or beyond a line's bound)."""
        if quantity <= 0:
            return _ZERO
        plan = self._plan
        if plan is None:  # a rate that does not terminate: say so as a record would
            raise InvalidUsage(f"amount_not_exact: {self.model} price of {quantity}")
        total = plan.base(quantity)
        if plan.fee:
            total = line_add(total, plan.fee)
        if total >= MAX_LINE_MINOR:
            raise InvalidUsage(
                f"amount_too_large: a line total of {canonical(total):f} minor units of"
                f" {self.currency} is not below {MAX_LINE_MINOR:f}"
            )
        return total

    def increment(self, before: Decimal, quantity: Decimal) -> Decimal:
        """What ``quantity`` adds to a line holding ``before``: the record's exact amount
        (negative when a volume price drops to a cheaper tier)."""
        return self.step(before, self.total(before), quantity)[2]

    def step(
        self, before: Decimal, before_total: Decimal, quantity: Decimal
    ) -> tuple[Decimal, Decimal, Decimal]:
        """A line holding ``before`` (whose ``f`` is ``before_total``) takes ``quantity``:
        its quantity and total after, and the record's exact amount (``increment``
        without computing ``f(before)`` again: ingest keeps each line's running total)."""
        after = add_quantity(before, quantity)
        after_total = self.total(after)
        return (
            after,
            after_total,
            check_increment(line_add(after_total, -before_total), self.currency),
        )

    def tier_reached(self, quantity: Decimal) -> int | None:
        """The tier (1, 2, ...) a line holding ``quantity`` has reached; None without tiers
        or usage."""
        if not self.tiers or quantity <= 0:
            return None
        for number, tier in enumerate(self.tiers, 1):
            if tier.up_to is None or quantity <= tier.up_to:
                return number
        return len(self.tiers)  # pragma: no cover (the last tier is unbounded)

    def rate_at(self, quantity: Decimal) -> Decimal:
        """The unit price of the tier ``quantity`` reaches (the price itself without
        tiers): what a tiered record's ``Metered`` names as its unit price."""
        reached = self.tier_reached(quantity)
        return self.unit_price if reached is None else self.tiers[reached - 1].unit_price

    def to_spec(self) -> dict[str, Any]:
        """The price as a ``[meters.NAME]`` table (prices as decimal text); a per-unit
        price without a fee is written as it always was."""
        spec: dict[str, Any] = {"per": self.per, "currency": self.currency}
        if self.model in ("per_unit", "package"):
            spec = {"unit_price": str(self.unit_price), **spec}
        if self.model != "per_unit":
            spec["model"] = self.model
        if self.tiers:
            spec["tiers"] = [
                {"unit_price": str(t.unit_price)}
                if t.up_to is None
                else {"up_to": t.up_to, "unit_price": str(t.unit_price)}
                for t in self.tiers
            ]
        if self.model == "package":
            spec["package_size"] = self.package_size
        if self.flat_fee:
            spec["flat_fee"] = str(self.flat_fee)
        return spec

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Price:
        """A price as a price book stored it (``to_spec``), not checked again: a version
        loads as it was published, whatever the rules are now."""
        tiers = tuple(Tier(t.get("up_to"), Decimal(t["unit_price"])) for t in spec.get("tiers", ()))
        unit_price = Decimal(spec["unit_price"]) if "unit_price" in spec else tiers[0].unit_price
        return cls(
            unit_price,
            spec["currency"],
            spec["per"],
            spec.get("model", "per_unit"),
            tiers,
            spec.get("package_size", 1),
            Decimal(spec.get("flat_fee", "0")),
        )


@dataclass(frozen=True)
class PriceList:
    """Prices by meter name."""

    prices: dict[str, Price]

    def price_of(self, meter: str) -> Price:
        """The price of ``meter``, or UnknownMeter."""
        try:
            return self.prices[meter]
        except KeyError:
            raise UnknownMeter(f"unknown meter {meter!r}") from None

    @classmethod
    def from_toml(cls, text: str) -> PriceList:
        """Parse a price list (see ``infra/prices.example.toml`` for the format)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PriceListError(f"price list is not valid TOML: {exc}") from None
        return cls.from_meters(data.get("meters"))

    @classmethod
    def from_meters(cls, meters: Any) -> PriceList:
        """The ``[meters]`` table of a price list, checked by the same rules as a file
        (``to_meters`` gives it back: a price book stores a version so)."""
        if not isinstance(meters, Mapping) or not meters:
            raise PriceListError("price list has no [meters.NAME] tables")
        prices: dict[str, Price] = {}
        problems: list[str] = []
        for name, spec in meters.items():
            price, found = _parse_price(name, spec)
            problems += found
            if price is not None:
                prices[name] = price
        if problems:  # every problem of the whole file, not only the first
            raise PriceListError("; ".join(problems))
        return cls(prices)

    def to_meters(self) -> dict[str, dict[str, Any]]:
        """The prices as a ``[meters]`` table: prices as decimal text."""
        return {name: p.to_spec() for name, p in self.prices.items()}


@dataclass(frozen=True, slots=True)
class _Plan:
    """``f`` of one price as numbers in minor units, computed once: per tier its upper
    bound (None: unbounded), its lower bound, its rate per unit and (graduated) the cost
    of every unit below it; the fee. ``f(Q)`` is then one multiplication."""

    model: str
    tiers: tuple[tuple[Decimal | None, Decimal, Decimal, Decimal], ...]
    fee: Decimal
    package_size: int

    @classmethod
    def of(cls, price: Price) -> _Plan | None:
        try:
            fee = line_minor(Decimal(1), price.flat_fee, 1, price.currency)
            if price.model == "package":
                block = line_minor(Decimal(1), price.unit_price, 1, price.currency)
                return cls(price.model, ((None, _ZERO, block, _ZERO),), fee, price.package_size)
            tiers = price.tiers or (Tier(None, price.unit_price),)
            rows: list[tuple[Decimal | None, Decimal, Decimal, Decimal]] = []
            lower, cost = _ZERO, _ZERO
            for tier in tiers:
                rate = line_minor(Decimal(1), tier.unit_price, price.per, price.currency)
                upper = None if tier.up_to is None else Decimal(tier.up_to)
                rows.append((upper, lower, rate, cost))
                if upper is not None:
                    cost = line_add(cost, line_product(line_add(upper, -lower), rate))
                    lower = upper
            return cls(price.model, tuple(rows), fee, price.package_size)
        except (InvalidUsage, KeyError):  # a rate that does not terminate, a currency unknown
            return None

    def base(self, quantity: Decimal) -> Decimal:
        """``f(quantity)`` without the fee (``quantity`` > 0)."""
        if self.model == "package":
            blocks = _blocks(quantity, self.package_size)
            return line_product(blocks, self.tiers[0][2])
        for upper, lower, rate, cost in self.tiers:
            if upper is None or quantity <= upper:
                if self.model == "graduated":
                    return line_add(cost, line_product(line_add(quantity, -lower), rate))
                return line_product(quantity, rate)  # volume, per unit: every unit at it
        raise AssertionError("the last tier is unbounded")  # pragma: no cover


def _blocks(quantity: Decimal, size: int) -> Decimal:
    """How many blocks of ``size`` hold ``quantity`` (a started one counts whole)."""
    try:
        with localcontext(prec=60):  # a line's quantity has up to 60 digits
            blocks, rest = divmod(quantity, size)
    except InvalidOperation:
        raise InvalidUsage(f"quantity_too_large: {quantity} in blocks of {size}") from None
    return blocks + 1 if rest else blocks


def _parse_price(name: str, spec: Any) -> tuple[Price | None, list[str]]:
    """The price ``spec`` describes, or None, and every problem found in it (each
    ``meter 'NAME': ...``)."""
    if not isinstance(spec, Mapping):
        return None, [f"meter {name!r}: expected a table"]
    problems: list[str] = []
    model = spec.get("model", "per_unit")
    if model not in MODELS:
        problems.append(f"unknown model {model!r} (one of {', '.join(MODELS)})")
    currency = _currency(spec, problems)
    per = spec.get("per", 1)
    if type(per) is not int or per <= 0:
        problems.append(f"per must be a whole number above 0, got {per!r}")
        per = 1
    elif model == "package" and per != 1:
        problems.append("per does not apply to a package price (unit_price is per block)")
    tiers = _tiers(spec, model, problems)
    unit_price = _unit_price(spec, model, tiers, problems)
    size = spec.get("package_size", 1)
    if "package_size" in spec and model != "package":
        problems.append(f"package_size applies to model 'package' only, not {model!r}")
    elif type(size) is not int or size <= 0:
        problems.append(f"package_size must be a whole number above 0, got {size!r}")
        size = 1
    fee = _amount(spec, "flat_fee", problems) if "flat_fee" in spec else _ZERO
    if problems or currency is None or unit_price is None:
        return None, [f"meter {name!r}: {p}" for p in problems]
    price = Price(unit_price, currency, per, model, tiers, size, fee or _ZERO)
    return price, [f"meter {name!r}: {p}" for p in _unpriceable(price)]


def _currency(spec: Mapping[str, Any], problems: list[str]) -> str | None:
    if "currency" not in spec:
        problems.append("missing 'currency'")
        return None
    try:
        return check_currency(str(spec["currency"]))
    except InvalidUsage as exc:
        problems.append(str(exc))
        return None


def _amount(spec: Mapping[str, Any], key: str, problems: list[str], where: str = "") -> Decimal:
    """``spec[key]`` as a Decimal >= 0 (0, and a problem, when it is not)."""
    try:
        value = Decimal(str(spec[key]))
    except (InvalidOperation, ValueError):
        value = Decimal("NaN")
    if not value.is_finite() or value < 0:
        problems.append(f"{where}{key} must be a number >= 0, got {spec[key]!r}")
        return _ZERO
    return value


def _unit_price(
    spec: Mapping[str, Any], model: str, tiers: tuple[Tier, ...], problems: list[str]
) -> Decimal | None:
    if model in ("graduated", "volume"):
        if "unit_price" in spec:
            problems.append(f"a {model} price has its unit_price per tier, not beside them")
        return tiers[0].unit_price if tiers else _ZERO
    if "unit_price" not in spec:
        problems.append("missing 'unit_price'")
        return None
    return _amount(spec, "unit_price", problems)


def _tiers(spec: Mapping[str, Any], model: str, problems: list[str]) -> tuple[Tier, ...]:
    """The tiers of a graduated or volume price, each problem of them in ``problems``."""
    raw = spec.get("tiers")
    if model not in ("graduated", "volume"):
        if raw is not None:
            problems.append(f"tiers apply to models 'graduated' and 'volume', not {model!r}")
        return ()
    if not isinstance(raw, list) or not raw:
        problems.append(f"a {model} price needs tiers = [{{up_to = N, unit_price = ...}}, ...]")
        return ()
    if len(raw) > MAX_TIERS:
        problems.append(f"{len(raw)} tiers: at most {MAX_TIERS}")
    tiers: list[Tier] = []
    below = 0
    for number, tier in enumerate(raw, 1):
        where = f"tier {number}: "
        if not isinstance(tier, Mapping) or "unit_price" not in tier:
            problems.append(f"{where}expected {{up_to = N, unit_price = ...}}")
            continue
        price = _amount(tier, "unit_price", problems, where)
        up_to = tier.get("up_to")
        last = number == len(raw)
        if up_to is None and not last:
            problems.append(f"{where}only the last tier is unbounded (give up_to)")
        elif up_to is not None and last:
            problems.append(f"{where}the last tier must be unbounded (no up_to), got {up_to!r}")
        elif up_to is not None and (type(up_to) is not int or not 0 < up_to <= MAX_TIER_BOUND):
            problems.append(f"{where}up_to must be a whole number from 1 to 10^30, got {up_to!r}")
        elif up_to is not None and up_to <= below:
            problems.append(
                f"{where}up_to {up_to} is not above the tier before's {below}"
                " (bounds must increase: overlapping, out of order or duplicate)"
            )
        elif up_to is not None:
            below = up_to
        tiers.append(Tier(None if last else up_to, price))
    return tuple(tiers)


def _unpriceable(price: Price) -> list[str]:
    """Each rate of ``price`` that does not terminate (one unit cannot be priced)."""
    problems: list[str] = []
    rates = [(f"tier {n}: ", t.unit_price) for n, t in enumerate(price.tiers, 1)]
    rates = rates or [("", price.unit_price)]
    for where, rate in rates:
        try:
            exact_minor(Decimal(1), rate, price.per, price.currency)
        except InvalidUsage as exc:
            problems.append(f"{where}one unit cannot be priced: {exc}")
    if price.flat_fee:
        scaled = price.flat_fee.scaleb(CURRENCY_EXPONENTS[price.currency])
        if scaled >= Decimal(10) ** 12:
            problems.append(f"flat_fee {price.flat_fee} is not below the transaction ceiling")
    return problems
