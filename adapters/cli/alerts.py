"""Spend alerts and their webhooks: ``alerts set|list`` (thresholds on a customer's
account) and ``webhooks add|list|remove|deliveries|replay`` (where alerts are sent)."""

from __future__ import annotations

import argparse
import json
from typing import Any
from uuid import UUID

from adapters.cli.args import EXIT_USAGE, CliError, Parser, positive_int
from adapters.cli.output import print_table

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    alerts = sub.add_parser("alerts", help="spend alert thresholds per customer and currency")
    al_sub = alerts.add_subparsers(dest="action", required=True, parser_class=Parser)
    set_ = al_sub.add_parser(
        "set", help="set a customer's thresholds, replacing the old ones (none given: cleared)"
    )
    set_.add_argument("--customer", required=True)
    set_.add_argument("--currency", required=True)
    for kind, text in _KINDS.items():
        set_.add_argument(f"--{kind.replace('_', '-')}", type=_numbers, default=[], help=text)
    set_.set_defaults(handler=_set_alerts)
    listed = al_sub.add_parser("list", help="a customer's thresholds and this period's state")
    listed.add_argument("--customer", required=True)
    listed.add_argument("--currency", required=True)
    listed.add_argument("--json", action="store_true")
    listed.set_defaults(handler=_list_alerts)

    hooks = sub.add_parser("webhooks", help="endpoints that receive alerts, and deliveries")
    wh_sub = hooks.add_subparsers(dest="action", required=True, parser_class=Parser)
    add = wh_sub.add_parser("add", help="register an endpoint (its secret is shown once)")
    add.add_argument("url", help="an http(s) URL with a public address")
    add.add_argument(
        "--events", required=True, type=_event_types, help="event types, comma-separated"
    )
    add.set_defaults(handler=_add_endpoint)
    show = wh_sub.add_parser("list", help="the endpoints")
    show.add_argument("--all", action="store_true", help="removed endpoints too")
    show.set_defaults(handler=_list_endpoints)
    remove = wh_sub.add_parser("remove", help="stop sending to an endpoint")
    remove.add_argument("endpoint_id", type=_uuid, help="the endpoint's id (webhooks list)")
    remove.set_defaults(handler=_remove_endpoint)
    sent = wh_sub.add_parser("deliveries", help="recent deliveries: status, attempts, errors")
    sent.add_argument("--endpoint", type=_uuid, help="one endpoint's only")
    sent.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    sent.add_argument("--json", action="store_true")
    sent.set_defaults(handler=_deliveries)
    replay = wh_sub.add_parser("replay", help="send a delivery, or an alert's, again now")
    replay.add_argument("id", type=_uuid, help="a delivery id, or an event id (every endpoint)")
    replay.set_defaults(handler=_replay)


# Each kind of threshold (domain.alerts.KINDS) is an option of ``alerts set``.
_KINDS = {
    "percent_of_limit": "percentages of the spend limit, comma-separated (1-100): 50,80,100",
    "spend": "the period's spend, in minor units, comma-separated: 10000 (100.00 USD)",
    "balance": "the live prepaid credit balance falling to, in minor units: 500,0",
    "percent_of_grant": "percentages of each credit grant consumed (1-100): 50,90",
}


def _numbers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers, comma-separated") from None


def _event_types(text: str) -> list[str]:
    from adapters.alerts.messages import EVENT_TYPES

    types = sorted({t.strip() for t in text.split(",") if t.strip()})
    unknown = [t for t in types if t not in EVENT_TYPES]
    if not types or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: event types are {', '.join(EVENT_TYPES)}")
    return types


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a UUID)") from None


def _set_alerts(args: argparse.Namespace) -> int:
    from adapters.bootstrap import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency

    currency = check_currency(args.currency)
    keys = [f"{kind}:{value}" for kind in _KINDS for value in getattr(args, kind)]
    with open_ledger(Settings()) as ledger:
        ledger.set_alerts(args.customer, currency, keys)
        account = ledger.account(args.customer, currency)
    shown = ", ".join(account.alert_thresholds) if account else ""
    print(f"alerts of {args.customer} in {currency}: {shown or 'none'}")
    return 0


def _list_alerts(args: argparse.Namespace) -> int:
    from adapters.cli.ledger import existing_account

    account = existing_account(args.customer, args.currency)
    crossed = set(account.alerts_crossed)
    rows = [
        {"threshold": key, "crossed_this_period": key in crossed}
        for key in account.alert_thresholds
    ]
    if args.json:
        body = {
            "customer_id": account.customer_id,
            "currency": account.currency,
            "spend_limit": account.spend_limit,
            "period": account.alert_period,
            "period_spend": f"{account.alert_period_spend:f}",
            "thresholds": rows,
        }
        print(json.dumps(body, indent=2))
        return 0
    print_table(rows, ["threshold", "crossed_this_period"])
    if account.alert_period is not None:
        print(f"\nperiod {account.alert_period}: spend {account.alert_period_spend:f} minor units")
    return 0


def _add_endpoint(args: argparse.Namespace) -> int:
    from adapters.alerts import deliveries
    from adapters.alerts.endpoints import UnsafeUrl, resolve_target
    from adapters.bootstrap import database
    from adapters.settings import Settings

    settings = Settings()
    try:
        resolve_target(args.url, allow_private=settings.alert_webhook_allow_private)
    except UnsafeUrl as exc:
        raise CliError(f"webhook URL refused: {exc}", EXIT_USAGE) from None
    with database(settings, pool_size=0).connection() as conn:
        endpoint, secret = deliveries.add_endpoint(conn, args.url, args.events)
    print(f"endpoint {endpoint} added for {', '.join(args.events)}")
    print(f"signing secret (shown only now; keep it with the receiver): {secret}")
    return 0


def _list_endpoints(args: argparse.Namespace) -> int:
    from adapters.alerts import deliveries
    from adapters.bootstrap import database
    from adapters.settings import Settings

    with database(Settings(), pool_size=0).connection() as conn:
        found = deliveries.endpoints(conn, removed=args.all)
    rows = [{**vars(e), "events": ",".join(e.events)} for e in found]
    print_table(rows, ["endpoint_id", "url", "events", "created_at", "removed_at"])
    return 0


def _remove_endpoint(args: argparse.Namespace) -> int:
    from adapters.alerts import deliveries
    from adapters.bootstrap import database
    from adapters.settings import Settings

    with database(Settings(), pool_size=0).connection() as conn:
        if not deliveries.remove_endpoint(conn, args.endpoint_id):
            raise CliError(f"no live endpoint {args.endpoint_id}", EXIT_USAGE)
    print(f"endpoint {args.endpoint_id} removed")
    return 0


def _deliveries(args: argparse.Namespace) -> int:
    from adapters.alerts import deliveries
    from adapters.bootstrap import database
    from adapters.settings import Settings

    with database(Settings(), pool_size=0).connection() as conn:
        found = deliveries.deliveries(conn, endpoint=args.endpoint, limit=args.limit)
    rows = [vars(d) for d in found]
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    columns = ["delivery_id", "event_id", "status", "attempts", "last_status", "next_try_at"]
    print_table(rows, [*columns, "last_error"])
    return 0


def _replay(args: argparse.Namespace) -> int:
    from adapters.alerts import deliveries
    from adapters.bootstrap import database
    from adapters.settings import Settings

    with database(Settings(), pool_size=0).connection() as conn:
        count = deliveries.replay(conn, args.id)
    if not count:
        raise CliError(f"no delivery or alert {args.id} to a live endpoint", EXIT_USAGE)
    print(f"{count} deliver{'y' if count == 1 else 'ies'} due again now")
    return 0
