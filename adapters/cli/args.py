"""What the command line accepts: argument types, usage errors, the parser class.

Misuse is one line on stderr and exit status 2 (``usage``, the parser's ``error``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn
from uuid import UUID

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "CliError",
    "Parser",
    "checked_customer",
    "int_arg",
    "invoice_uuid",
    "non_negative_float",
    "period_moment",
    "port",
    "port_or_zero",
    "positive_float",
    "positive_int",
    "read_file",
    "timestamp",
    "txn_uuid",
    "usage",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2


class CliError(Exception):
    """Raised when a command cannot do what was asked; the message is shown as is, and
    the process exits with ``status`` (``adapters.cli.errors``: 1 a failure, 2 misuse)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = status


class Parser(argparse.ArgumentParser):
    """argparse, with misuse as one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def usage(message: str) -> SystemExit:
    """Misuse found after parsing: print one line; raise the returned SystemExit."""
    print(f"billing-ledger: error: {message}", file=sys.stderr)
    return SystemExit(EXIT_USAGE)


def check_writable(path: Path, option: str) -> None:
    """Before a long command runs: refuse (exit 2) an output ``path`` that could not be
    written afterwards: a directory, or one whose directory takes no new file (a file
    written atomically is a temporary file there, renamed). Nothing is left behind."""
    if path.is_dir():
        raise CliError(f"{option} {path}: it is a directory", EXIT_USAGE)
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise CliError(f"{option} {path}: cannot write there: {exc.strerror}", EXIT_USAGE) from None


def checked_customer(customer: str | None) -> str | None:
    """``customer`` if valid; an invalid one is misuse (exit 2)."""
    from projections.base import InvalidFilter, check_customer

    try:
        return check_customer(customer)
    except InvalidFilter as exc:
        raise usage(str(exc)) from None


def read_file(path: Path, what: str) -> str:
    """The text of ``path`` (UTF-8), or misuse naming ``what`` it was to be."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the {what} {path}: {exc}", EXIT_USAGE) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def port_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else port(text)


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port")
    return value


def timestamp(text: str) -> datetime:
    """An ISO 8601 instant (``2026-12-02T10:00:00Z``); without an offset, UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 timestamp") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def period_moment(text: str) -> datetime:
    """A period given as ``YYYY-MM`` (its first instant) or an ISO 8601 instant in it."""
    if len(text) == 7 and text[4] == "-" and text[:4].isdigit() and text[5:].isdigit():
        text += "-01"
    try:
        return timestamp(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a period: give YYYY-MM (2026-12) or an ISO 8601 instant in it"
        ) from None


def invoice_uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an invoice id (a UUID)") from None


def txn_uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a transaction id (a UUID)") from None
