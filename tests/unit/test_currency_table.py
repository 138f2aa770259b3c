"""Every currency the ledger accepts has its ISO 4217 minor unit, written out here.

The table below is copied from ISO 4217 (the "minor unit" column of the list of
currencies), not from ``domain.money``: an exponent changed in the code (GBP 2 -> 3
would bill a thousand times too little) fails here, and so does a currency added to
the code without being checked against the standard.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from domain.money import CURRENCY_EXPONENTS, exact_minor, format_money, to_minor_units

ISO_4217_MINOR_UNIT = {
    "AUD": 2,  # Australian dollar
    "BHD": 3,  # Bahraini dinar
    "BRL": 2,  # Brazilian real
    "CAD": 2,  # Canadian dollar
    "CHF": 2,  # Swiss franc
    "CNY": 2,  # Yuan renminbi
    "CZK": 2,  # Czech koruna
    "DKK": 2,  # Danish krone
    "EUR": 2,  # Euro
    "GBP": 2,  # Pound sterling
    "HKD": 2,  # Hong Kong dollar
    "HUF": 2,  # Forint
    "IDR": 2,  # Rupiah
    "ILS": 2,  # New Israeli sheqel
    "INR": 2,  # Indian rupee
    "JOD": 3,  # Jordanian dinar
    "JPY": 0,  # Yen
    "KRW": 0,  # Won
    "KWD": 3,  # Kuwaiti dinar
    "MXN": 2,  # Mexican peso
    "NOK": 2,  # Norwegian krone
    "NZD": 2,  # New Zealand dollar
    "PLN": 2,  # Zloty
    "SEK": 2,  # Swedish krona
    "SGD": 2,  # Singapore dollar
    "THB": 2,  # Baht
    "TRY": 2,  # Turkish lira
    "TWD": 2,  # New Taiwan dollar
    "USD": 2,  # US dollar
    "ZAR": 2,  # Rand
}


def test_the_ledger_accepts_exactly_the_currencies_of_the_table() -> None:
    assert sorted(CURRENCY_EXPONENTS) == sorted(ISO_4217_MINOR_UNIT)


@pytest.mark.parametrize(("code", "exponent"), sorted(ISO_4217_MINOR_UNIT.items()))
def test_each_currency_has_its_iso_4217_minor_unit(code: str, exponent: int) -> None:
    assert CURRENCY_EXPONENTS[code] == exponent
    # and the conversions use it: one major unit is 10**exponent minor units
    assert to_minor_units(Decimal(1), code) == 10**exponent
    assert exact_minor(Decimal(3), Decimal("1.5"), 1, code) == Decimal("4.5") * 10**exponent
    shown = {0: "5", 2: "4.50", 3: "4.500"}[exponent]  # 4.5 yen round half up to 5
    assert format_money(to_minor_units(Decimal("4.5"), code), code) == f"{shown} {code}"
