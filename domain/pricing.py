"""The price list: meter name -> unit price, and pricing of one usage quantity.

A price is given in *major* units of its currency per ``per`` units of the meter
(``2.50`` USD per 1,000,000 input tokens), because that is how AI products publish
prices. The amount of a transaction is ``quantity * unit_price / per`` in minor units,
exact (``domain.money.exact_minor``): never rounded here; an invoice line rounds its
sum once. A price list whose rate does not terminate as a decimal (``per = 3``) is
refused when it is loaded, not record by record.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from domain.errors import InvalidUsage, PriceListError, UnknownMeter
from domain.money import check_currency, exact_minor

__all__ = ["Price", "PriceList"]


@dataclass(frozen=True)
class Price:
    """The price of one meter."""

    unit_price: Decimal
    currency: str
    per: int = 1

    def exact_amount(self, quantity: Decimal) -> Decimal:
        """The exact amount, in minor units, of ``quantity`` of this meter (InvalidUsage
        when it is out of bounds: see ``domain.money``)."""
        return exact_minor(quantity, self.unit_price, self.per, self.currency)


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
        return cls({name: _parse_price(name, spec) for name, spec in meters.items()})

    def to_meters(self) -> dict[str, dict[str, Any]]:
        """The prices as a ``[meters]`` table: the unit price as decimal text."""
        return {
            name: {"unit_price": str(p.unit_price), "per": p.per, "currency": p.currency}
            for name, p in self.prices.items()
        }


def _parse_price(name: str, spec: Any) -> Price:
    if not isinstance(spec, Mapping):
        raise PriceListError(f"meter {name!r}: expected a table")
    try:
        unit_price = Decimal(str(spec["unit_price"]))
        currency = check_currency(str(spec["currency"]))
        per = spec.get("per", 1)
    except KeyError as exc:
        raise PriceListError(f"meter {name!r}: missing {exc.args[0]!r}") from None
    except (InvalidOperation, ValueError, InvalidUsage) as exc:
        raise PriceListError(f"meter {name!r}: {exc}") from None
    if type(per) is not int or per <= 0:
        raise PriceListError(f"meter {name!r}: per must be a whole number above 0, got {per!r}")
    if not unit_price.is_finite() or unit_price < 0:
        raise PriceListError(f"meter {name!r}: unit_price must be a number >= 0")
    price = Price(unit_price=unit_price, currency=currency, per=per)
    try:
        price.exact_amount(Decimal(1))  # the rate of one unit must be an exact decimal
    except InvalidUsage as exc:
        raise PriceListError(f"meter {name!r}: one unit cannot be priced: {exc}") from None
    return price
