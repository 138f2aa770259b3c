"""``billing-ledger prices``: the price book (``domain.price_book``) — publish a price file
as its next version, list the versions, show the one in force at a moment.

A published version is priced by the ingest workers from their next batch on, without a
restart. It prices the usage *recorded after it is published* whose time (``occurred_at``)
is at or after its ``effective_from``. Usage already recorded that it covers is
re-priced on invoices that are still drafts (``adapters.charging.repricing``: the
reconciler does it, ``publish`` with a past moment runs it at once, ``reprice`` on
demand); on finalizing or final invoices it is left alone and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.cli.args import EXIT_USAGE, CliError, Parser, positive_int, read_file, timestamp
from adapters.cli.contracts import customer_arg, customer_price_rows
from adapters.cli.output import print_table

if TYPE_CHECKING:
    from decimal import Decimal

    from adapters.charging.repricing import RepriceReport
    from domain.price_book import PriceSchedule, PriceVersion
    from domain.pricing import Price

__all__ = ["add_commands", "price_rows"]

_PUBLISH_HELP = (
    "publish a price file (the format of infra/prices.example.toml) as the price book's"
    " next version. It prices usage recorded after it is published whose occurred_at is"
    " at or after --effective-from. With an --effective-from in the past, usage already"
    " recorded that it covers is re-priced at once on invoices that are still drafts"
    " (open, or closed and not finalizing; the reconciler would do it too), and usage on"
    " finalizing or final invoices is reported and left as it is."
)
_REPRICE_HELP = (
    "re-price recorded usage that a version published for the past covers, on invoices"
    " that are still drafts (each transaction's Repriced event has its old and new exact"
    " amounts; the next push sets the line's new total in Stripe); report the usage on"
    " finalizing or final invoices, which is left as it is: a final invoice whose total"
    " would change needs attention (a credit note or billing the difference is the"
    " operator's call, recorded with `invoices settle`)."
)


def add_commands(sub: Any) -> None:
    prices = sub.add_parser(
        "prices",
        help="the price book: publish a price file as a version, list versions, show one",
        description="The price book: every price list the ledger prices usage by, as"
        " numbered versions each in force from a moment. Each usage record is priced by"
        " the version in force when it occurred, and its transaction names that version.",
    )
    cmds = prices.add_subparsers(dest="prices_command", required=True, parser_class=Parser)
    publish = cmds.add_parser(
        "publish",
        help="publish a price file as the next version (re-prices open usage it covers)",
        description=textwrap.fill(
            _PUBLISH_HELP, 88, break_on_hyphens=False
        ),  # the epilog's formatter keeps lines
    )
    publish.add_argument("file", type=Path, help="the price file (TOML: [meters.NAME] tables)")
    publish.add_argument(
        "--effective-from",
        type=timestamp,
        help="the instant it takes effect (ISO 8601; without an offset, UTC; default: now)",
    )
    publish.set_defaults(handler=_publish)
    reprice = cmds.add_parser(
        "reprice",
        help="re-price draft invoices' usage a past version covers; report final ones",
        description=textwrap.fill(_REPRICE_HELP, 88, break_on_hyphens=False),
    )
    reprice.add_argument("--dry-run", action="store_true", help="decide and report, record nothing")
    reprice.add_argument("--json", action="store_true")
    reprice.set_defaults(handler=_reprice)
    listed = cmds.add_parser("list", help="every version: number, effective from, meters")
    listed.add_argument("--json", action="store_true")
    listed.set_defaults(handler=_list)
    shown = cmds.add_parser("show", help="the prices of the version in force at a moment")
    shown.add_argument(
        "--at", type=timestamp, help="the moment (ISO 8601; default: now): its version's prices"
    )
    shown.add_argument("--version", type=positive_int, help="this version instead, by number")
    shown.add_argument(
        "--customer",
        type=customer_arg,
        help="the prices this customer pays: each meter's list or contract price, saying which",
    )
    shown.add_argument("--json", action="store_true")
    shown.set_defaults(handler=_show)


def _publish(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.errors import PriceListError
    from domain.pricing import PriceList

    file: Path = args.file
    text = read_file(file, "price file")
    effective_from: datetime = args.effective_from or datetime.now(UTC)
    try:
        prices = PriceList.from_toml(text)
    except PriceListError as exc:
        raise CliError(f"{file}: {exc}; nothing was published", EXIT_USAGE) from None
    settings = Settings()
    with open_ledger(settings) as ledger:
        version = ledger.publish_prices(prices, effective_from)
        print(
            f"published price book version {version.number}, in force from"
            f" {version.effective_from.isoformat()} ({len(prices.prices)} meters)"
        )
        if version.effective_from < datetime.now(UTC):
            print("re-pricing the recorded usage it covers ...", flush=True)
            _print_report(_run_repricing(settings, ledger, dry_run=False), dry_run=False)
    return 0


def _reprice(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings

    settings = Settings()
    with open_ledger(settings) as ledger:
        if ledger.price_book() is None:
            raise CliError(
                "the ledger has no price book yet: nothing was priced by a version to change",
                EXIT_USAGE,
            )
        report = _run_repricing(settings, ledger, dry_run=args.dry_run, quiet=args.json)
    if args.json:
        print(json.dumps(_report_json(report, dry_run=args.dry_run), indent=2))
    else:
        _print_report(report, dry_run=args.dry_run)
    return 0


def _run_repricing(
    settings: Any, ledger: Any, *, dry_run: bool, quiet: bool = False
) -> RepriceReport:
    """One whole cycle of the re-pricer, with its progress on stderr."""
    from adapters.bootstrap import database
    from adapters.charging.repricing import Repricer

    def progress(report: RepriceReport) -> None:
        if not quiet:
            print(
                f"  {report.candidates} transactions looked at, {report.transactions}"
                f" re-priced on {report.lines} lines",
                file=sys.stderr,
                flush=True,
            )

    with database(settings, pool_size=0) as db:
        return Repricer(ledger, db).run_cycle(dry_run=dry_run, progress=progress)


def _print_report(report: RepriceReport, *, dry_run: bool) -> None:
    from domain.money import format_money

    verb = "would re-price" if dry_run else "re-priced"
    changed = sum(len(d.changes) for d in report.repriced)
    print(f"{verb} {changed} transactions on {len(report.repriced)} lines of draft invoices")
    rows = [
        {
            "customer": d.customer_id,
            "meter": d.meter,
            "period": d.period.key,
            "billed_before": format_money(d.billed, d.currency),
            "billed_now": format_money(d.new_billed, d.currency),
        }
        for d in report.repriced
    ]
    if rows:
        print_table(rows, ["customer", "meter", "period", "billed_before", "billed_now"])
    if report.left:
        print(f"left alone: {len(report.left)} transactions")
        for reason, count in _reasons(report).items():
            print(f"  {count} x {reason}")
    if report.frozen:
        print(
            f"{len(report.frozen)} lines of finalizing or final invoices are left as they are"
            " (a credit note or billing the difference is the operator's call; then"
            " `billing-ledger invoices settle INVOICE --how ... --by ...`):"
        )
        print_table(
            [
                {
                    "invoice": str(f.invoice_id),
                    "stripe": f.stripe_invoice_id or "-",
                    "state": f.invoice_state,
                    "customer": f.decision.customer_id,
                    "period": f.decision.period.key,
                    "meter": f.decision.meter,
                    "ledger_billed": format_money(f.decision.billed, f.decision.currency),
                    "at_new_prices": format_money(f.decision.new_billed, f.decision.currency),
                }
                for f in report.frozen
            ],
            [
                "invoice",
                "stripe",
                "state",
                "customer",
                "period",
                "meter",
                "ledger_billed",
                "at_new_prices",
            ],
        )
    if report.raced:
        print(f"{report.raced} lines kept changing: the reconciler re-prices them later")


def _reasons(report: RepriceReport) -> dict[str, int]:
    counts: dict[str, int] = {}
    for left in report.left:
        counts[left.reason] = counts.get(left.reason, 0) + 1
    return counts


def _report_json(report: RepriceReport, *, dry_run: bool) -> dict[str, Any]:
    def line(d: Any) -> dict[str, Any]:
        return {
            "line_id": str(d.line_id),
            "customer_id": d.customer_id,
            "currency": d.currency,
            "meter": d.meter,
            "period": d.period.key,
            "billed_before": d.billed,
            "billed_now": d.new_billed,
            "exact_total_before": str(d.exact_total),
            "exact_total_now": str(d.new_exact_total),
            "transactions": [
                {
                    "transaction_id": str(c.transaction_id),
                    "old_version": c.old_version,
                    "version": c.version.number,
                    "old_amount": str(c.old_amount),
                    "amount": str(c.amount),
                }
                for c in d.changes
            ],
        }

    return {
        "dry_run": dry_run,
        "repriced": [line(d) for d in report.repriced],
        "left_alone": [
            {"transaction_id": str(x.transaction_id), "reason": x.reason} for x in report.left
        ],
        "final_invoices": [
            {
                **line(f.decision),
                "invoice_id": str(f.invoice_id),
                "invoice_state": f.invoice_state,
                "stripe_invoice_id": f.stripe_invoice_id,
                "attention_raised": f.attention,
            }
            for f in report.frozen
        ],
        "raced": report.raced,
    }


def _list(args: argparse.Namespace) -> int:
    schedule = _schedule()
    rows = [
        {
            "version": v.number,
            "effective_from": v.effective_from.isoformat(),
            "meters": len(v.prices.prices),
            "currencies": ", ".join(sorted({p.currency for p in v.prices.prices.values()})),
        }
        for v in schedule.versions
    ]
    if args.json:
        print(json.dumps({"price_book_id": str(schedule.book_id), "versions": rows}, indent=2))
    else:
        print_table(rows, ["version", "effective_from", "meters", "currencies"])
    return 0


def _show(args: argparse.Namespace) -> int:

    if args.version is not None and args.at is not None:
        raise CliError("give --at or --version, not both", EXIT_USAGE)
    schedule = _schedule()
    if args.version is not None:
        version = schedule.version(args.version)
        if version is None:
            raise CliError(
                f"the price book has no version {args.version}: it has 1 to"
                f" {len(schedule.versions)} (`billing-ledger prices list`)",
                EXIT_USAGE,
            )
    else:
        version = schedule.price_at(args.at or datetime.now(UTC))
    if args.customer is not None:
        return _show_customer(args, version)
    if args.json:
        body = {
            "price_book_id": str(schedule.book_id),
            "version": version.number,
            "effective_from": version.effective_from.isoformat(),
            "meters": version.prices.to_meters(),  # unit prices in major units, as in a file
        }
        print(json.dumps(body, indent=2))
        return 0
    print(
        f"price book version {version.number}, in force from {version.effective_from.isoformat()}"
    )
    rows = [
        row
        for name, price in sorted(version.prices.prices.items())
        for row in price_rows(name, price)
    ]
    print_table(rows, ["meter", "model", "price", "per"])
    return 0


def _show_customer(args: argparse.Namespace, version: PriceVersion) -> int:
    """The price ``args.customer`` pays per meter at ``--at``: list or contract."""
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings

    if args.version is not None:
        raise CliError("give --customer with --at, not --version", EXIT_USAGE)
    at: datetime = args.at or datetime.now(UTC)
    with open_ledger(Settings()) as ledger:
        contract = ledger.contract(args.customer)
    terms = contract.schedule.at(at) if contract is not None else None
    rows = customer_price_rows(version, terms)
    if args.json:
        print(json.dumps({
            "customer_id": args.customer,
            "price_version": version.number,
            "contract_version": None if terms is None else terms.number,
            "meters": rows,
        }, indent=2))  # fmt: skip
        return 0
    contract_text = "no contract" if terms is None else f"contract version {terms.number}"
    print(
        f"{args.customer} at {at.isoformat()}: price book version {version.number}, {contract_text}"
    )
    print_table(rows, ["meter", "price", "per", "source"])
    return 0


def _exponent(currency: str) -> int:
    from domain.money import CURRENCY_EXPONENTS

    return CURRENCY_EXPONENTS.get(currency, 2)


def price_rows(name: str, price: Price) -> list[dict[str, str]]:
    """A meter's price as table rows: one per-unit row, or the meter's row and, indented
    under it, one row per tier and the flat fee (every amount in the money format)."""
    from domain.money import CURRENCY_EXPONENTS, format_money

    def money(major: Decimal) -> str:
        return format_money(major.scaleb(CURRENCY_EXPONENTS.get(price.currency, 2)), price.currency)

    per = f"{price.per:,}"
    if price.model == "package":
        head = {"price": money(price.unit_price), "per": f"block of {price.package_size:,}"}
    elif price.tiers:
        head = {"price": "", "per": ""}
    else:
        head = {"price": money(price.unit_price), "per": per}
    rows = [{"meter": name, "model": price.model, **head}]
    below = 0
    for number, tier in enumerate(price.tiers, 1):
        span = (
            f"above {below:,}" if tier.up_to is None
            else f"{below + 1:,} to {tier.up_to:,}"
        )  # fmt: skip
        rows.append(
            {
                "meter": f"  tier {number}: {span}",
                "model": "",
                "price": money(tier.unit_price),
                "per": per,
            }
        )
        below = tier.up_to or below
    if price.flat_fee:
        rows.append(
            {"meter": "  flat fee", "model": "", "price": money(price.flat_fee), "per": "period"}
        )
    return rows


def _schedule() -> PriceSchedule:
    """The price book's versions, read as the writer (the book is events: no table)."""
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings

    with open_ledger(Settings()) as ledger:
        book = ledger.price_book()
    if book is None:
        raise CliError(
            "the ledger has no price book yet: `billing-ledger migrate` starts it with the"
            " configured price file (BILLING_LEDGER_PRICE_LIST)",
            EXIT_USAGE,
        )
    return book.schedule
