"""What a person sees when a command fails: one sentence that says what went wrong and
what to do, and an exit status a script can act on. Never a traceback or an exception's
class name, unless ``--debug``.

Exit statuses:

====  ===========================================================================
0     done
1     a check failed (an audit finding, health not ok) or the command could not
      complete what it started
2     misuse: a bad argument or setting, an id that names nothing, a login without
      the right to do what was asked
3     a service is unreachable: PostgreSQL, the Kafka broker, Stripe
130   interrupted (Ctrl-C, SIGTERM)
====  ===========================================================================

``KNOWN`` is the table of the errors a user can meet, each with its status and its
sentence; anything not in it is a bug of ours, reported as one line with the status
1 and a request to run again with ``--debug``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXIT_FAILURE",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "KNOWN",
    "Known",
    "explain",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


@dataclass(frozen=True)
class Known:
    """An error a user can meet: which exceptions, the exit status, the sentence."""

    kind: str
    matches: Callable[[BaseException], bool]
    status: int
    say: Callable[[BaseException], str]


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # Some libraries start their messages with their class name (kafka-python, twice).
    text = re.sub(r"^(?:[A-Z]\w*(?:Error|Exception): )+", "", text)
    return text or "no detail given"


def _named(*names: str) -> Callable[[BaseException], bool]:
    """Matches an exception whose class, or a base of it, has one of ``names`` (no import
    of the libraries that define them: the CLI starts fast and each command imports
    only what it uses)."""

    def matches(exc: BaseException) -> bool:
        return any(cls.__name__ in names for cls in type(exc).__mro__)

    return matches


def _caused_by(*names: str) -> Callable[[BaseException], bool]:
    """Like ``_named``, for the exception or one it was raised from: the event store
    raises its own ``ProgrammingError`` from psycopg's ``InsufficientPrivilege``."""
    named = _named(*names)

    def matches(exc: BaseException) -> bool:
        cause: BaseException | None = exc
        while cause is not None:
            if named(cause):
                return True
            cause = cause.__cause__
        return False

    return matches


def _not_found(exc: BaseException) -> str:
    found = re.search(r"UUID\('([0-9a-f-]{36})'\)", str(exc))
    what = found.group(1) if found else "the id given"
    return (
        f"nothing in the ledger has the id {what}: check it (`billing-ledger transactions`,"
        " `invoices list`, `history --customer C --usage-id U`)"
    )


def _privilege(exc: BaseException) -> str:
    return (
        f"this login may not do that ({_first_line(exc)}): the workers and prices publish"
        " write as billing_writer, the audit and export read the history as"
        " billing_auditor, migrate and rebuild run as the schema owner"
        " (BILLING_LEDGER_MIGRATE_DATABASE_URL), people read as billing_reader; set"
        " BILLING_LEDGER_DATABASE_URL to the login the command needs"
    )


def _database(exc: BaseException) -> str:
    detail = _first_line(exc)
    where = re.search(r'\bat "?([^"\s,]+)"?', detail)
    place = f" at {where.group(1)}" if where else ""
    return (
        f"cannot reach PostgreSQL{place} ({detail}): is it running, and is"
        " BILLING_LEDGER_DATABASE_URL right? (`billing-ledger up` starts an embedded one)"
    )


def _broker(exc: BaseException) -> str:
    return (
        f"no Kafka broker answered ({_first_line(exc)}): is it running, and is"
        " BILLING_LEDGER_KAFKA_BOOTSTRAP right? (`billing-ledger up` starts an embedded one)"
    )


def _stripe(exc: BaseException) -> str:
    return (
        f"cannot reach Stripe ({_first_line(exc)}): check BILLING_LEDGER_STRIPE_API_BASE"
        " and the network"
    )


def _setting(exc: Any) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"setting BILLING_LEDGER_{where.upper()}: {first['msg']}"


def _gave_up(exc: BaseException) -> str:
    return (
        f"the worker stopped: {_first_line(exc)}; the cause is in its log lines `role"
        " failed, restarting` (docs: operate/runbooks/worker-restarting); the process"
        " exits for its supervisor (systemd, Kubernetes) to start it again"
    )


def _as_said(exc: BaseException) -> str:
    return _first_line(exc)


KNOWN: tuple[Known, ...] = (
    Known("not found", _named("AggregateNotFoundError"), EXIT_USAGE, _not_found),
    Known("insufficient privilege", _caused_by("InsufficientPrivilege"), EXIT_USAGE, _privilege),
    Known("database unreachable", _named("OperationalError"), EXIT_UNREACHABLE, _database),
    Known(
        "broker unreachable",
        _named("KafkaTimeoutError", "BrokerUnreachable"),
        EXIT_UNREACHABLE,
        _broker,
    ),
    Known("stripe unreachable", _named("APIConnectionError"), EXIT_UNREACHABLE, _stripe),
    Known("bad setting", _named("ValidationError"), EXIT_USAGE, _setting),
    # The schema behind or ahead of this build: each message says what to run.
    Known("schema not current", _named("SchemaError"), EXIT_FAILURE, _as_said),
    Known("store gave up", _named("ConcurrencyExhausted"), EXIT_FAILURE, _as_said),
    Known("rebuild could not swap", _named("RebuildLocked"), EXIT_FAILURE, _as_said),
    Known("worker gave up", _named("WorkerFailed"), EXIT_FAILURE, _gave_up),
    Known("not acknowledged", _named("PublishFailed"), EXIT_FAILURE, _as_said),
    # The domain's refusals of a value a person typed (an amount, a currency, a limit).
    Known("bad argument", _named("ValueError", "BillingError"), EXIT_USAGE, _as_said),
)


def explain(exc: BaseException) -> tuple[str, int]:
    """The sentence and the exit status for ``exc``."""
    status = getattr(exc, "exit_status", None)
    if isinstance(status, int):  # a command's own refusal (``CliError``): said as is
        return _first_line(exc), status
    for known in KNOWN:
        if known.matches(exc):
            return known.say(exc), known.status
    return (
        f"unexpected error ({_first_line(exc)}): run again with --debug for the details,"
        " and report it",
        EXIT_FAILURE,
    )
