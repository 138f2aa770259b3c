"""``billing-ledger contracts``: per-customer contracts (``domain.contract``) — set a contract
file as the customer's next version, show the version in force at a moment.

A contract version prices the customer's usage *recorded after it is set* whose time is at
or after its ``effective_from``, from the ingest workers' next batch, without a restart;
usage already recorded keeps the price its ``Metered`` event names.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.cli.args import EXIT_USAGE, CliError, Parser, read_file
from adapters.cli.output import print_table

if TYPE_CHECKING:
    from domain.contract import ContractVersion
    from domain.price_book import PriceVersion

__all__ = ["add_commands", "customer_arg", "customer_price_rows", "zoned_timestamp"]


def zoned_timestamp(text: str) -> datetime:
    """An ISO 8601 instant that names its time zone (``2027-01-01T00:00:00Z``)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 timestamp") from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone: give one (2027-01-01T00:00:00Z)"
        )
    return value


def customer_arg(text: str) -> str:
    """A valid customer id (the rule of usage records)."""
    from projections.base import InvalidFilter, check_customer

    try:
        checked = check_customer(text)
    except InvalidFilter as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert checked is not None
    return checked


def add_commands(sub: Any) -> None:
    contracts = sub.add_parser(
        "contracts",
        help="per-customer contracts: price overrides, discounts and minimums",
        description="A customer's contract overrides list prices of any meters (a"
        " replacement price or a percentage discount) and may set a minimum per billing"
        " period; each version is in force from its moment.",
    )
    cmds = contracts.add_subparsers(dest="contracts_command", required=True, parser_class=Parser)
    set_ = cmds.add_parser(
        "set",
        help="set a contract file as the customer's next version (nothing recorded on error)",
        description="Set a contract file (TOML: [meters.NAME] tables with a price or a"
        " discount, an optional [minimum] table) as the customer's next contract version."
        " It is checked whole against the price book version in force at --effective-from;"
        " every problem is listed and nothing is recorded when there is one.",
    )
    set_.add_argument("--customer", required=True, type=customer_arg, help="the customer id")
    set_.add_argument("file", type=Path, help="the contract file (TOML)")
    set_.add_argument(
        "--effective-from",
        type=zoned_timestamp,
        help="the instant it takes effect (ISO 8601 with a time zone; default: now)",
    )
    set_.set_defaults(handler=_set)
    show = cmds.add_parser("show", help="the customer's contract version in force at a moment")
    show.add_argument("--customer", required=True, type=customer_arg, help="the customer id")
    show.add_argument(
        "--at", type=zoned_timestamp, help="the moment (ISO 8601 with a time zone; default: now)"
    )
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_show)


def _set(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.contract import ContractError, ContractTerms

    file: Path = args.file
    text = read_file(file, "contract file")
    effective_from: datetime = args.effective_from or datetime.now(UTC)
    with open_ledger(Settings()) as ledger:
        book = ledger.price_book()
        schedule = book.schedule if book is not None else ledger.configured
        listed = schedule.price_at(effective_from.astimezone(UTC))
        try:
            terms = ContractTerms.from_toml(text, listed.prices)
            version = ledger.set_contract(args.customer, terms, effective_from)
        except ContractError as exc:
            raise CliError(
                f"{file}: {len(exc.problems)} problem(s): {exc}; nothing was recorded", EXIT_USAGE
            ) from None
    print(
        f"set contract version {version.number} of {args.customer}, in force from"
        f" {version.effective_from.isoformat()} ({len(version.overrides)} meters overridden,"
        f" {len(version.minimums) + sum(map(len, version.meter_minimums.values()))} minimums)"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import format_money

    with open_ledger(Settings()) as ledger:
        contract = ledger.contract(args.customer)
    at: datetime = args.at or datetime.now(UTC)
    version = contract.schedule.at(at) if contract is not None else None
    if version is None:
        raise CliError(
            f"customer {args.customer} has no contract in force at {at.isoformat()}"
            f" ({0 if contract is None else len(contract.versions)} versions)",
            EXIT_USAGE,
        )
    if args.json:
        body = {
            "customer_id": args.customer,
            "version": version.number,
            "effective_from": version.effective_from.isoformat(),
            "meters": {m: o.to_spec() for m, o in version.overrides.items()},
            "minimum": {c: format_money(a, c) for c, a in version.minimums.items()},
            "meter_minimums": {
                m: format_money(a, c)
                for c, by_meter in version.meter_minimums.items()
                for m, a in by_meter.items()
            },
        }
        print(json.dumps(body, indent=2))
        return 0
    print(
        f"contract version {version.number} of {args.customer}, in force from"
        f" {version.effective_from.isoformat()}"
    )
    rows = [
        {"meter": m, "override": _override_text(o.to_spec())}
        for m, o in sorted(version.overrides.items())
    ]
    print_table(rows, ["meter", "override"])
    for currency, amount in sorted(version.minimums.items()):
        print(f"minimum per period: {format_money(amount, currency)}")
    for currency, by_meter in sorted(version.meter_minimums.items()):
        for meter, amount in sorted(by_meter.items()):
            print(f"minimum per period of {meter}: {format_money(amount, currency)}")
    return 0


def _override_text(spec: dict[str, Any]) -> str:
    if "discount" in spec:
        return f"{spec['discount']}% off the list price"
    return f"{spec['unit_price']} {spec['currency']} per {spec['per']:,}"


def customer_price_rows(
    listed: PriceVersion, contract: ContractVersion | None
) -> list[dict[str, str]]:
    """Each meter's price the customer pays under ``listed`` and ``contract``: ``prices
    show --customer``."""
    from domain.errors import InvalidUsage
    from domain.money import CURRENCY_EXPONENTS, format_money

    rows = []
    for name, price in sorted(listed.prices.prices.items()):
        source = "list"
        paid = price
        if contract is not None:
            try:
                special = contract.price_of(name, price)
            except InvalidUsage as exc:
                special, source = None, f"contract v{contract.number} cannot price it: {exc}"
            if special is not None:
                paid, source = special, f"contract v{contract.number}"
        rows.append({
            "meter": name,
            "price": format_money(
                paid.unit_price.scaleb(CURRENCY_EXPONENTS.get(paid.currency, 2)), paid.currency
            ),
            "per": f"{paid.per:,}",
            "source": source,
        })  # fmt: skip
    return rows
