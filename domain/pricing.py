"""The price list: meter name -> unit price, and pricing of one usage quantity.

A price is given in *major* units of its currency per ``per`` units of the meter
(``2.50`` USD per 1,000,000 input tokens), because that is how AI products publish
prices. The amount of a transaction is ``quantity * unit_price / per`` computed
exactly in ``Decimal`` and rounded once to minor units (see ``domain.money``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from domain.errors import InvalidUsage, PriceListError, UnknownMeter
from domain.money import check_currency, exact_arithmetic, to_minor_units

__all__ = ["Price", "PriceList"]


@dataclass(frozen=True)
class Price:
    """The price of one meter."""

    unit_price: Decimal
    currency: str
    per: int = 1

    def amount_minor(self, quantity: Decimal) -> int:
        """The rounded amount, in minor units, for ``quantity`` of this meter."""
        with exact_arithmetic():
            return to_minor_units(quantity * self.unit_price / self.per, self.currency)


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
        meters = data.get("meters")
        if not isinstance(meters, dict) or not meters:
            raise PriceListError("price list has no [meters.NAME] tables")
        return cls({name: _parse_price(name, spec) for name, spec in meters.items()})


def _parse_price(name: str, spec: Any) -> Price:
    if not isinstance(spec, dict):
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
    return Price(unit_price=unit_price, currency=currency, per=per)
