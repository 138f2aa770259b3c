"""The command line: ``python -m infra.stripe_emulator [--port N] [--latency-ms 20] ...``.

This module owns the argument parser (one flag per setting, validated exactly like the
control API) and :func:`main`, which serves in the foreground until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from .emulator import StripeEmulator
from .settings import (
    DEFAULT_KEY_TTL_S,
    DEFAULT_PORT,
    INTEGER_SETTINGS,
    OUTAGE_MODES,
    SETTING_NAMES,
    coerce_setting,
)

__all__ = ["build_parser", "main"]

_NUMERIC_FLAGS: dict[str, str] = {
    "key_ttl_s": f"idempotency key lifetime in seconds (default {DEFAULT_KEY_TTL_S:g})",
    "latency_ms": "latency added to every API request, in ms",
    "error_rate": "probability (0..1) of an injected 500",
    "outage_seconds": "start with an outage that ends after this many seconds",
    "rate_limit_per_s": "admit at most this many API requests per sliding second (429 above)",
    "endpoint_rate_limit_per_s": "admit at most this many requests per second per endpoint",
    "drop_response_after_execute": "drop the response of the next N POST/DELETE executions",
    "drop_response_probability": "probability (0..1) of dropping a POST/DELETE response",
    "late_execute_next": "leave the next N amount updates unanswered; execute them later",
    "late_execute_probability": "probability (0..1) of executing an amount update late",
    "late_execute_s": "seconds after arrival a late amount update is executed (default 2)",
    "payment_failures": "decline the next N invoice payment attempts (402 card_declined)",
    "webhook_retry_base_s": "first webhook retry delay in seconds, doubled per attempt (1)",
    "webhook_max_attempts": "webhook delivery attempts before giving up (default 8)",
    "webhook_timeout_s": "seconds to wait for a webhook receiver's answer (default 10)",
    "webhook_delay_s": "delay every event's first webhook delivery by this many seconds",
    "webhook_duplicate_probability": "probability (0..1) of delivering an event twice",
    "webhook_duplicate_next": "deliver the next N events twice",
    "webhook_reorder": "hold N deliveries per endpoint, then send them in reverse order",
    "webhook_reorder_hold_s": "longest a delivery is held for reordering (default 2)",
    "seed": "random seed for injected errors, drops and duplicates",
}


def _arg_type(name: str) -> Callable[[str], object]:
    """An argparse ``type`` that parses a number and validates it like the control API."""

    def parse(text: str) -> object:
        try:
            value: object = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if name in INTEGER_SETTINGS and not isinstance(value, int):
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
        try:
            return coerce_setting(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in its messages
    return parse


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {port}")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.stripe_emulator",
        description="Serve an emulation of Stripe's v1 API (customers, invoice items, invoices, "
        "credit notes, events, signed webhooks) with fault injection. Control API under "
        "/_emulator/.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)"
    )
    for name, help_text in _NUMERIC_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=_arg_type(name), default=None, help=help_text)
    parser.add_argument("--outage", action="store_true", help="start with an outage on")
    parser.add_argument(
        "--outage-mode", choices=OUTAGE_MODES, default="503", help="outage behaviour"
    )
    parser.add_argument("--log-requests", action="store_true", help="log each request to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator in the foreground until SIGINT or SIGTERM."""
    args = build_parser().parse_args(argv)
    options: dict[str, Any] = {
        name: getattr(args, name)
        for name in SETTING_NAMES
        if name not in ("outage", "outage_mode") and getattr(args, name) is not None
    }
    emulator = StripeEmulator(
        host=args.host,
        port=args.port,
        outage=args.outage,
        outage_mode=args.outage_mode,
        log_requests=args.log_requests,
        **options,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    try:
        emulator.start()
    except OSError as exc:
        print(f"stripe emulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"stripe emulator listening on {emulator.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        emulator.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
