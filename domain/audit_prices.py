"""The audit of prices (DESIGN I12): every amount recomputed from the version that priced it.

A ``Metered`` event names the price book version that priced it (``domain.price_book``).
The audit folds the book's ``Published`` events into the versions they hold (as stored:
each a price file's ``[meters]`` table) and recomputes every transaction's exact amount
from the version it names: quantity x that version's price of its meter, exact, in its
currency. A version that does not exist, a meter or currency it does not price, and an
amount other than its price x quantity are findings (kind ``price``); so is a version
published after the transaction was recorded (its ``Published`` after the ``Metered`` in
the log: a worker prices only by versions it has read), but for the initial version,
which workers name before ``migrate`` starts the book.

**Contracts.** A ``Metered`` that names a contract version (``domain.contract``) is
recomputed from that version's override of its meter applied to the list price of the
book version it names (a discount is off that list price). A contract version that does
not exist (forged, or of another customer), one that does not override the meter, and one
set after the transaction was recorded are findings of kind ``price`` too. A ``Metered``
naming no contract version is checked against the list price: a worker that had not yet
read a contract set moments before prices by the list, as it would for a price book
version, so naming none is not a finding.

Metered events recorded before price books existed (stored ``class_version`` 1 or 2)
name no version in what was stored; they load naming the initial version, but the
audit does not check them against it: they were priced by the price file configured
when they were recorded, which the ledger did not record, and version 1 is the file
configured when the book was started (the same one unless it was changed in between).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from domain.audit import Finding, TxnAudit
from domain.contract import stored_overrides
from domain.errors import InvalidUsage
from domain.ids import contract_id
from domain.money import format_money
from domain.price_book import INITIAL_VERSION
from domain.pricing import Price

__all__ = ["ContractVersions", "PriceVersions", "check_prices"]

PriceVersions = Mapping[tuple[str | None, int], Mapping[str, Any]]
"""The book's versions as stored: (book id, version number) -> its ``[meters]`` table."""
ContractVersions = Mapping[tuple[str, int], Mapping[str, Any]]
"""Contract versions as stored: (contract id, number) -> its ``Set`` event's fields."""


def check_prices(
    txns: Iterable[TxnAudit], versions: PriceVersions, contracts: ContractVersions | None = None
) -> list[Finding]:
    """A finding for each transaction whose amount is not what the version (and contract
    version) it names prices (see the module docstring)."""
    prices = {
        (number, meter): Price(Decimal(spec["unit_price"]), spec["currency"], spec["per"])
        for number, meters in versions.items()
        for meter, spec in meters.items()
    }  # each price parsed once: an audit checks millions of transactions
    findings: list[Finding] = []
    for txn in txns:
        if txn.priced_by is None:  # recorded before price books
            continue
        price = prices.get((txn.priced_by, txn.meter))
        problem: str | None
        if price is None:
            problem = _unpriced(txn, txn.priced_by, versions)
        elif txn.before_its_version and txn.priced_by[1] != INITIAL_VERSION:
            problem = f"priced by {_named(txn.priced_by)}, published after it was recorded"
        elif txn.contract_version is not None:
            problem = _contract_problem(txn, txn.priced_by, price, contracts or {})
        else:
            problem = _amount_problem(txn, txn.priced_by, price)
        if problem is not None:
            findings.append(Finding("price", txn.transaction_id, problem))
    return findings


def _contract_problem(
    txn: TxnAudit, priced_by: tuple[str | None, int], listed: Price, contracts: ContractVersions
) -> str | None:
    number = txn.contract_version
    named = f"contract version {number} of {txn.customer_id}"
    stored = contracts.get((str(contract_id(txn.customer_id)), number or 0))
    if stored is None:
        return f"priced by {named}, which does not exist"
    if txn.before_its_contract:
        return f"priced by {named}, set after it was recorded"
    spec = stored["meters"].get(txn.meter)
    if spec is None:
        return f"priced by {named}, which does not override meter {txn.meter!r}"
    try:
        price = stored_overrides({txn.meter: spec})[txn.meter].applied_to(listed)
    except InvalidUsage as exc:
        return f"{named} cannot price {txn.meter!r}: {exc}"
    return _amount_problem(txn, priced_by, price, f"{named} (on {_named(priced_by)})")


def _named(priced_by: tuple[str | None, int]) -> str:
    return f"price book {priced_by[0]} version {priced_by[1]}"


def _unpriced(txn: TxnAudit, priced_by: tuple[str | None, int], versions: PriceVersions) -> str:
    if priced_by not in versions:
        return f"priced by {_named(priced_by)}, which does not exist"
    return f"priced by {_named(priced_by)}, which has no price for meter {txn.meter!r}"


def _amount_problem(
    txn: TxnAudit, priced_by: tuple[str | None, int], price: Price, named: str | None = None
) -> str | None:
    named = named or _named(priced_by)
    if price.currency != txn.currency:
        return f"in {txn.currency}, but {named} prices {txn.meter!r} in {price.currency}"
    try:
        expected = price.exact_amount(Decimal(txn.quantity))
    except InvalidUsage as exc:
        return f"{named} cannot price {txn.quantity} of {txn.meter!r}: {exc}"
    if expected != txn.amount:
        return (
            f"amount {format_money(txn.amount, txn.currency)}, but {named} prices"
            f" {txn.quantity} of {txn.meter!r} at {format_money(expected, txn.currency)}"
        )
    return None
