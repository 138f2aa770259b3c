"""The table of errors a person can meet (``adapters.cli.errors``): each kind's sentence
and exit status, matched by the exception's class or a base of it."""

from __future__ import annotations

from uuid import UUID

import psycopg
import pytest
from eventsourcing.application import AggregateNotFoundError
from kafka.errors import KafkaTimeoutError
from psycopg import errors as pgerrors
from pydantic import BaseModel, ValidationError

from adapters.broker import BrokerUnreachable
from adapters.cli.args import CliError
from adapters.cli.errors import EXIT_FAILURE, EXIT_UNREACHABLE, EXIT_USAGE, explain
from adapters.errors import WorkerFailed
from domain.errors import IllegalTransition
from store.errors import ConcurrencyExhausted, SchemaAhead

TXN = UUID("12345678-1234-5678-1234-567812345678")


class _Limit(BaseModel):
    trace_exporter: int


def _setting_error() -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Limit(trace_exporter="x")  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize(
    ("exc", "status", "said"),
    [
        (
            AggregateNotFoundError(f"Aggregate {TXN!r} version None not found."),
            EXIT_USAGE,
            f"nothing in the ledger has the id {TXN}: check it",
        ),
        (
            pgerrors.InsufficientPrivilege("permission denied for table billingledger_events"),
            EXIT_USAGE,
            "this login may not do that (permission denied for table billingledger_events)",
        ),
        (
            psycopg.OperationalError('connection failed: connection to server at "10.0.0.9"'),
            EXIT_UNREACHABLE,
            "cannot reach PostgreSQL at 10.0.0.9 (connection failed",
        ),
        (KafkaTimeoutError("Unable to bootstrap"), EXIT_UNREACHABLE, "no Kafka broker answered"),
        (BrokerUnreachable("k:9092: refused"), EXIT_UNREACHABLE, "(k:9092: refused)"),
        (_setting_error(), EXIT_USAGE, "setting BILLING_LEDGER_TRACE_EXPORTER: Input should be"),
        (SchemaAhead("the database's schema is at 9"), EXIT_FAILURE, "schema is at 9"),
        (ConcurrencyExhausted("could not claim"), EXIT_FAILURE, "could not claim"),
        (
            WorkerFailed("charge worker failed 5 times within 60 s; last: boom"),
            EXIT_FAILURE,
            "the worker stopped: charge worker failed 5 times within 60 s; last: boom; the"
            " cause is in its log lines `role failed, restarting`",
        ),
        (ValueError("-5 is not a non-negative amount"), EXIT_USAGE, "-5 is not a non-negative"),
        (IllegalTransition("transaction t is not charged"), EXIT_USAGE, "is not charged"),
        (CliError("no account for x in USD", 2), EXIT_USAGE, "no account for x in USD"),
        (CliError("cannot write out.json"), EXIT_FAILURE, "cannot write out.json"),
    ],
)
def test_each_known_error_has_its_sentence_and_status(
    exc: BaseException, status: int, said: str
) -> None:
    message, code = explain(exc)
    assert code == status
    assert said in message
    assert type(exc).__name__ not in message


def test_a_database_error_names_its_setting_and_the_embedded_one() -> None:
    message, _ = explain(psycopg.OperationalError("timeout expired"))
    assert "BILLING_LEDGER_DATABASE_URL" in message and "billing-ledger up" in message


def test_an_error_nobody_expected_asks_for_debug_without_its_class_name() -> None:
    class Surprise(RuntimeError):
        pass

    message, code = explain(Surprise("a bug of ours"))
    assert code == EXIT_FAILURE
    assert message == (
        "unexpected error (a bug of ours): run again with --debug for the details, and report it"
    )


def test_an_error_without_words_still_says_something() -> None:
    message, _ = explain(ValueError())
    assert message == "no detail given"


def test_a_database_error_without_an_address_names_none() -> None:
    message, _ = explain(psycopg.OperationalError("the server said that it is shutting down"))
    assert message.startswith("cannot reach PostgreSQL (the server said that it is")


def test_the_event_stores_error_raised_from_a_missing_privilege_is_that_privilege() -> None:
    from eventsourcing.persistence import ProgrammingError

    denied = pgerrors.InsufficientPrivilege("permission denied for table billingledger_snapshots")
    try:
        try:
            raise denied
        except pgerrors.InsufficientPrivilege as exc:
            raise ProgrammingError(str(exc)) from exc
    except ProgrammingError as wrapped:
        message, code = explain(wrapped)
    assert code == EXIT_USAGE
    assert message.startswith(
        "this login may not do that (permission denied for table billingledger_snapshots)"
    )
    assert "prices publish" in message


def test_an_error_raised_from_another_than_a_privilege_is_unexpected() -> None:
    unexpected = RuntimeError("a bug of ours")
    unexpected.__cause__ = RuntimeError("permission denied")
    unexpected.__cause__.__cause__ = KeyError("x")
    assert explain(unexpected)[1] == EXIT_FAILURE
