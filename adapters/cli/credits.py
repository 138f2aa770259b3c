"""``billing-ledger credits``: prepaid credit grants (``domain.credits``) — grant, void,
list, show, and the policy when they run out.

Each command is one change of the customer's account in one currency (``CustomerAccount``),
decided and saved under its version check like every ingest batch, so it is exact and
current whatever the ingest processes are doing. A grant is usable from its effective
moment until its expiry; usage consumes live grants by priority, soonest expiry, oldest.
A void takes only what is left of a grant (what usage consumed stays on its invoices).
``--id`` names a grant: the same command run twice records it once.

A ``purchased`` grant waits for its payment: it is recorded pending (not consumable) with
its purchase (``domain.purchase``), whose one-off Stripe invoice this command starts at
once (``--price``, in major units, default the amount); the reconciler carries it on
after any failure, and the ``invoice.paid`` webhook makes the grant live. ``top-up set``
and ``top-up clear`` keep a customer's automatic top-up rule (``CustomerAccount.set_top_up``).

``void`` of a purchased grant still awaiting payment also voids its invoice in Stripe
(``domain.purchase``); a payment that lands anyway puts the purchase in ``needs
attention``, and ``reinstate`` settles it by granting the credit bought again, live
(chosen over a refund: the customer paid for credit, and the ledger records giving it;
a refund would be money moved outside the ledger's history).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from adapters.cli.args import EXIT_USAGE, CliError, Parser
from adapters.cli.output import print_table

if TYPE_CHECKING:
    from domain.account import CustomerAccount

__all__ = ["add_commands"]

_SOURCES = ("purchased", "promotional", "manual")


def aware_timestamp(text: str) -> datetime:
    """An ISO 8601 instant with its offset (``2027-01-01T00:00:00Z``): a grant's moments
    decide money, so a moment without a time zone is refused, not guessed."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 timestamp") from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z or +01:00)")
    return value


def add_commands(sub: Any) -> None:
    credits = sub.add_parser(
        "credits",
        help="prepaid credit grants: grant, void, list, show; the policy when they run out",
        description="Prepaid credit: grants per customer and currency that usage burns down"
        " in the save that records it (priority, then soonest expiry, then oldest). What"
        " usage of a period consumed comes off that period's invoice as its own item.",
    )
    cmds = credits.add_subparsers(dest="credits_command", required=True, parser_class=Parser)
    grant = cmds.add_parser("grant", help="grant credit to a customer in one currency")
    grant.add_argument("customer")
    grant.add_argument("amount", help="in major units, e.g. 50.00 (at most 10^13 minor units)")
    grant.add_argument("currency")
    grant.add_argument("--source", choices=_SOURCES, required=True, help="where it comes from")
    grant.add_argument("--reason", required=True)
    grant.add_argument("--id", dest="grant_id", help="the grant's id (default: g<next number>)")
    grant.add_argument("--priority", type=int, default=0, help="lower burns first (default 0)")
    grant.add_argument(
        "--price",
        help="purchased only: what its one-off invoice asks, in major units (default: the"
        " amount); the grant is live once that invoice is paid",
    )
    grant.add_argument(
        "--effective-from", type=aware_timestamp, help="usable from (ISO 8601 with offset; now)"
    )
    grant.add_argument(
        "--expires-at", type=aware_timestamp, help="usable until (ISO 8601 with offset; never)"
    )
    grant.set_defaults(handler=_grant)
    void = cmds.add_parser("void", help="void what is left of a grant (consumed stays consumed)")
    void.add_argument("customer")
    void.add_argument("currency")
    void.add_argument("grant_id", help="the grant's id (`credits show` lists them)")
    void.add_argument("--reason", required=True)
    void.set_defaults(handler=_void)
    _add_reinstate(cmds)
    listed = cmds.add_parser("list", help="every grant (the SQL read model billing.credit_grants)")
    listed.add_argument("--customer", help="one customer only")
    listed.add_argument("--json", action="store_true")
    listed.set_defaults(handler=_list)
    shown = cmds.add_parser("show", help="a customer's grants and policy, current (the account)")
    shown.add_argument("customer")
    shown.add_argument("currency")
    shown.add_argument("--json", action="store_true")
    shown.set_defaults(handler=_show)
    policy = cmds.add_parser("policy", help="what usage does when the grants run out")
    policy.add_argument("--customer", required=True)
    policy.add_argument("--currency", default="USD", help="the account's currency (default USD)")
    policy.add_argument(
        "policy", choices=("block", "overage"),
        help="block: refuse usage the grants cannot cover; overage: bill it as always",
    )  # fmt: skip
    policy.set_defaults(handler=_policy)
    top_up = cmds.add_parser("top-up", help="buy credit automatically when the balance runs low")
    top_ups = top_up.add_subparsers(dest="top_up_command", required=True, parser_class=Parser)
    rule = top_ups.add_parser(
        "set", help="when the live balance falls below --below, buy --buy (once per fall)"
    )
    rule.add_argument("--customer", required=True)
    rule.add_argument("--currency", default="USD", help="the account's currency (default USD)")
    rule.add_argument("--below", required=True, help="the threshold, in major units")
    rule.add_argument("--buy", required=True, help="the credit to buy, in major units (> --below)")
    rule.add_argument("--price", help="what its invoice asks, in major units (default: --buy)")
    rule.set_defaults(handler=_top_up_set)
    clear = top_ups.add_parser("clear", help="no automatic top-up any more")
    clear.add_argument("--customer", required=True)
    clear.add_argument("--currency", default="USD", help="the account's currency (default USD)")
    clear.set_defaults(handler=_top_up_clear)


def _add_reinstate(cmds: Any) -> None:
    reinstate = cmds.add_parser(
        "reinstate",
        help="settle a purchase paid after its grant was voided: grant the credit it bought"
        " again, live",
    )
    reinstate.add_argument("customer")
    reinstate.add_argument("currency")
    reinstate.add_argument("grant_id", help="the voided purchased grant (`credits show`)")
    reinstate.add_argument("--reason", required=True)
    reinstate.set_defaults(handler=_reinstate)


def _change(customer: str, currency: str, change: Any) -> Any:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings

    _check_customer(customer)
    with open_ledger(Settings()) as ledger:
        return ledger.change_account(customer, currency, change)


def _check_customer(customer: str) -> None:
    from projections.base import check_customer

    try:
        check_customer(customer)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _existing(customer: str, currency: str, change: Any) -> Any:
    """``change`` on an account that exists: an unknown customer is refused, nothing
    recorded (a purchase or a top-up needs a customer the ledger knows)."""

    from domain.account import CustomerAccount

    def known(account: CustomerAccount) -> Any:
        pending = account.pending_events
        if pending and isinstance(pending[0], CustomerAccount.Opened):  # opened right now
            raise CliError(
                f"unknown customer {customer} in {currency}: record usage, a limit or a"
                " grant first",
                EXIT_USAGE,
            )
        return change(account)

    return _change(customer, currency, known)


def _grant(args: argparse.Namespace) -> int:
    from domain.money import check_currency, format_money, parse_exact_amount

    currency = check_currency(args.currency)
    amount = parse_exact_amount(args.amount, currency)
    if args.source == "purchased":
        return _purchase(args, currency, amount)
    if args.price is not None:
        raise CliError("--price is for purchased credit only", EXIT_USAGE)
    now = datetime.now(UTC)

    def grant(account: CustomerAccount) -> tuple[str, bool, datetime]:
        grant_id = args.grant_id or f"g{len(account.grants) + 1}"
        found = account.grants.get(grant_id)
        # Run again without --effective-from: the moment the first run chose.
        effective = args.effective_from or (found.effective_at if found else now)
        new = account.grant_credit(
            grant_id, amount, priority=args.priority, effective_at=effective,
            expires_at=args.expires_at, source=args.source, reason=args.reason,
        )  # fmt: skip
        return grant_id, new, effective

    grant_id, new, effective = _change(args.customer, currency, grant)
    said = "granted" if new else "already granted (nothing recorded)"
    until = f" until {args.expires_at.isoformat()}" if args.expires_at else ""
    print(
        f"{said}: grant {grant_id} of {format_money(amount, currency)} to {args.customer},"
        f" from {effective.isoformat()}{until}"
    )
    return 0


def _purchase(args: argparse.Namespace, currency: str, amount: int) -> int:
    """Record the purchased grant pending and its purchase, then start its invoice."""
    from adapters.bootstrap import build_purchaser, build_pusher, open_ledger
    from adapters.settings import Settings
    from domain.credits import GrantState
    from domain.money import format_money, parse_exact_amount

    _check_customer(args.customer)
    price = amount if args.price is None else parse_exact_amount(args.price, currency)
    now = datetime.now(UTC)
    settings = Settings()
    with open_ledger(settings) as ledger:

        def buy(account: CustomerAccount) -> Any:
            grant_id = args.grant_id or f"g{len(account.grants) + 1}"
            found = account.grants.get(grant_id)
            return account.purchase_credit(
                grant_id, amount, price, priority=args.priority,
                effective_at=args.effective_from or (found.effective_at if found else now),
                expires_at=args.expires_at, reason=args.reason,
            )  # fmt: skip

        bought = ledger.start_purchase(args.customer, currency, buy)
        account = ledger.account(args.customer, currency)
        assert account is not None  # start_purchase refuses an unknown customer
        grant = next(g for g in account.grants.values() if g.source == "purchased" and (
            bought is None or g.purchase_id == str(bought)) and (
            args.grant_id is None or g.grant_id == args.grant_id))  # fmt: skip
        if bought is None:
            print(f"already purchased (nothing recorded): grant {grant.grant_id} is {grant.state}")
            return 0
        result = build_purchaser(settings, build_pusher(settings, ledger)).step(bought)
        purchase = ledger.purchase_by_id(bought)
    state = purchase.state if purchase is not None else "?"
    invoice = purchase.stripe_invoice_id if purchase is not None else None
    print(
        f"purchased: grant {grant.grant_id} of {format_money(amount, currency)} to"
        f" {args.customer} for {format_money(price, currency)}, {GrantState.PENDING} until"
        f" its invoice {invoice or '(not made yet)'} is paid (purchase {bought}: {state},"
        f" {result})"
    )
    return 0


def _top_up_set(args: argparse.Namespace) -> int:
    from domain.money import check_currency, format_money, parse_exact_amount

    currency = check_currency(args.currency)
    below = parse_exact_amount(args.below, currency)
    buy = parse_exact_amount(args.buy, currency)
    price = None if args.price is None else parse_exact_amount(args.price, currency)
    new = _existing(args.customer, currency, lambda a: a.set_top_up(below, buy, price))
    said = "top-up set" if new else "top-up unchanged (nothing recorded)"
    paid = buy if price is None else price
    print(
        f"{said}: when {args.customer}'s live credit in {currency} falls below"
        f" {format_money(below, currency)}, buy {format_money(buy, currency)} for"
        f" {format_money(paid, currency)}"
    )
    return 0


def _top_up_clear(args: argparse.Namespace) -> int:
    from domain.money import check_currency

    currency = check_currency(args.currency)
    cleared = _existing(args.customer, currency, lambda a: a.clear_top_up())
    print(f"top-up of {args.customer} in {currency}: {'cleared' if cleared else 'none was set'}")
    return 0


def _void(args: argparse.Namespace) -> int:
    """Void the grant; a purchased grant awaiting payment has its invoice voided in Stripe
    too (its purchase's next step, sent at once; the reconciler retries it)."""
    from adapters.bootstrap import build_purchaser, build_pusher, open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency, format_money

    currency = check_currency(args.currency)
    _check_customer(args.customer)
    settings = Settings()
    with open_ledger(settings) as ledger:
        voided, bought = ledger.void_grant(args.customer, currency, args.grant_id, args.reason)
        said = (
            f"voided {format_money(voided, currency)} of grant {args.grant_id} of {args.customer}"
        )
        if bought is None:
            print(said)
            return 0
        result = build_purchaser(settings, build_pusher(settings, ledger)).step(bought)
        purchase = ledger.purchase_by_id(bought)
    state = purchase.state if purchase is not None else "?"
    print(f"{said}; its purchase {bought}: {state} ({result})")
    return 0


def _reinstate(args: argparse.Namespace) -> int:
    """Settle a purchase paid after its grant was voided (``needs attention``): the credit
    it bought is granted again as a new live grant linked to it (``credits reinstate``)."""
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency

    currency = check_currency(args.currency)
    _check_customer(args.customer)
    with open_ledger(Settings()) as ledger:
        new_grant, new = ledger.reinstate_purchase(
            args.customer, currency, args.grant_id, args.reason, datetime.now(UTC)
        )
    said = "reinstated" if new else "already reinstated (nothing recorded)"
    print(f"{said}: grant {args.grant_id} of {args.customer} as the live grant {new_grant}")
    return 0


def _policy(args: argparse.Namespace) -> int:
    from domain.money import check_currency

    currency = check_currency(args.currency)
    _change(args.customer, currency, lambda a: a.set_credit_policy(args.policy))
    print(f"credit policy of {args.customer} in {currency}: {args.policy}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from adapters.cli.ledger import query_read_model
    from projections.credits import credit_grants

    rows = query_read_model(lambda conn: credit_grants(conn, customer=args.customer))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    columns = ["customer_id", "currency", "grant_id", "amount", "consumed", "expired",
               "voided", "remaining", "state", "priority", "expires_at", "source"]  # fmt: skip
    print_table(rows, columns, note="as of the last save projected; `credits show`: current")
    return 0


def _show(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency, format_money

    currency = check_currency(args.currency)
    with open_ledger(Settings()) as ledger:
        account = ledger.account(args.customer, currency)
    if account is None or (not account.grants and account.top_up is None):
        raise CliError(f"no credit for {args.customer} in {currency}", EXIT_USAGE)
    now = datetime.now(UTC)
    rows = [
        {"grant_id": g.grant_id, "amount": g.amount, "consumed": g.consumed,
         "expired": g.expired, "voided": g.voided, "remaining": g.remaining,
         "live": g.live(now), "priority": g.priority, "effective_at": g.effective_at.isoformat(),
         "expires_at": g.expires_at.isoformat() if g.expires_at else None,
         "source": g.source, "reason": g.reason, "currency": currency,
         "state": str(g.state), "note": g.note}
        for g in account.grants.values()
    ]  # fmt: skip
    rule = account.top_up
    top_up = None if rule is None else {
        "below": rule.below, "buy": rule.buy, "price": rule.price, "version": rule.version,
        "purchases_started": account.top_up_crossings, "armed": account.top_up_armed,
    }  # fmt: skip
    if args.json:
        body = {"customer_id": args.customer, "currency": currency,
                "policy": account.credit_policy, "remaining": account.credit_remaining,
                "live": account.live_credit(now), "top_up": top_up,
                "grants": rows}  # fmt: skip
        print(json.dumps(body, indent=2, default=lambda d: f"{d:f}"))
        return 0
    print(f"{args.customer} in {currency}: policy {account.credit_policy}")
    if rule is not None:
        print(
            f"top-up: below {format_money(rule.below, currency)} buy"
            f" {format_money(rule.buy, currency)} for {format_money(rule.price, currency)}"
            f" ({account.top_up_crossings} bought under rule {rule.version},"
            f" {'armed' if account.top_up_armed else 'waiting for the balance to rise'})"
        )
    columns = ["grant_id", "amount", "consumed", "expired", "voided", "remaining", "state",
               "live", "priority", "expires_at", "source", "reason", "note"]  # fmt: skip
    print_table(rows, columns)
    return 0
