"""The auditor's commands: ``audit``, ``export``, ``anchor``, and ``balances --as-of``'s
printing."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from adapters.cli.args import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    check_writable,
    checked_customer,
    timestamp,
    usage,
)
from adapters.cli.output import print_table

__all__ = ["add_commands", "print_balances_as_of"]


def add_commands(sub: Any) -> None:
    audit = sub.add_parser("audit", help="replay the history, check every invariant and chain")
    audit.add_argument("--customer", help="one customer only")
    audit.add_argument("--from", dest="start", type=timestamp, help="metered at or after")
    audit.add_argument("--to", dest="end", type=timestamp, help="metered before")
    audit.add_argument("--stripe", action="store_true", help="cross-check Stripe's invoice items")
    audit.add_argument("--json", action="store_true")
    audit.add_argument("--out", type=Path, help="write the report to this file too")
    audit.add_argument(
        "--metrics-file",
        type=Path,
        metavar="FILE.prom",
        help="write the findings by kind as Prometheus series (node_exporter's textfile"
        " collector) for the BillingAuditFinding alert",
    )
    audit.set_defaults(handler=_audit)

    export = sub.add_parser("export", help="a customer's events as JSON lines, with hashes")
    export.add_argument("--customer", required=True)
    export.add_argument("--from", dest="start", type=timestamp, help="events at or after")
    export.add_argument("--to", dest="end", type=timestamp, help="events before")
    export.set_defaults(handler=_export)

    anchor = sub.add_parser(
        "anchor", help="sign a checkpoint of the whole log into ANCHOR_PATH (outside the DB)"
    )
    anchor.add_argument(
        "--every",
        type=float,
        nargs="?",
        const=-1.0,
        metavar="SECONDS",
        help="keep signing, every SECONDS (default: ANCHOR_INTERVAL_S) until Ctrl-C",
    )
    anchor.set_defaults(handler=_anchor)


def _anchor_settings(settings: Any, *, required: bool) -> tuple[Path, bytes] | None:
    """``ANCHOR_PATH`` and the key (None when no path is set and none is required)."""
    from adapters.audit.anchor import anchor_key

    if settings.anchor_path is None:
        if required:
            raise CliError("set BILLING_LEDGER_ANCHOR_PATH (and ANCHOR_KEY) to anchor", EXIT_USAGE)
        return None
    return settings.anchor_path, anchor_key(settings.anchor_key.get_secret_value())


def _anchor(args: argparse.Namespace) -> int:
    import threading

    from adapters.audit.anchor import anchor_once, run_anchor
    from adapters.bootstrap import database
    from adapters.settings import Settings
    from domain.anchor import Checkpoint

    settings = Settings()
    found = _anchor_settings(settings, required=True)
    assert found is not None
    path, key = found

    def say(checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            print("nothing new to anchor", file=sys.stderr, flush=True)
        else:
            print(
                f"anchored {checkpoint.events:,} events up to (xid {checkpoint.xid},"
                f" notification {checkpoint.notification_id}) into {path}",
                flush=True,
            )

    with database(settings, pool_size=0) as db:
        if args.every is None:
            say(anchor_once(db, path, key))
            return 0
        every = settings.anchor_interval_s if args.every < 0 else args.every
        if every <= 0:
            raise usage("--every needs a number of seconds above 0")
        run_anchor(db, path, key, every_s=every, stop=threading.Event(), on_checkpoint=say)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from adapters.audit.anchor import anchors
    from adapters.audit.replay import Scope
    from adapters.audit.report import (
        audit,
        render,
        stripe_invoice_items,
        stripe_invoice_totals,
    )
    from adapters.bootstrap import database
    from adapters.settings import Settings

    if args.start and args.end and args.start >= args.end:
        raise usage("--from must be before --to")
    for path, option in ((args.out, "--out"), (args.metrics_file, "--metrics-file")):
        if path is not None:
            check_writable(path, option)
    scope = Scope(customer=checked_customer(args.customer), start=args.start, end=args.end)
    settings = Settings()
    items = (
        (lambda: stripe_invoice_items(settings.stripe(), scope.customer)) if args.stripe else None
    )
    stripe_invoices = (
        (lambda: stripe_invoice_totals(settings.stripe(), scope.customer)) if args.stripe else None
    )
    anchored = _anchor_settings(settings, required=False)
    with database(settings, pool_size=0) as db:
        report = audit(
            db,
            scope,
            horizon=settings.overdue_after(),
            stripe_items=items,
            stripe_invoices=stripe_invoices,
            anchors=anchors(*anchored) if anchored is not None else None,
        )
    text = json.dumps(report.as_dict(), indent=2) if args.json else render(report)
    print(text)
    if args.out is not None:
        try:
            args.out.write_text(text + "\n")
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror}") from None
    if args.metrics_file is not None:
        _write_metrics(report, args.metrics_file)
    return 0 if report.ok else EXIT_FAILURE


def _write_metrics(report: Any, path: Path) -> None:
    import time

    from adapters.audit.textfile import write_textfile

    try:
        write_textfile(report, path, finished_at=time.time())
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None


def _export(args: argparse.Namespace) -> int:
    from adapters.audit.export import export_events
    from adapters.bootstrap import database
    from adapters.settings import Settings

    customer = checked_customer(args.customer)
    assert customer is not None  # required by the parser
    settings = Settings()
    count = 0
    with database(settings, pool_size=0) as db:
        for line in export_events(db, customer, args.start, args.end):
            sys.stdout.write(json.dumps(line) + "\n")
            count += 1
    anchored = _anchor_settings(settings, required=False)
    if anchored is not None:
        # The latest signed checkpoint, as signed: the auditor verifies it with the key.
        from adapters.audit.anchor import latest_line

        signed = latest_line(*anchored)
        if signed is not None:
            sys.stdout.write(json.dumps({"checkpoint": json.loads(signed)}) + "\n")
    print(f"exported {count} event(s) of {customer}", file=sys.stderr)
    return 0


def print_balances_as_of(
    as_of: datetime, customer: str | None, columns: list[str], *, as_json: bool
) -> int:
    """``balances --as-of``: balances and transaction states at ``as_of``, from history."""
    from adapters.audit.export import balances_as_of
    from adapters.bootstrap import database
    from adapters.settings import Settings

    checked = checked_customer(customer)
    with database(Settings(), pool_size=0) as db:
        state = balances_as_of(db, as_of, checked)
    if as_json:
        print(json.dumps(state, indent=2))
        return 0
    print(f"as of {state['as_of']}")
    print_table(state["balances"], columns)
    counts: dict[tuple[str, str], int] = {}
    for t in state["transactions"]:
        counts[t["customer_id"], t["state"]] = counts.get((t["customer_id"], t["state"]), 0) + 1
    rows: list[dict[str, Any]] = [
        {"customer_id": c, "state": s, "transactions": n} for (c, s), n in sorted(counts.items())
    ]
    print_table(rows, ["customer_id", "state", "transactions"])
    return 0
