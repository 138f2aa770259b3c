"""``billing-ledger``: the command line, and the error boundary of every command.

Misuse gets one line on stderr and exit status 2; a failure of a service (database,
broker, settings) gets one line and exit status 1. Never a traceback. The commands
live in one module per group (``service``, ``ledger``, ``audit``, ``tools``); each
builds what it needs through ``adapters.bootstrap``, the composition root.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence

from adapters.cli import audit, ledger, service, tools
from adapters.cli.args import EXIT_FAILURE, Parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``billing-ledger`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[..., int] = args.handler
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


def build_parser() -> Parser:
    p = Parser(
        prog="billing-ledger",
        description="Event-sourced usage billing: Kafka usage in, PostgreSQL events, Stripe out.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (tools, service, ledger, audit):
        group.add_commands(sub)
    return p


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _one_line(exc: BaseException) -> str:
    from pydantic import ValidationError

    from adapters.cli.args import CliError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"setting BILLING_LEDGER_{where.upper()}: {first['msg']}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CliError) else f"{type(exc).__name__}: {text}"
