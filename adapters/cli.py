"""``billing-ledger``: the command line, and the composition root of every process.

Misuse gets one line on stderr and exit status 2; a failure of a service (database,
broker, settings) gets one line and exit status 1. Never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from uuid import UUID

if TYPE_CHECKING:
    from adapters.settings import Settings

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
ROLES = ("ingest", "relay", "project", "charge", "reconcile")


class CliError(Exception):
    """Raised when a command cannot do what was asked; the message is shown as is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``billing-ledger`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    # SIGTERM unwinds like Ctrl-C, so whatever a command started (an embedded
    # PostgreSQL, a broker) is stopped by its context manager on the way out.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`export ... | head`): not our error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # quiet exit flush
        return 0
    except Exception as exc:  # the boundary: every error becomes one line
        print(f"billing-ledger: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="billing-ledger", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded default")
    demo.add_argument("--records", type=_positive_int, default=5000)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.set_defaults(handler=_demo)

    up = sub.add_parser("up", help="start embedded PostgreSQL and the broker in the foreground")
    up.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here (default: temp)")
    up.add_argument("--kafka-port", type=_port, help="broker port (default: a free one)")
    up.set_defaults(handler=_up)

    produce = sub.add_parser("produce", help="send JSON-lines usage records to the usage topic")
    produce.add_argument("file", nargs="?", default="-", help="a file, or - for stdin")
    produce.set_defaults(handler=_produce)

    run = sub.add_parser("run", help="run workers against the configured services")
    run.add_argument(
        "--role",
        choices=[*ROLES, "all"],
        default="all",
        help="which worker to run (all: every one, each in its own thread)",
    )
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument(
        "--health-port", type=_port_or_zero,
        help="serve /healthz /readyz /health /metrics here (0: off; default: the setting)",
    )  # fmt: skip
    run.add_argument("--drill-kill-after-save", action="store_true", help=argparse.SUPPRESS)
    run.add_argument(
        "--drill", choices=["kill_after_stripe", "kill_before_stripe"], default="",
        help=argparse.SUPPRESS,
    )  # fmt: skip

    reverse = sub.add_parser("reverse", help="reverse a Charged transaction (refund)")
    reverse.add_argument("txn_id", type=_uuid)
    reverse.add_argument("--reason", required=True)
    reverse.set_defaults(handler=_reverse)
    run.set_defaults(handler=_run)

    history = sub.add_parser("history", help="a transaction's events, in order")
    history.add_argument("txn_id", nargs="?", type=_uuid, help="transaction id")
    history.add_argument("--customer")
    history.add_argument("--usage-id")
    history.add_argument("--json", action="store_true")
    history.set_defaults(handler=_history)

    accounts = sub.add_parser("accounts", help="customer accounts and spend limits")
    acc_sub = accounts.add_subparsers(dest="action", required=True, parser_class=_Parser)
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

    _add_views(sub)
    _add_audit(sub)
    _add_bench(sub)
    return p


def _add_views(sub: Any) -> None:
    balances = sub.add_parser("balances", help="customer balances (the SQL read model)")
    balances.add_argument("--customer", help="one customer only")
    balances.add_argument(
        "--as-of", type=_timestamp, help="as they were at this instant, from the history alone"
    )
    balances.add_argument("--json", action="store_true")
    balances.set_defaults(handler=_balances)

    txns = sub.add_parser("transactions", help="transactions, most recently updated first")
    txns.add_argument("--state", help="metered, reserved, charge_failed, charged or compensated")
    txns.add_argument("--customer", help="one customer only")
    txns.add_argument("--limit", type=_int, default=50, help="at most this many (1-10000)")
    txns.add_argument("--json", action="store_true")
    txns.set_defaults(handler=_transactions)

    health = sub.add_parser("health", help="queue health: what is stuck, and why")
    health.add_argument("--json", action="store_true")
    health.add_argument(
        "--watch", type=_positive_float, nargs="?", const=2.0, metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )  # fmt: skip
    health.set_defaults(handler=_health)

    rebuild = sub.add_parser("rebuild", help="recompute a projection from the first event")
    rebuild.add_argument(
        "projection", nargs="?", help="transactions, customer_balances or charge_attempts"
    )
    rebuild.add_argument("--all", action="store_true", help="every projection")
    rebuild.set_defaults(handler=_rebuild)


def _add_audit(sub: Any) -> None:
    audit = sub.add_parser("audit", help="replay the history, check every invariant and chain")
    audit.add_argument("--customer", help="one customer only")
    audit.add_argument("--from", dest="start", type=_timestamp, help="metered at or after")
    audit.add_argument("--to", dest="end", type=_timestamp, help="metered before")
    audit.add_argument("--stripe", action="store_true", help="cross-check Stripe's invoice items")
    audit.add_argument("--json", action="store_true")
    audit.add_argument("--out", type=Path, help="write the report to this file too")
    audit.set_defaults(handler=_audit)

    export = sub.add_parser("export", help="a customer's events as JSON lines, with hashes")
    export.add_argument("--customer", required=True)
    export.add_argument("--from", dest="start", type=_timestamp, help="events at or after")
    export.add_argument("--to", dest="end", type=_timestamp, help="events before")
    export.set_defaults(handler=_export)


def _add_bench(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers")
    bench_sub = bench.add_subparsers(dest="which", required=True, parser_class=_Parser)
    b_ingest = bench_sub.add_parser("ingest", help="end-to-end ingest vs raw PostgreSQL")
    b_ingest.add_argument("--records", type=_positive_int, default=50_000)
    b_ingest.add_argument("--batch", type=_positive_int, default=2000)
    b_ingest.add_argument(
        "--workers", type=_positive_int, default=1, help="ingest processes in the consumer group"
    )
    b_ingest.add_argument("--database-url", help="use this PostgreSQL instead of an embedded one")
    b_ingest.add_argument("--json", action="store_true")
    b_ingest.set_defaults(handler=_bench_ingest)
    b_charge = bench_sub.add_parser("charge", help="charges/s and latency against the emulator")
    b_charge.add_argument("--rate", type=_positive_float, default=20.0, help="usage records/s")
    b_charge.add_argument("--seconds", type=_positive_float, default=30.0)
    b_charge.add_argument("--latency-ms", type=float, default=30.0, help="emulator latency")
    b_charge.add_argument("--stripe-rate", type=_positive_int, default=25)
    b_charge.add_argument("--concurrency", type=_positive_int, default=8)
    b_charge.add_argument("--json", action="store_true")
    b_charge.set_defaults(handler=_bench_load, outage_at=None, outage_s=0.0)
    b_out = bench_sub.add_parser("outage", help="steady usage, a Stripe outage, recovery")
    b_out.add_argument("--rate", type=_positive_float, default=100.0, help="usage records/s")
    b_out.add_argument("--seconds", type=_positive_float, default=60.0)
    b_out.add_argument("--outage-at", type=_positive_float, default=15.0)
    b_out.add_argument("--outage-s", type=_positive_float, default=20.0)
    b_out.add_argument("--latency-ms", type=float, default=30.0)
    b_out.add_argument("--stripe-rate", type=_positive_int, default=250)
    b_out.add_argument("--concurrency", type=_positive_int, default=16)
    b_out.add_argument("--json", action="store_true")
    b_out.set_defaults(handler=_bench_load)
    b_replay = bench_sub.add_parser("replay", help="audit replay vs the database's own read")
    b_replay.add_argument("--events", type=_positive_int, default=1_000_000)
    b_replay.add_argument("--database-url", help="use this PostgreSQL instead of an embedded one")
    b_replay.add_argument("--json", action="store_true")
    b_replay.set_defaults(handler=_bench_replay)


# -- commands ---------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from adapters.demo import render_summary, run_demo
    from adapters.settings import Settings
    from adapters.telemetry import configure_tracing

    # The demo starts its own services: only the trace settings are read here.
    shutdown_tracing = configure_tracing(Settings())
    try:
        summary = run_demo(args.records, seed=args.seed)
    finally:
        shutdown_tracing()
    print(json.dumps(summary, indent=2) if args.json else render_summary(summary))
    return 0 if summary["conserved"] else EXIT_FAILURE


def _up(args: argparse.Namespace) -> int:
    from adapters.runtime import prepare
    from adapters.settings import Settings
    from infra.embedded import EmbeddedPostgres, TansuBroker

    with EmbeddedPostgres(args.data_dir) as pg, TansuBroker(args.kafka_port) as broker:
        prepare(Settings(database_url=pg.url, kafka_bootstrap=broker.bootstrap))
        print("# embedded PostgreSQL and Tansu are up; in another shell:")
        print(f"export BILLING_LEDGER_DATABASE_URL='{pg.url}'")
        print(f"export BILLING_LEDGER_KAFKA_BOOTSTRAP='{broker.bootstrap}'")
        print("# Ctrl-C stops both (the broker keeps messages in memory only)", flush=True)
        _wait_for_signal()
    return 0


def _produce(args: argparse.Namespace) -> int:
    from adapters.kafka_io import ensure_topics, make_producer, send_usage
    from adapters.settings import Settings
    from adapters.telemetry import configure_tracing

    settings = Settings()
    stream = sys.stdin.buffer if args.file == "-" else _open_input(args.file)
    ensure_topics(settings.kafka_bootstrap, [(settings.usage_topic, settings.usage_partitions)])
    producer = make_producer(settings.kafka_bootstrap)
    shutdown_tracing = configure_tracing(settings)
    sent = 0
    try:
        for line in stream:
            value = line.rstrip(b"\r\n")
            if not value.strip():
                continue
            send_usage(producer, settings.usage_topic, _customer_key(value), value)
            sent += 1
        producer.flush()
    finally:
        producer.close()
        stream.close()
        shutdown_tracing()
    print(f"sent {sent} record(s) to {settings.usage_topic}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    from adapters.settings import Settings
    from adapters.telemetry import configure_tracing

    settings = Settings()  # first: a bad setting is one line, before anything starts
    shutdown_tracing = configure_tracing(settings)
    try:
        return _run_workers(args, settings)
    finally:
        shutdown_tracing()  # flushes the spans still queued


def _run_workers(args: argparse.Namespace, settings: Settings) -> int:
    from adapters.health import HealthProbe, HealthServer
    from adapters.logs import configure_logging
    from adapters.runtime import open_ledger, prepare
    from adapters.workers import run_roles

    configure_logging(args.log_level)
    prepare(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    roles = list(ROLES) if args.role == "all" else [args.role]
    port = settings.health_port if args.health_port is None else args.health_port
    with contextlib.ExitStack() as stack:
        if port:
            stack.enter_context(HealthServer(HealthProbe(settings), settings.health_host, port))
        ledger = stack.enter_context(open_ledger(settings))
        run_roles(
            settings, ledger, roles, stop,
            kill_after_save=args.drill_kill_after_save, drill=args.drill,
        )  # fmt: skip
    return 0


def _health(args: argparse.Namespace) -> int:
    from adapters.health import HealthProbe, render
    from adapters.settings import Settings

    probe = HealthProbe(Settings(), cache_s=0)
    while True:
        report = probe.report()
        text = json.dumps(report, indent=2) if args.json else render(report)
        if args.watch is None:
            print(text)
            return 0 if report["status"] == "ok" else EXIT_FAILURE
        print("\x1b[H\x1b[2J" + text if sys.stdout.isatty() else text, flush=True)
        time.sleep(args.watch)


def _reverse(args: argparse.Namespace) -> int:
    from adapters.runtime import build_charger, open_ledger
    from adapters.settings import Settings

    settings = Settings()
    with open_ledger(settings) as ledger:
        result = build_charger(settings, ledger).reverse(args.txn_id, args.reason)
    print(f"transaction {args.txn_id}: {result}")
    return 0 if result == "reversed" else EXIT_FAILURE


def _history(args: argparse.Namespace) -> int:
    from adapters.runtime import open_ledger
    from adapters.settings import Settings
    from domain.ids import transaction_id

    if args.txn_id is not None and (args.customer or args.usage_id):
        raise _usage("give a transaction id, or --customer with --usage-id, not both")
    if args.txn_id is None:
        if not (args.customer and args.usage_id):
            raise _usage("give a transaction id, or both --customer and --usage-id")
        txn_id = transaction_id(args.customer, args.usage_id)
    else:
        txn_id = args.txn_id
    with open_ledger(Settings()) as ledger:
        events = ledger.history(txn_id)
    if not events:
        raise CliError(f"no transaction {txn_id}")
    rows = [_event_row(e) for e in events]
    if args.json:
        print(json.dumps({"transaction_id": str(txn_id), "events": rows}, indent=2, default=str))
    else:
        print(f"transaction {txn_id}")
        for row in rows:
            data = ", ".join(f"{k}={v}" for k, v in row["data"].items())
            print(f"  v{row['version']:<3} {row['timestamp']}  {row['event']:<13} {data}")
    return 0


def _set_limit(args: argparse.Namespace) -> int:
    from adapters.runtime import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency, format_minor, parse_exact_amount

    currency = check_currency(args.currency)
    limit = (
        None
        if args.amount.lower() in ("none", "unlimited")
        else (parse_exact_amount(args.amount, currency))
    )
    with open_ledger(Settings()) as ledger:
        ledger.set_spend_limit(args.customer, currency, limit)
    shown = "unlimited" if limit is None else format_minor(limit, currency)
    print(f"spend limit of {args.customer} in {currency}: {shown}")
    return 0


def _show_account(args: argparse.Namespace) -> int:
    from adapters.runtime import open_ledger
    from adapters.settings import Settings
    from domain.money import check_currency, format_minor

    currency = check_currency(args.currency)
    with open_ledger(Settings()) as ledger:
        account = ledger.account(args.customer, currency)
    if account is None:
        raise CliError(f"no account for {args.customer} in {currency}")
    body = {
        "customer_id": account.customer_id,
        "currency": currency,
        "spend_limit": account.spend_limit,
        "held": account.committed,  # in flight or charged: what counts against the limit
        "available": account.available,
    }
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        for key, value in body.items():
            shown = value if not isinstance(value, int) else format_minor(value, currency)
            print(f"{key:<12} {'unlimited' if value is None else shown}")
    return 0


def _balances(args: argparse.Namespace) -> int:
    from projections.balances import COLUMNS, balances

    if args.as_of is not None:
        return _balances_as_of(args, [c for c in COLUMNS if c != "updated_at"])
    rows = _query(lambda conn: balances(conn, customer=args.customer))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        _print_table(rows, [c for c in COLUMNS if c != "updated_at"])
    return 0


def _balances_as_of(args: argparse.Namespace, columns: list[str]) -> int:
    from adapters.audit import balances_as_of
    from adapters.settings import Settings

    customer = _checked_customer(args.customer)
    state = balances_as_of(Settings().database_url, args.as_of, customer)
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    print(f"as of {state['as_of']}")
    _print_table(state["balances"], columns)
    counts: dict[tuple[str, str], int] = {}
    for t in state["transactions"]:
        counts[t["customer_id"], t["state"]] = counts.get((t["customer_id"], t["state"]), 0) + 1
    rows = [
        {"customer_id": c, "state": s, "transactions": n} for (c, s), n in sorted(counts.items())
    ]
    _print_table(rows, ["customer_id", "state", "transactions"])
    return 0


def _audit(args: argparse.Namespace) -> int:
    from adapters.audit import Scope, audit, render, stripe_invoice_items
    from adapters.settings import Settings

    if args.start and args.end and args.start >= args.end:
        raise _usage("--from must be before --to")
    scope = Scope(customer=_checked_customer(args.customer), start=args.start, end=args.end)
    settings = Settings()
    items = (
        (lambda: stripe_invoice_items(settings.stripe(), scope.customer)) if args.stripe else None
    )
    report = audit(
        settings.database_url, scope, horizon=settings.overdue_after(), stripe_items=items
    )
    text = json.dumps(report.as_dict(), indent=2) if args.json else render(report)
    print(text)
    if args.out is not None:
        try:
            args.out.write_text(text + "\n")
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror}") from None
    return 0 if report.ok else EXIT_FAILURE


def _export(args: argparse.Namespace) -> int:
    from adapters.audit import export_events
    from adapters.settings import Settings

    customer = _checked_customer(args.customer)
    assert customer is not None  # required by the parser
    count = 0
    for line in export_events(Settings().database_url, customer, args.start, args.end):
        sys.stdout.write(json.dumps(line) + "\n")
        count += 1
    print(f"exported {count} event(s) of {customer}", file=sys.stderr)
    return 0


def _transactions(args: argparse.Namespace) -> int:
    from projections.transactions import transactions

    rows = _query(
        lambda conn: transactions(conn, state=args.state, customer=args.customer, limit=args.limit)
    )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        columns = ["transaction_id", "customer_id", "usage_id", "amount", "currency", "state"]
        _print_table(rows, [*columns, "attempts", "updated_at", "last_error"])
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    from adapters.runtime import open_ledger
    from adapters.settings import Settings
    from projections.base import UnknownProjection
    from projections.projector import PROJECTIONS, projection, rebuild

    if args.all == (args.projection is not None):
        raise _usage("give a projection name or --all, not both")
    try:
        names = [p.name for p in PROJECTIONS] if args.all else [projection(args.projection).name]
    except UnknownProjection as exc:
        raise _usage(str(exc)) from None
    settings = Settings()
    with open_ledger(settings) as ledger:
        for name in names:
            report = rebuild(settings.database_url, name, ledger.mapper.to_domain_event)
            print(f"rebuilt {report.name}: {report.rows} rows from {report.events} events")
    return 0


def _bench_ingest(args: argparse.Namespace) -> int:
    from adapters.bench import render, run_ingest_bench

    result = run_ingest_bench(
        args.records, batch=args.batch, database_url=args.database_url, workers=args.workers
    )
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def _bench_replay(args: argparse.Namespace) -> int:
    from adapters.bench_replay import render_replay, run_replay_bench

    result = run_replay_bench(args.events, database_url=args.database_url)
    print(json.dumps(result, indent=2) if args.json else render_replay(result))
    return 0 if result["audit_ok"] else EXIT_FAILURE


def _bench_load(args: argparse.Namespace) -> int:
    from adapters.bench_charge import render_load, run_load

    result = run_load(
        rate=args.rate,
        seconds=args.seconds,
        latency_ms=args.latency_ms,
        stripe_rate=args.stripe_rate,
        concurrency=args.concurrency,
        outage_at=args.outage_at,
        outage_s=args.outage_s,
    )
    print(json.dumps(result, indent=2) if args.json else render_load(result))
    return 0 if result["lost"] == 0 and result["duplicates"] == 0 else EXIT_FAILURE


# -- helpers ----------------------------------------------------------------------


def _query(run: Callable[[Any], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run a read-model query; an invalid filter is misuse (exit 2)."""
    import psycopg

    from adapters.settings import Settings
    from projections.base import InvalidFilter

    try:
        with psycopg.connect(Settings().database_url) as conn:
            return run(conn)
    except InvalidFilter as exc:
        raise _usage(str(exc)) from None


def _checked_customer(customer: str | None) -> str | None:
    """``customer`` if valid; an invalid one is misuse (exit 2)."""
    from projections.base import InvalidFilter, check_customer

    try:
        return check_customer(customer)
    except InvalidFilter as exc:
        raise _usage(str(exc)) from None


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(no rows)")
        return
    cells = [[("" if r[c] is None else str(r[c])) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _event_row(event: Any) -> dict[str, Any]:
    data = {
        k: v
        for k, v in vars(event).items()
        if k not in ("originator_id", "originator_version", "timestamp", "originator_topic")
    }
    return {
        "version": event.originator_version,
        "timestamp": event.timestamp.isoformat(),
        "event": type(event).__name__,
        "data": {k: str(v) if v is not None else None for k, v in data.items()},
    }


def _customer_key(value: bytes) -> bytes | None:
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    customer = doc.get("customer_id") if isinstance(doc, dict) else None
    return customer.encode() if isinstance(customer, str) else None


def _open_input(name: str) -> Any:
    try:
        return Path(name).open("rb")
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror}") from None


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def _usage(message: str) -> SystemExit:
    print(f"billing-ledger: error: {message}", file=sys.stderr)
    return SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _port_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else _port(text)


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port")
    return value


def _timestamp(text: str) -> datetime:
    """An ISO 8601 instant (``2026-12-02T10:00:00Z``); without an offset, UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 timestamp") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a transaction id (a UUID)") from None


def _one_line(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"setting BILLING_LEDGER_{where.upper()}: {first['msg']}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__module__ != __name__ else text


if __name__ == "__main__":
    sys.exit(main())
