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

**Prices by line quantity** (``domain.pricing``: tiers, packages, a flat fee) are checked
on their lines (``check_line_prices``): each such line's key names the version that
prices it; every record on it names that version; each record's amount is what it
added to ``f(quantity)`` in settlement order (``Price.increment``); and the line's total
is ``f`` of its total quantity, less what removals took back. Their transactions are
not checked one by one as a per-unit amount (their amount is not ``quantity x price``).

Metered events recorded before price books existed (stored ``class_version`` 1 or 2)
name no version in what was stored; they load naming the initial version, but the
audit does not check them against it: they were priced by the price file configured
when they were recorded, which the ledger did not record, and version 1 is the file
configured when the book was started (the same one unless it was changed in between).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from decimal import Decimal, localcontext
from typing import Any

from domain.audit import Finding, TxnAudit
from domain.audit_lines import LineAudit
from domain.contract import stored_overrides
from domain.errors import InvalidUsage
from domain.ids import contract_id
from domain.money import format_money
from domain.price_book import INITIAL_VERSION, PRICE_BOOK_ID
from domain.pricing import Price

__all__ = ["ContractVersions", "PriceVersions", "check_line_prices", "check_prices"]

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
        (number, meter): Price.from_spec(spec)
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
        elif price.by_line:  # checked on its line: check_line_prices
            problem = _currency_problem(txn, txn.priced_by, price)
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


def _currency_problem(
    txn: TxnAudit, priced_by: tuple[str | None, int], price: Price, named: str | None = None
) -> str | None:
    named = named or _named(priced_by)
    if price.currency != txn.currency:
        return f"in {txn.currency}, but {named} prices {txn.meter!r} in {price.currency}"
    return None


def _amount_problem(
    txn: TxnAudit, priced_by: tuple[str | None, int], price: Price, named: str | None = None
) -> str | None:
    named = named or _named(priced_by)
    problem = _currency_problem(txn, priced_by, price, named)
    if problem is not None:
        return problem
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


def check_line_prices(
    lines: Mapping[str, LineAudit], txns: Mapping[str, TxnAudit], versions: PriceVersions
) -> list[Finding]:
    """A finding (kind ``price``) for each record of a line priced by quantity whose
    amount is not its increment in settlement order, each record naming another version
    than its line, and each such line whose total is not ``f`` of its quantity (less
    what removals took back); and for a record priced by quantity on a per-unit line."""
    book = str(PRICE_BOOK_ID)
    by_line = {
        (number, meter)
        for number, meters in versions.items()
        for meter, spec in meters.items()
        if Price.from_spec(spec).by_line
    }
    findings: list[Finding] = []
    for line in lines.values():
        if line.price_version is None:
            if by_line:
                findings += _by_line_on_per_unit(line, txns, by_line)
            continue
        spec = versions.get((book, line.price_version), {}).get(line.meter)
        if spec is None:
            named = _named((book, line.price_version))
            why = f"priced by {named}, which has no price for meter {line.meter!r}"
            findings.append(Finding("price", line.line_id, why))
            continue
        findings += _line_problems(line, Price.from_spec(spec), txns)
    return findings


def _line_problems(line: LineAudit, price: Price, txns: Mapping[str, TxnAudit]) -> list[Finding]:
    with localcontext(prec=80):  # a line's quantity has up to 60 digits
        return _walk(line, price, txns)


def _walk(line: LineAudit, price: Price, txns: Mapping[str, TxnAudit]) -> list[Finding]:
    found: list[Finding] = []
    before = Decimal(0)
    try:
        for txn_id, quantity, amount in line.settled:
            txn = txns.get(txn_id)
            named = txn.priced_by[1] if txn is not None and txn.priced_by else None
            if named is not None and named != line.price_version:
                why = f"priced by version {named}, on a line of version {line.price_version}"
                found.append(Finding("price", txn_id, why))
            expected = price.increment(before, quantity)
            if expected != amount:
                why = (
                    f"added {_money(amount, line)} to line {line.line_id} at quantity"
                    f" {before}; its increment there is {_money(expected, line)}"
                )
                found.append(Finding("price", txn_id, why))
            before += quantity
        expected_total = price.total(line.quantity) - line.removed
    except InvalidUsage as exc:
        return [*found, Finding("price", line.line_id, f"cannot be priced: {exc}")]
    shown = (line.model, line.tier)
    if shown != (price.model, price.tier_reached(line.quantity)):
        why = (
            f"records model {line.model}, tier {line.tier}; its version prices it"
            f" {price.model}, tier {price.tier_reached(line.quantity)} at {line.quantity}"
        )
        found.append(Finding("price", line.line_id, why))
    if expected_total != line.exact_total:
        why = (
            f"totals {_money(line.exact_total, line)}; f({line.quantity}) less removals is"
            f" {_money(expected_total, line)}"
        )
        found.append(Finding("price", line.line_id, why))
    return found


def _money(amount: Decimal, line: LineAudit) -> str:
    return format_money(amount, line.currency)


def _by_line_on_per_unit(
    line: LineAudit, txns: Mapping[str, TxnAudit], by_line: Container[tuple[Any, str]]
) -> list[Finding]:
    found: list[Finding] = []
    for txn_id in line.members:
        txn = txns.get(txn_id)
        if txn is not None and (txn.priced_by, txn.meter) in by_line:
            why = f"priced by quantity, on per-unit line {line.line_id}"
            found.append(Finding("price", txn_id, why))
    return found
