"""The ledger's commands: transactions and balances (the read models), history,
accounts and spend limits, reversals, and projection rebuilds."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from adapters.cli.args import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    Parser,
    int_arg,
    invoice_uuid,
    period_moment,
    timestamp,
    txn_uuid,
    usage,
)
from adapters.cli.output import MONEY_COLUMNS, ROUNDING_NOTE, event_row, money_cell, print_table

if TYPE_CHECKING:
    from domain.account import CustomerAccount

__all__ = ["add_commands", "existing_account", "query_read_model"]

# What ``rebuild`` can name (projections.projector.PROJECTIONS, held to it by a unit test;
# not imported here, so that the command line starts without the projections).
PROJECTION_NAMES = (
    "transactions", "customer_balances", "charge_attempts", "invoice_lines", "line_pushes",
    "invoices", "invoice_events", "credit_grants", "credit_balances", "contract_versions",
    "credit_purchases",
)  # fmt: skip


def add_commands(sub: Any) -> None:
    reverse = sub.add_parser("reverse", help="reverse a Charged transaction (refund)")
    reverse.add_argument("txn_id", type=txn_uuid)
    reverse.add_argument("--reason", required=True)
    reverse.set_defaults(handler=_reverse)

    history = sub.add_parser("history", help="a transaction's events, in order")
    history.add_argument("txn_id", nargs="?", type=txn_uuid, help="transaction id")
    history.add_argument("--customer")
    history.add_argument("--usage-id")
    history.add_argument("--json", action="store_true")
    history.set_defaults(handler=_history)

    accounts = sub.add_parser("accounts", help="customer accounts and spend limits")
    acc_sub = accounts.add_subparsers(dest="action", required=True, parser_class=Parser)
    set_limit = acc_sub.add_parser("set-limit", help="set a spend limit (major units, or 'none')")
    set_limit.add_argument("customer")
    set_limit.add_argument("amount", help="e.g. 250.00, or 'none' for unlimited")
    set_limit.add_argument("currency", help="ISO 4217 code, e.g. USD")
    set_limit.set_defaults(handler=_set_limit)
    show = acc_sub.add_parser("show", help="a customer's account in one currency")
    show.add_argument("customer")
    show.add_argument("currency")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_show_account)

    balances = sub.add_parser("balances", help="customer balances (the SQL read model)")
    balances.add_argument("--customer", help="one customer only")
    balances.add_argument(
        "--as-of", type=timestamp, help="as they were at this instant, from the history alone"
    )
    balances.add_argument("--json", action="store_true")
    balances.set_defaults(handler=_balances)

    txns = sub.add_parser("transactions", help="transactions, most recently updated first")
    txns.add_argument("--state", help="metered, reserved, charge_failed, charged or compensated")
    txns.add_argument("--customer", help="one customer only")
    txns.add_argument("--limit", type=int_arg, default=50, help="at most this many (1-10000)")
    txns.add_argument("--json", action="store_true")
    txns.set_defaults(handler=_transactions)

    lines = sub.add_parser("lines", help="invoice lines: exact totals, billed, what Stripe holds")
    lines.add_argument("--customer", help="one customer only")
    lines.add_argument("--limit", type=int_arg, default=100, help="at most this many (1-10000)")
    lines.add_argument("--json", action="store_true")
    lines.set_defaults(handler=_lines)

    _add_invoice_commands(sub)

    rebuild = sub.add_parser("rebuild", help="recompute a projection from the first event")
    rebuild.add_argument(
        "projection",
        nargs="?",
        help=f"one of {', '.join(PROJECTION_NAMES)}",
    )
    rebuild.add_argument("--all", action="store_true", help="every projection")
    rebuild.set_defaults(handler=_rebuild)


def _add_invoice_commands(sub: Any) -> None:
    invoices = sub.add_parser(
        "invoices", help="period invoices: state, totals, payment (close a period early)"
    )
    invoices.add_argument("--customer", help="one customer only")
    invoices.add_argument("--period", type=period_moment, help="YYYY-MM, or an instant in it")
    invoices.add_argument("--state", help="open, closed, finalizing, finalized, paid, ...")
    invoices.add_argument("--limit", type=int_arg, default=100, help="at most this many (1-10000)")
    invoices.add_argument("--json", action="store_true")
    invoices.set_defaults(handler=_invoices)
    inv_sub = invoices.add_subparsers(dest="action", parser_class=Parser)
    close = inv_sub.add_parser(
        "close", help="close a period's open invoices now, push their lines, finalize them"
    )
    close.add_argument(
        "--period", dest="close_period", type=period_moment, required=True,
        help="YYYY-MM, or an instant in the period",
    )  # fmt: skip
    close.add_argument("--customer", dest="close_customer", help="one customer only")
    close.add_argument("--reason", default="closed early by an operator")
    close.set_defaults(handler=_close_invoices)
    preview = inv_sub.add_parser(
        "preview",
        help="what a customer's open invoice would be now: its lines and total, from the"
        " read models (Stripe is not called)",
    )
    preview.add_argument("--customer", dest="preview_customer", required=True, help="whose")
    preview.add_argument(
        "--period", dest="preview_period", type=period_moment,
        help="YYYY-MM, or an instant in the period (default: every open period)",
    )  # fmt: skip
    preview.add_argument(
        "--json", dest="preview_json", action="store_true",
        help="one object per line, amounts in minor units",
    )  # fmt: skip
    preview.set_defaults(handler=_preview_invoice)
    settle = inv_sub.add_parser(
        "settle",
        help="settle what stopped an invoice (its draft or finalized total differs from the"
        " ledger in a way no push can repair): the draft is read back again before finalizing",
    )
    settle.add_argument("invoice_id", type=invoice_uuid, help="the ledger's invoice id")
    settle.add_argument("--how", required=True, help="what was done about it (audited)")
    settle.add_argument("--by", required=True, help="who settled it (audited)")
    settle.set_defaults(handler=_settle_invoice)
    redraft = inv_sub.add_parser(
        "redraft",
        help="bill an invoice whose Stripe draft was deleted by hand on a new draft: Stripe"
        " is asked first, and only a draft it says is gone is replaced; its lines are pushed"
        " again and the new draft is read back before finalizing",
    )
    redraft.add_argument("invoice_id", type=invoice_uuid, help="the ledger's invoice id")
    redraft.add_argument("--how", required=True, help="what happened to the draft (audited)")
    redraft.add_argument("--by", required=True, help="who decided it (audited)")
    redraft.set_defaults(handler=_redraft_invoice)


def _reverse(args: argparse.Namespace) -> int:
    from adapters.bootstrap import build_closer, build_corrections, build_pusher, open_ledger
    from adapters.charging.closer import CloseResult
    from adapters.settings import Settings
    from domain.money import format_money
    from domain.saga import StepResult

    settings = Settings()
    with open_ledger(settings) as ledger:
        pusher = build_pusher(settings, ledger)
        result = build_corrections(pusher).reverse(args.txn_id, args.reason)
        print(f"transaction {args.txn_id}: {result}")
        if result is not StepResult.REVERSED:
            return EXIT_FAILURE
        txn = ledger.transaction(args.txn_id)
        line = ledger.line_or_none(txn.line_id) if txn.line_id is not None else None
        invoice = ledger.invoice_by_id(line.invoice_id) if line is not None else None
        if invoice is None or not invoice.credits_pending():
            return 0
        # Final in Stripe: issue the credit note now (the closer would, at its next pass).
        step = build_closer(settings, pusher).step(invoice.id)
        credited = ledger.invoice_by_id(invoice.id) or invoice
        note = [n for n, t in credited.credited.items() if t == str(txn.id)]
        if note:
            amount = format_money(credited.credits_requested[str(txn.id)], credited.currency)
            print(f"credit note {note[0]} of {amount} on invoice {credited.id}"
                  f" ({credited.number})")  # fmt: skip
            return 0
        print(f"credit note not issued yet ({step.result}); the workers retry it")
        return EXIT_FAILURE if step.result is CloseResult.FAILED else 0


def _history(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.ids import transaction_id

    if args.txn_id is not None and (args.customer or args.usage_id):
        raise usage("give a transaction id, or --customer with --usage-id, not both")
    if args.txn_id is None:
        if not (args.customer and args.usage_id):
            raise usage("give a transaction id, or both --customer and --usage-id")
        txn_id = transaction_id(args.customer, args.usage_id)
    else:
        txn_id = args.txn_id
    with open_ledger(Settings()) as ledger:
        events = ledger.history(txn_id)
    if not events:
        raise CliError(f"no transaction {txn_id} in the ledger: check the id", EXIT_USAGE)
    rows = [event_row(e) for e in events]
    if args.json:
        print(json.dumps({"transaction_id": str(txn_id), "events": rows}, indent=2, default=str))
    else:
        print(f"transaction {txn_id}")
        currency = next((r["data"]["currency"] for r in rows if r["data"].get("currency")), None)
        for row in rows:
            data = ", ".join(f"{k}={_field(k, v, currency)}" for k, v in row["data"].items())
            print(f"  v{row['version']:<3} {row['timestamp']}  {row['event']:<13} {data}")
    return 0


def _field(name: str, value: str | None, currency: str | None) -> str | None:
    """An event's field as ``history`` shows it: amounts in the money format, a unit
    price (major units) with its currency."""
    if name in MONEY_COLUMNS:
        return money_cell(value, currency)
    if name == "unit_price" and currency is not None:
        return f"{value} {currency}"
    return value


def _set_limit(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency, format_money, parse_exact_amount

    currency = check_currency(args.currency)
    limit = (
        None
        if args.amount.lower() in ("none", "unlimited")
        else (parse_exact_amount(args.amount, currency))
    )
    with open_ledger(Settings()) as ledger:
        ledger.set_spend_limit(args.customer, currency, limit)
    shown = "unlimited" if limit is None else format_money(limit, currency)
    print(f"spend limit of {args.customer} in {currency}: {shown}")
    return 0


def existing_account(customer: str, currency_code: str) -> CustomerAccount:
    """The customer's account in that currency, read from the ledger (misuse if none)."""
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency

    currency = check_currency(currency_code)
    with open_ledger(Settings()) as ledger:
        account = ledger.account(customer, currency)
    if account is None:
        raise CliError(f"no account for {customer} in {currency}", EXIT_USAGE)
    return account


def _show_account(args: argparse.Namespace) -> int:
    from domain.money import format_money

    account = existing_account(args.customer, args.currency)
    currency = account.currency
    body = {
        "customer_id": account.customer_id,
        "currency": currency,
        "spend_limit": account.spend_limit,
        "held": account.committed,  # in flight or charged: what counts against the limit
        "available": account.available,
    }
    if args.json:
        print(json.dumps(body, indent=2, default=lambda d: f"{d:f}"))  # exact: decimal text
    else:
        for key, value in body.items():
            shown = format_money(value, currency) if isinstance(value, int | Decimal) else value
            print(f"{key:<12} {'unlimited' if value is None else shown}")
    return 0


def _balances(args: argparse.Namespace) -> int:
    from projections.balances import COLUMNS, balances

    columns = [c for c in COLUMNS if c != "updated_at"]
    if args.as_of is not None:
        from adapters.cli.audit import print_balances_as_of

        return print_balances_as_of(args.as_of, args.customer, columns, as_json=args.json)
    rows = query_read_model(lambda conn: balances(conn, customer=args.customer))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_table(rows, columns, note=ROUNDING_NOTE)
    return 0


def _transactions(args: argparse.Namespace) -> int:
    from projections.transactions import transactions

    rows = query_read_model(
        lambda conn: transactions(conn, state=args.state, customer=args.customer, limit=args.limit)
    )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        columns = ["transaction_id", "customer_id", "usage_id", "amount", "currency", "state"]
        print_table(rows, [*columns, "attempts", "updated_at", "last_error"])
    return 0


def _lines(args: argparse.Namespace) -> int:
    from projections.invoice_lines import lines

    rows = query_read_model(lambda conn: lines(conn, customer=args.customer, limit=args.limit))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        columns = ["customer_id", "currency", "meter", "period_start", "transactions"]
        print_table(
            rows,
            [*columns, "exact_total", "billed", "stripe_amount", "last_error"],
            note="billed is the line's exact_total rounded once, half up; stripe_amount is"
            " what Stripe holds for it.",
        )
    return 0


INVOICE_COLUMNS = [
    "invoice_id", "customer_id", "currency", "period_start", "state", "number",
    "expected_total", "total", "amount_paid", "credited", "close_deadline", "attention",
]  # fmt: skip


def _invoices(args: argparse.Namespace) -> int:
    from projections.invoices import invoices

    rows = query_read_model(
        lambda conn: invoices(
            conn, customer=args.customer, period=args.period, state=args.state, limit=args.limit
        )
    )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_table(rows, INVOICE_COLUMNS, note=ROUNDING_NOTE)
    return 0


def _preview_invoice(args: argparse.Namespace) -> int:
    from domain.money import format_money
    from projections.invoices import invoice_preview

    # The view holds the true-up lines too: one computation, readable by billing_reader.
    rows = query_read_model(
        lambda conn: invoice_preview(
            conn, customer=args.preview_customer, period=args.preview_period
        )
    )
    if args.preview_json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print(f"{args.preview_customer} has no open invoice with usage"
              + (" in that period" if args.preview_period else ""))  # fmt: skip
        return 0
    invoices: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        invoices.setdefault(row["invoice_id"], []).append(row)
    for lines in invoices.values():
        first = lines[0]
        print(
            f"{first['customer_id']} {first['currency']}, period"
            f" {first['period_start'].isoformat()} to {first['period_end'].isoformat()}"
            f" (closes after {first['close_deadline'].isoformat()})"
        )
        print_table(
            [{**line, "quantity": _quantity(line)} for line in lines],
            ["meter", "late", "model", "quantity", "tier", "transactions", "exact_total", "billed"],
        )
        print(f"total so far: {format_money(first['invoice_total'], first['currency'])}"
              f" ({first['invoice_lines']} line(s))\n")  # fmt: skip
    print(ROUNDING_NOTE)
    return 0


def _quantity(line: dict[str, Any]) -> str:
    """A line's quantity as a person reads it (counted only on lines priced by quantity)."""
    from domain.money import canonical

    quantity = line["quantity"]
    return "" if quantity is None else f"{canonical(quantity):f}"


def _close_invoices(args: argparse.Namespace) -> int:
    """Close the period's open invoices now and drive each as far as it goes: lines
    pushed, finalized in Stripe (what fails is retried by the workers' close role)."""
    from adapters.bootstrap import build_closer, build_pusher, database, open_ledger
    from adapters.charging.closer import CloseResult
    from adapters.settings import Settings
    from domain.invoice_states import InvoiceState
    from projections.invoices import invoices, unprojected_invoices

    settings = Settings()
    with database(settings, pool_size=0) as db, db.connection() as conn:
        rows = invoices(
            conn, customer=args.close_customer, period=args.close_period, state="open",
            limit=10_000,
        )  # fmt: skip
        candidates = {r["invoice_id"] for r in rows} | set(unprojected_invoices(conn))
    failed = 0
    with open_ledger(settings) as ledger:
        chosen = []  # the aggregate decides: open, of that period (and customer)
        for invoice_id in sorted(candidates):
            invoice = ledger.invoice_by_id(invoice_id)
            if (
                invoice is not None
                and invoice.state is InvoiceState.OPEN
                and invoice.period.contains(args.close_period)
                and args.close_customer in (None, invoice.customer_id)
            ):
                chosen.append(invoice)
        if not chosen:
            print("no open invoice in that period")
            return 0
        closer = build_closer(settings, build_pusher(settings, ledger))
        for n, invoice in enumerate(chosen, 1):
            step = closer.step(invoice.id, close_now=args.reason)
            for _ in range(5):  # closed, lines pushed: finalize
                if step.result is not CloseResult.WAITING or step.retry_at is not None:
                    break
                step = closer.step(invoice.id)
            # Not final yet, and the workers retry it: a failure, a lost race, or a retry
            # not due (a request in doubt, our own breaker refusing Stripe calls).
            failed += step.result in (CloseResult.FAILED, CloseResult.RACED) or (
                step.result is CloseResult.WAITING and step.retry_at is not None
            )
            print(f"[{n}/{len(chosen)}] {invoice.customer_id} {invoice.currency}"
                  f" {invoice.period_start:%Y-%m-%d}: {step.state or step.result}"
                  f" ({step.requests} Stripe requests)")  # fmt: skip
    if failed:
        print(f"{failed} invoice(s) not finalized yet: the workers' close role retries them")
    return EXIT_FAILURE if failed else 0


def _settle_invoice(args: argparse.Namespace) -> int:
    """Record that an operator settled what stopped the invoice; the closer goes on."""
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.errors import IllegalTransition

    with open_ledger(Settings()) as ledger:
        invoice = ledger.invoice_by_id(args.invoice_id)
        if invoice is None:
            raise usage(f"no invoice {args.invoice_id} in the ledger")
        reason = invoice.attention
        try:
            invoice.settle_attention(args.how, args.by)
        except IllegalTransition:
            raise usage(f"invoice {args.invoice_id} needs no attention") from None
        except ValueError:
            raise usage("--how and --by must say what was done and who did it") from None
        ledger.save(invoice)
    print(f"invoice {args.invoice_id}: settled ({reason}); the close role reads it back again")
    return 0


def _redraft_invoice(args: argparse.Namespace) -> int:
    """Replace an invoice's draft that Stripe says is gone; its lines start over on the
    new one (``adapters.charging.redraft``)."""
    from eventsourcing.persistence import IntegrityError

    from adapters.bootstrap import build_pusher, open_ledger
    from adapters.charging.redraft import RedraftRefused, redraft
    from adapters.settings import Settings

    settings = Settings()
    with open_ledger(settings) as ledger:
        gateway = build_pusher(settings, ledger).gateway
        try:
            done = redraft(ledger, gateway, args.invoice_id, args.how, args.by)
        except RedraftRefused as exc:
            if exc.passing:  # Stripe could not be asked now: a later run may succeed
                print(f"billing-ledger: {exc}", file=sys.stderr)
                return EXIT_FAILURE
            raise usage(str(exc)) from None
        except IntegrityError:
            print(
                f"billing-ledger: invoice {args.invoice_id} changed while it was redrafted"
                " (a push, ingest or the close role recorded first): run the command again",
                file=sys.stderr,
            )
            return EXIT_FAILURE
    left = (
        f"; {done.pending_deleted} item(s) the lost draft left pending deleted"
        if done.pending_deleted
        else ""
    )
    print(
        f"invoice {args.invoice_id}: Stripe no longer has draft {done.lost} ({done.why});"
        f" its {done.lines} line(s) go on draft {done.draft}, made by their next push, and"
        f" the close role reads it back before finalizing{left}"
    )
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger, owner_database
    from adapters.settings import Settings
    from projections.base import UnknownProjection
    from projections.projector import PROJECTIONS, projection, rebuild

    if args.all == (args.projection is not None):
        raise usage("give a projection name or --all, not both")
    try:
        names = [p.name for p in PROJECTIONS] if args.all else [projection(args.projection).name]
    except UnknownProjection as exc:
        raise usage(str(exc)) from None
    settings = Settings()
    # The swap is DDL: the schema owner's (MIGRATE_DATABASE_URL), never a worker's.
    with open_ledger(settings) as ledger, owner_database(settings) as db:
        for name in names:
            report = rebuild(db, name, ledger.mapper.to_domain_event)
            print(f"rebuilt {report.name}: {report.rows} rows from {report.events} events")
    return 0


def query_read_model(run: Callable[[Any], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run a read-model query; an invalid filter is misuse (exit 2)."""
    from adapters.bootstrap import database
    from adapters.settings import Settings
    from projections.base import InvalidFilter

    try:
        with database(Settings(), pool_size=0) as db, db.connection() as conn:
            return run(conn)
    except InvalidFilter as exc:
        raise usage(str(exc)) from None
