"""``billing-ledger``: the command line, and the error boundary of every command.

Every error is one line on stderr that says what to do, with the exit status of its
kind (``adapters.cli.errors``: 2 misuse, 1 a failed check, 3 a service unreachable);
never a traceback, unless ``--debug``. The commands live in one module per group
(``service``, ``ledger``, ``audit``, ``tools``); each builds what it needs through
``adapters.bootstrap``, the composition root.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata

from adapters.cli import (
    alerts,
    audit,
    contracts,
    credits,
    dead_letters,
    ledger,
    prices,
    service,
    tools,
)
from adapters.cli.args import Parser
from adapters.cli.errors import explain
from adapters.cli.help import teach

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``billing-ledger`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[..., int] = args.handler
    debug: bool = args.debug
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
        if debug:
            traceback.print_exc()
        message, status = explain(exc)
        print(f"billing-ledger: error: {message}", file=sys.stderr)
        return status


def build_parser() -> Parser:
    p = Parser(
        prog="billing-ledger",
        description="Event-sourced usage billing: Kafka usage in, PostgreSQL events, Stripe out.",
        epilog="Exit status: 0 done, 1 a check failed, 2 misuse, 3 a service unreachable."
        " Settings come from BILLING_LEDGER_* environment variables"
        " (docs/reference/configuration.md).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    p.add_argument("--debug", action="store_true", help="on an error, print its traceback as well")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (tools, service, ledger, prices, contracts, credits, dead_letters, audit, alerts):
        group.add_commands(sub)
    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"), help="your shell")
    completion.set_defaults(handler=lambda args: _completion(p, args.shell))
    teach(p)
    return p


def _completion(parser: Parser, shell: str) -> int:
    import shtab

    print(shtab.complete(parser, shell))
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _version() -> str:
    try:
        return metadata.version("billing-ledger")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"
