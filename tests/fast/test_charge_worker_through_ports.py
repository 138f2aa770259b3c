"""The charge process manager, through its ports: a fake consumer, a fake dead-letter
sink and a real line scheduler (not running) over the ledger in memory. No message
stops it (issue 11): what it schedules, what it sets aside and why, and where it stops."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import OperationalError
from eventsourcing.utils import get_topic

from adapters.charging.messages import MAX_EVENT_BYTES, EventMessage, decode_event
from adapters.charging.process_manager import ChargeWorker
from adapters.charging.pusher import LinePusher
from adapters.charging.scheduler import LineScheduler
from adapters.observability.metrics import metrics
from domain.invoice_line import InvoiceLine
from domain.ports import DeadLetter
from domain.saga import RetryPolicy
from domain.transaction import BillingTransaction
from tests.fast.fakes import FakeConsumer, FakeDeadLetters, FakeGateway, FakeRecord, memory_ledger

POLICY = RetryPolicy(horizon=timedelta(hours=1))
SETTLED = get_topic(InvoiceLine.Settled)


def _message(line: UUID, topic: str = SETTLED) -> bytes:
    return EventMessage(7, line, 2, topic, topic.rsplit(".", 1)[-1]).to_json()


def _scheduler(cls: type[LineScheduler] = LineScheduler) -> LineScheduler:
    pusher = LinePusher(memory_ledger(), FakeGateway(), POLICY)
    return cls(pusher, settle_interval_s=10.0, workers=1)


def _worker(
    batch: list[bytes | None],
    scheduler: LineScheduler | None = None,
    letters: Any = None,
) -> tuple[ChargeWorker, FakeDeadLetters]:
    records = [FakeRecord("billing.events", 0, i, b"acme", v) for i, v in enumerate(batch)]
    letters = letters or FakeDeadLetters()
    worker = ChargeWorker(
        scheduler or _scheduler(),
        FakeConsumer([records]),  # type: ignore[arg-type]
        letters,
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
     b' "originator_version": 2, "topic": "domain.invoice_line:InvoiceLine.Refunded",'
     b' "event": "Refunded"}', "unknown event 'domain.invoice_line:InvoiceLine.Refunded'"),
    (b"\x00\xff\xfe garbage \x80", "not valid JSON: "),
    (None, "empty message (no value)"),
]  # fmt: skip


def test_malformed_messages_are_set_aside_with_their_reasons_and_line_changes_scheduled() -> None:
    first, second = uuid4(), uuid4()
    batch = [_message(first), *(value for value, _ in HOSTILE), _message(second)]
    scheduler = _scheduler()
    worker, letters = _worker(batch, scheduler)
    before = _set_aside_total("invalid")

    assert worker.poll_once() == len(batch)

    assert scheduler.waiting() == 2 and worker.scheduled == 2
    reasons = {offset: d.reason for (_, _, offset), d in letters.letters.items()}
    assert sorted(reasons) == list(range(1, len(HOSTILE) + 1))
    for offset, (value, reason) in enumerate(HOSTILE, start=1):
        assert reasons[offset].startswith(reason), (reasons[offset], reason)
        assert letters.letters["billing.events", 0, offset].payload == value
    assert worker.set_aside == len(HOSTILE)
    assert _set_aside_total("invalid") - before == 3  # missing, not a UUID, wrong type
    assert len(worker.consumer.commits) == 1  # type: ignore[attr-defined]


def test_other_known_events_pass_without_being_set_aside_or_scheduled() -> None:
    reserved = get_topic(BillingTransaction.Reserved)
    scheduler = _scheduler()
    worker, letters = _worker([_message(uuid4(), reserved)], scheduler)
    assert worker.poll_once() == 1
    assert letters.letters == {} and scheduler.waiting() == 0 and worker.scheduled == 0


class _BuggyScheduler(LineScheduler):
    """A scheduler with a bug for one line."""

    victim: UUID | None = None

    def changed(self, line_id: UUID, **kwargs: Any) -> None:
        if line_id == self.victim:
            raise KeyError("a bug in the scheduler")
        super().changed(line_id, **kwargs)


def test_anything_unexpected_one_message_raises_sets_it_aside_and_the_next_is_scheduled() -> None:
    victim, other = uuid4(), uuid4()
    scheduler = _scheduler(_BuggyScheduler)
    scheduler.victim = victim  # type: ignore[attr-defined]
    worker, letters = _worker([_message(victim), _message(other)], scheduler)
    worker.poll_once()
    assert letters.letters["billing.events", 0, 0].reason == "internal: KeyError"
    assert letters.letters["billing.events", 0, 0].code == "internal"
    assert scheduler.waiting() == 1  # the other line; the victim's is the reconciler's


def test_a_database_error_setting_aside_fails_the_poll_and_commits_nothing() -> None:
    class Unreachable(FakeDeadLetters):
        def record(self, letters: Sequence[DeadLetter]) -> int:
            raise OperationalError("connection refused")

    worker, _ = _worker([b"not json"], letters=Unreachable())
    with pytest.raises(OperationalError):
        worker.poll_once()  # the role fails and is restarted; the message is read again
    assert worker.consumer.commits == []  # type: ignore[attr-defined]


def test_a_stop_between_messages_handles_no_more_and_commits_no_offset() -> None:
    first, second = uuid4(), uuid4()
    stop = threading.Event()

    class StopAfterOne(LineScheduler):
        def changed(self, line_id: UUID, **kwargs: Any) -> None:
            super().changed(line_id, **kwargs)
            stop.set()  # as SIGTERM arriving while this message is handled

    scheduler = _scheduler(StopAfterOne)
    worker, _ = _worker([_message(first), _message(second)], scheduler)
    turns: list[None] = []
    worker.pulse = lambda: turns.append(None) if len(turns) < 10 else stop.set()  # a guard
    worker.run(stop)  # returns once stop is set: here, after the first message
    assert worker.scheduled == 1 and scheduler.waiting() == 1
    assert worker.consumer.commits == []  # type: ignore[attr-defined]


class _TimedConsumer(FakeConsumer):
    """The fake consumer, remembering how long each poll may block."""

    timeouts: list[int]
    stop: threading.Event  # set by the third poll (the batches are read by then)

    def poll(self, timeout_ms: int = 0) -> dict[Any, list[FakeRecord]]:
        self.timeouts.append(timeout_ms)
        if len(self.timeouts) == 3:
            self.stop.set()
        return super().poll(timeout_ms)


def test_a_line_change_is_scheduled_as_its_customers_and_keys_that_are_not_utf8_still_count() -> (
    None
):
    lines = [uuid4() for _ in range(4)]
    keys = [b"acme", b"acme", b"ac\xffme", None]
    records = [
        FakeRecord("billing.events", 0, i, key, _message(line))
        for i, (key, line) in enumerate(zip(keys, lines, strict=True))
    ]
    scheduler = _scheduler()
    letters = FakeDeadLetters()
    worker = ChargeWorker(scheduler, FakeConsumer([records]), letters)  # type: ignore[arg-type]
    assert worker.poll_once() == 4
    assert letters.letters == {} and worker.scheduled == 4
    stop = threading.Event()
    taken = [scheduler._take(stop) for _ in range(4)]
    # acme's second line waits for its first; the undecodable key is a customer of its own
    # ("ac\ufffdme"), and a change without a key has no customer to wait for.
    assert taken[3] is None and {lines[2], lines[3]} <= set(taken)
    assert len({lines[0], lines[1]} & set(taken)) == 1


def test_run_polls_at_most_200_ms_at_a_time_and_counts_every_message_seen() -> None:
    stop = threading.Event()
    batches = [
        [FakeRecord("billing.events", 0, i, b"acme", _message(uuid4())) for i in range(2)],
        [FakeRecord("billing.events", 0, 2, b"acme", None)],
    ]
    consumer = _TimedConsumer(batches)
    consumer.timeouts, consumer.stop = [], stop
    letters = FakeDeadLetters()
    worker = ChargeWorker(_scheduler(), consumer, letters)  # type: ignore[arg-type]
    worker.run(stop)
    assert consumer.timeouts == [200, 200, 200]
    assert (worker.seen, worker.scheduled, worker.set_aside) == (3, 2, 1)


def test_a_message_set_aside_keeps_its_key() -> None:
    records = [FakeRecord("billing.events", 3, 9, b"acme", b"not json")]
    letters = FakeDeadLetters()
    worker = ChargeWorker(_scheduler(), FakeConsumer([records]), letters)  # type: ignore[arg-type]
    worker.poll_once()
    letter = letters.letters["billing.events", 3, 9]
    assert (letter.key, letter.payload, letter.code) == (b"acme", b"not json", "not_json")


def _reason(value: bytes) -> str:
    """Why the charge worker sets ``value`` aside (its dead letter's reason)."""
    letters = FakeDeadLetters()
    records = [FakeRecord("billing.events", 0, 0, b"acme", value)]
    ChargeWorker(_scheduler(), FakeConsumer([records]), letters).poll_once()  # type: ignore[arg-type]
    return letters.letters["billing.events", 0, 0].reason


def _body(**fields: Any) -> bytes:
    body = {"notification_id": 7, "originator_id": str(uuid4()), "originator_version": 2,
            "topic": SETTLED, "event": "Settled", **fields}  # fmt: skip
    return json.dumps(body).encode()


def test_a_field_of_the_wrong_type_is_set_aside_naming_the_type_it_has() -> None:
    assert _reason(_body(notification_id="7")) == "notification_id: expected an integer, got str"
    assert _reason(_body(originator_version=[2])) == (
        "originator_version: expected an integer, got list"
    )


def test_an_integer_of_20_characters_is_read_and_one_of_21_set_aside() -> None:
    scheduler = _scheduler()
    longest = -1234567890123456789  # a sign and 19 digits: the smallest bigint's width
    worker, letters = _worker([_body(notification_id=longest)], scheduler)
    worker.poll_once()
    assert letters.letters == {} and worker.scheduled == 1
    assert _reason(_body(notification_id=longest * 10)) == (
        "not valid JSON: an integer of 21 characters"
    )


def test_an_unknown_events_topic_is_shown_up_to_80_characters_then_cut() -> None:
    exactly = "domain.x:" + "T" * 63 + ".Settled"
    assert len(exactly) == 80
    assert _reason(_body(topic=exactly)) == f"unknown event '{exactly}'"
    longer = exactly + "d"
    assert _reason(_body(topic=longer, event="Settledd")) == f"unknown event '{exactly}'..."


def test_a_number_that_is_not_an_integer_is_set_aside_as_not_json() -> None:
    assert _reason(_body(notification_id=7.5)) == "not valid JSON: '7.5' is not an integer"
    nan = _body().replace(b'"notification_id": 7', b'"notification_id": NaN')
    assert _reason(nan) == "not valid JSON: 'NaN' is not an integer"


def test_a_message_of_exactly_the_size_limit_is_read_and_one_byte_more_set_aside() -> None:
    body = _body()
    at_limit = body[:-1] + b" " * (MAX_EVENT_BYTES - len(body)) + b"}"
    assert len(at_limit) == MAX_EVENT_BYTES
    worker, letters = _worker([at_limit])
    worker.poll_once()
    assert letters.letters == {} and worker.scheduled == 1
    assert _reason(at_limit + b" ") == (
        f"message of {MAX_EVENT_BYTES + 1} bytes exceeds the {MAX_EVENT_BYTES}-byte limit"
    )


def test_an_event_class_of_the_domain_defined_after_the_first_message_is_known() -> None:
    _reason(b"[]")  # a first message: the known events are looked up
    # An aggregate's event, as a domain module imported later defines it (only
    # adapters.charging.messages walks the event classes; it stays known to it).
    type("Late", (DomainEvent,), {"__module__": "domain.late", "__qualname__": "Later.Late"})
    message = EventMessage(1, uuid4(), 1, "domain.late:Later.Late", "Late")
    assert decode_event(message.to_json()) == message


def test_an_event_its_topic_does_not_name_is_set_aside_showing_both() -> None:
    assert _reason(_body(event="Removed")) == (
        f"unknown event 'Removed' (its topic says '{SETTLED}')"
    )
