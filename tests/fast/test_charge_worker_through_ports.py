"""The charge process manager, through its ports: a fake consumer, a fake dead-letter
sink, the ledger in memory and a fake gateway. No message stops it (issue 11): what it
charges, what it sets aside and why, and where it stops."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.persistence import OperationalError
from eventsourcing.utils import get_topic

from adapters.charging.charger import Charger
from adapters.charging.messages import EventMessage
from adapters.charging.process_manager import ChargeWorker
from adapters.observability.metrics import metrics
from domain.saga import ChargeOutcome, RetryPolicy
from domain.transaction import BillingTransaction, TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import (
    FakeConsumer,
    FakeDeadLetters,
    FakeGateway,
    FakeRecord,
    memory_ledger,
    reserve,
)

POLICY = RetryPolicy(max_attempts=3, horizon=timedelta(hours=1))
RESERVED = get_topic(BillingTransaction.Reserved)


def _message(txn_id: UUID, topic: str = RESERVED) -> bytes:
    return EventMessage(7, txn_id, 2, topic, topic.rsplit(".", 1)[-1]).to_json()


def _worker(
    batch: list[bytes | None], gateway: FakeGateway | None = None, ledger: Any = None
) -> tuple[ChargeWorker, FakeDeadLetters]:
    records = [FakeRecord("billing.events", 0, i, b"acme", v) for i, v in enumerate(batch)]
    letters = FakeDeadLetters()
    charger = Charger(ledger or memory_ledger(), gateway or FakeGateway(), POLICY)
    worker = ChargeWorker(
        charger,
        FakeConsumer([records]),  # type: ignore[arg-type]
        letters,
        group="charge",
        topic="billing.events",
        parallel=2,
    )
    return worker, letters


def _set_aside_total(code: str) -> float:
    pattern = rf'^billing_events_set_aside_total{{code="{code}"}} (\S+)$'
    found = re.search(pattern, metrics().render().decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


# Each of these stopped the charge role (and the process) on every start before issue 11.
HOSTILE: list[tuple[bytes | None, str]] = [
    (b"[]", "expected a JSON object, got list"),
    (b"not json", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"notification_id": 1, "originator_version": 2, "topic": "t", "event": "e"}',
     "originator_id: missing"),
    (b'{"notification_id": 1, "originator_id": "not-a-uuid", "originator_version": 2,'
     b' "topic": "t", "event": "e"}', "originator_id: not a UUID: 'not-a-uuid'"),
    (b'{"notification_id": 1, "originator_id": 42, "originator_version": 2,'
     b' "topic": "t", "event": "e"}', "originator_id: expected a string, got int"),
    (b'{"notification_id": 1, "originator_id": "00000000-0000-0000-0000-000000000001",'
     b' "originator_version": 2, "topic": "domain.transaction:BillingTransaction.Refunded",'
     b' "event": "Refunded"}', "unknown event 'domain.transaction:BillingTransaction.Refunded'"),
    (b"\x00\xff\xfe garbage \x80", "not valid JSON: "),
    (None, "empty message (no value)"),
]  # fmt: skip


def test_malformed_messages_are_set_aside_with_their_reasons_and_the_valid_ones_charged() -> None:
    ledger = memory_ledger()
    first, second = reserve(ledger, 2)
    batch = [_message(first), *(value for value, _ in HOSTILE), _message(second)]
    worker, letters = _worker(batch, ledger=ledger)
    before = _set_aside_total("invalid")

    assert worker.poll_once() == len(batch)

    assert [ledger.transaction(t).state for t in (first, second)] == [TxnState.CHARGED] * 2
    reasons = {offset: d.reason for (_, _, offset), d in letters.letters.items()}
    assert sorted(reasons) == list(range(1, len(HOSTILE) + 1))
    for offset, (value, reason) in enumerate(HOSTILE, start=1):
        assert reasons[offset].startswith(reason), (reasons[offset], reason)
        assert letters.letters["billing.events", 0, offset].payload == value
    assert worker.set_aside == len(HOSTILE) and worker.driven == 2
    assert _set_aside_total("invalid") - before == 3  # missing, not a UUID, wrong type
    assert len(worker.consumer.commits) == 1  # type: ignore[attr-defined]


def test_a_reserved_of_a_transaction_the_ledger_does_not_have_is_set_aside() -> None:
    stranger = uuid4()
    worker, letters = _worker([_message(stranger)])
    worker.poll_once()
    [letter] = letters.letters.values()
    assert letter.reason == f"unknown transaction {stranger}"


def test_other_known_events_pass_without_being_set_aside() -> None:
    ledger = memory_ledger()
    [txn_id] = reserve(ledger, 1)
    metered = get_topic(BillingTransaction.Metered)
    worker, letters = _worker([_message(txn_id, metered)], ledger=ledger)
    assert worker.poll_once() == 1
    assert letters.letters == {} and worker.driven == 0


class _BuggyGateway(FakeGateway):
    """A gateway with a bug for one transaction (the port says charge never raises)."""

    victim: UUID | None = None

    def charge(self, txn: BillingTransaction, age: timedelta) -> ChargeOutcome:
        if txn.id == self.victim:
            raise KeyError("a bug in the gateway")
        return super().charge(txn, age)


def test_anything_unexpected_one_message_raises_sets_it_aside_and_the_next_is_charged() -> None:
    ledger = memory_ledger()
    victim, other = reserve(ledger, 2)
    gateway = _BuggyGateway()
    gateway.victim = victim
    worker, letters = _worker([_message(victim), _message(other)], gateway, ledger)
    worker.poll_once()
    assert letters.letters["billing.events", 0, 0].reason == "internal: KeyError"
    assert ledger.transaction(other).state is TxnState.CHARGED
    assert ledger.transaction(victim).state is TxnState.RESERVED  # the reconciler's, later


def test_a_database_error_fails_the_poll_and_blames_no_message() -> None:
    class Unreachable(BillingLedger):
        def transaction(self, txn_id: UUID) -> BillingTransaction:
            raise OperationalError("connection refused")

    ledger = Unreachable(memory_ledger().prices, env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    worker, letters = _worker([_message(uuid4())], ledger=ledger)
    with pytest.raises(OperationalError):
        worker.poll_once()
    assert letters.letters == {}
    assert worker.consumer.commits == []  # type: ignore[attr-defined]


def test_a_stop_between_messages_handles_no_more_and_commits_no_offset() -> None:
    ledger = memory_ledger()
    first, second = reserve(ledger, 2)
    stop = threading.Event()

    class StopAfterOne(FakeGateway):
        def charge(self, txn: BillingTransaction, age: timedelta) -> ChargeOutcome:
            stop.set()  # as SIGTERM arriving while this charge is in flight
            return super().charge(txn, age)

    worker, _ = _worker([_message(first), _message(second)], StopAfterOne(), ledger)
    worker.run(stop)  # returns once stop is set: here, after the first poll
    assert ledger.transaction(first).state is TxnState.CHARGED  # the unit in flight finished
    assert ledger.transaction(second).state is TxnState.RESERVED
    assert worker.consumer.commits == []  # type: ignore[attr-defined]
