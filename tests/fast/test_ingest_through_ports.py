"""The ingest worker, through its ports: fake Kafka clients, a fake dead-letter sink and
the ledger in memory. What is recorded, what is set aside, and that offsets are
committed only after both."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from typing import Any

import pytest
from kafka.errors import RebalanceInProgressError

from adapters.ingest.worker import IngestWorker
from domain.ids import transaction_id
from domain.price_book import PriceSchedule
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import (
    FakeConsumer,
    FakeDeadLetters,
    FakeProducer,
    FakeRecord,
    FaultyPrices,
    memory_ledger,
    usage,
)


def _record(offset: int, value: bytes | None, partition: int = 0) -> FakeRecord:
    return FakeRecord("usage", partition, offset, b"acme", value)


def _worker(
    batches: list[list[FakeRecord]],
    ledger: BillingLedger | None = None,
    *,
    dlq_max_message_bytes: int = 1_000_000,
    batch_max_records: int = 2000,
) -> tuple[IngestWorker, FakeDeadLetters]:
    letters = FakeDeadLetters()
    worker = IngestWorker(
        ledger or memory_ledger(),
        letters,
        FakeConsumer(batches),  # type: ignore[arg-type]
        FakeProducer(),  # type: ignore[arg-type]
        dlq_topic="usage.dlq",
        max_record_bytes=4096,
        dlq_max_message_bytes=dlq_max_message_bytes,
        batch_max_records=batch_max_records,
    )
    return worker, letters


def test_a_batch_records_good_records_sets_bad_ones_aside_then_commits_its_offsets() -> None:
    good = usage("r1").to_json()
    batch = [_record(0, good), _record(1, b"{not json"), _record(2, good), _record(3, None)]
    worker, letters = _worker([])
    worker.process(batch)

    txn = worker.ledger.transaction(transaction_id("acme", "r1"))
    assert txn.state is TxnState.RESERVED
    assert (worker.stats.transactions, worker.stats.duplicates) == (1, 1)  # r1 sent twice
    assert sorted(letters.letters) == [("usage", 0, 1), ("usage", 0, 3)]
    assert "not valid JSON" in letters.letters["usage", 0, 1].reason
    reasons = [dict(headers)["dlq.reason"] for _, _, _, headers in worker.producer.sent]  # type: ignore[attr-defined]
    assert [r.split(b" ")[0] for r in reasons] == [b"not", b"empty"]
    [offsets] = worker.consumer.commits  # type: ignore[attr-defined]
    assert [o.offset for o in offsets.values()] == [4]  # past the last record of the batch


def test_a_redelivered_batch_records_nothing_twice() -> None:
    batch = [_record(i, usage(f"r{i}").to_json()) for i in range(5)]
    worker, _ = _worker([])
    worker.process(batch)
    events = len(list(worker.ledger.all_events()))
    worker.process(batch)  # as after a crash before the offset commit
    assert len(list(worker.ledger.all_events())) == events
    assert (worker.stats.transactions, worker.stats.duplicates) == (5, 5)


def test_a_record_the_price_list_cannot_price_is_a_dead_letter_not_a_transaction() -> None:
    bad = json.loads(usage("r2").to_json())
    bad["meter"] = "quantum.qubits"
    worker, letters = _worker([])
    worker.process([_record(7, json.dumps(bad).encode())])
    assert worker.stats.transactions == 0
    assert letters.letters["usage", 0, 7].reason.startswith("unknown meter")


def _faulty_ledger() -> BillingLedger:
    ledger = memory_ledger()
    ledger.prices = PriceSchedule.initial(FaultyPrices(ledger.prices.latest.prices.prices))
    return ledger


def _on(meter: str, usage_id: str) -> bytes:
    body = json.loads(usage(usage_id).to_json())
    return json.dumps({**body, "meter": meter}).encode()


def test_a_record_whose_pricing_raises_unexpectedly_is_set_aside_and_its_batch_recorded() -> None:
    batch = [
        _record(0, usage("r0").to_json()),
        _record(1, _on("faulty.meter", "r1")),
        _record(2, usage("r2").to_json()),
        _record(3, b"[1"),
        _record(4, _on("faulty.meter", "r4")),
    ]
    worker, letters = _worker([], _faulty_ledger())
    worker.process(batch)

    for usage_id in ("r0", "r2"):
        txn = worker.ledger.transaction(transaction_id("acme", usage_id))
        assert txn.state is TxnState.RESERVED
    assert {k[2]: d.reason for k, d in letters.letters.items()} == {
        1: "internal: RuntimeError",
        3: "not valid JSON: Expecting ',' delimiter: line 1 column 3 (char 2)",
        4: "internal: RuntimeError",
    }
    assert (worker.stats.transactions, worker.stats.dead_letters) == (2, 3)
    sent = [(value, dict(headers)["dlq.reason"]) for _, _, value, headers in worker.producer.sent]  # type: ignore[attr-defined]
    assert sent[0] == (batch[1].value, b"internal: RuntimeError")
    [offsets] = worker.consumer.commits  # type: ignore[attr-defined]
    assert [o.offset for o in offsets.values()] == [5]


@pytest.mark.parametrize("path", ["process", "write-behind"])
def test_a_failure_no_single_record_causes_fails_the_batch_and_commits_nothing(
    path: str,
) -> None:
    ledger = memory_ledger()

    def on_fire(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the store is on fire")

    ledger.recorder.insert_events = on_fire  # type: ignore[method-assign]
    batch = [_record(0, usage("r0").to_json()), _record(1, usage("r1").to_json())]
    worker, letters = _worker([batch] if path == "write-behind" else [], ledger)
    with pytest.raises(RuntimeError, match="on fire"):
        if path == "process":
            worker.process(batch)
        else:
            worker.run(threading.Event())
    assert letters.letters == {}  # no record was blamed for what none of them did
    assert worker.consumer.commits == []  # type: ignore[attr-defined]


def test_the_dlq_topic_gets_a_dead_letter_whole_up_to_its_limit_then_a_marked_prefix() -> None:
    fits, too_big = b"{" + b" " * 5_000 + b"}", b"{" + b" " * 50_000 + b"}"
    worker, letters = _worker([], dlq_max_message_bytes=10_000)
    worker.process([_record(0, fits), _record(1, too_big)])

    [(_, _, whole, whole_headers), (_, _, cut, cut_headers)] = worker.producer.sent  # type: ignore[attr-defined]
    assert whole == fits and dict(whole_headers)["dlq.truncated"] == b"false"
    assert cut == too_big[:4096]
    headers = dict(cut_headers)
    assert headers["dlq.truncated"] == b"true"
    assert headers["dlq.payload.size"] == b"50002"
    assert headers["dlq.payload.sha256"] == hashlib.sha256(too_big).hexdigest().encode()
    assert headers["dlq.reason"] == b"payload of 50002 bytes exceeds the 4096-byte limit"
    assert letters.letters["usage", 0, 1].code == "oversized"  # the store bounds its copy


def test_a_duplicate_with_another_body_is_a_conflict_and_an_exact_resend_stays_silent() -> None:
    first = usage("r1", quantity=1000).to_json()
    worker, letters = _worker([])
    worker.process([_record(0, first)])

    body = json.loads(first)
    resent = json.dumps(body, indent=2).encode()  # the same record, other whitespace
    changed = json.dumps({**body, "quantity": "1001"}).encode()  # the producer changed its mind
    worker.process([_record(1, first), _record(2, resent), _record(3, changed)])

    txn = worker.ledger.transaction(transaction_id("acme", "r1"))
    assert txn.quantity == 1000  # the first stays billed
    assert list(letters.letters) == [("usage", 0, 3)]
    letter = letters.letters["usage", 0, 3]
    assert letter.code == "conflicting_duplicate"
    assert letter.reason.startswith(
        "conflicting duplicate: usage_id 'r1' of customer 'acme' was recorded with another"
        " quantity (recorded sha256 "
    )
    assert (worker.stats.duplicates, worker.stats.conflicting_duplicates) == (2, 1)


def test_a_conflict_inside_one_batch_keeps_the_first_and_sets_the_second_aside() -> None:
    first = usage("r1", quantity=5).to_json()
    second = usage("r1", quantity=6).to_json()
    worker, letters = _worker([])
    worker.process([_record(0, first), _record(1, second)])
    assert worker.ledger.transaction(transaction_id("acme", "r1")).quantity == 5
    assert letters.letters["usage", 0, 1].reason.startswith("conflicting duplicate: ")
    assert (worker.stats.transactions, worker.stats.dead_letters) == (1, 1)


def _keyed(customer: str, offset: int, partition: int = 0) -> FakeRecord:
    value = usage(f"{customer}-{offset}", customer=customer).to_json()
    return FakeRecord("usage", partition, offset, customer.encode(), value)


def _run(worker: IngestWorker) -> tuple[list[list[str]], list[int]]:
    """Run until the fake consumer has nothing left: the customers of each batch, and
    how many records were still at the broker after each."""
    consumer: Any = worker.consumer
    batches: list[list[str]] = []
    unread: list[int] = []
    stop = threading.Event()

    def on_batch(stats: Any) -> None:
        metered = [e for e in worker.ledger.all_events() if type(e).__name__ == "Metered"]
        batches.append([e.customer_id for e in metered[sum(map(len, batches)) :]])
        unread.append(sum(map(len, consumer.batches)))
        if not unread[-1] and not worker._waiting and not worker._holding:
            stop.set()

    worker.run(stop, on_batch)
    return batches, unread


def _all(batches: list[list[str]]) -> list[str]:
    return [customer for batch in batches for customer in batch]


def test_a_customer_behind_a_burst_is_recorded_in_the_next_batch_not_after_the_burst() -> None:
    # One poll: a burst of 10 from one customer, then one record of another, in the
    # same partition; batches of 4 records.
    poll = [_keyed("burst", i) for i in range(10)] + [_keyed("late", 10)]
    worker, _ = _worker([poll], batch_max_records=4)
    batches, _ = _run(worker)

    assert batches[0] == ["burst", "burst", "burst", "late"]
    assert _all(batches).count("burst") == 10
    # Offsets: never past a burst record still waiting, then past everything read.
    commits = [o.offset for c in worker.consumer.commits for o in c.values()]  # type: ignore[attr-defined]
    assert commits == [3, 7, 11]


def test_reading_ahead_stops_at_five_batches_and_goes_on_as_they_are_done() -> None:
    polls = [[_keyed("burst", 2 * i + j) for j in range(2)] for i in range(15)]
    polls.append([_keyed("other", i, partition=1) for i in range(3)])
    worker, _ = _worker(polls, batch_max_records=2)
    batches, unread = _run(worker)

    # Five batches (5 x 2 records) read ahead, then one more poll each turn: when the
    # first batch lands, its save ran while one more was read and the next decided
    # (write-behind); the rest waits at the broker, not in memory, and all of it is
    # recorded.
    assert batches[0] == ["burst", "burst"]
    assert unread[0] == 30 + 3 - 10 - 2
    assert _all(batches).count("burst") == 30 and _all(batches).count("other") == 3
    # Once read, the other customer has half of every batch until its records are done,
    # ahead of the burst's records read before them.
    first_other = next(i for i, b in enumerate(batches) if "other" in b)
    assert batches[first_other : first_other + 3] == [["burst", "other"]] * 3


class _Rebalancing(FakeConsumer):
    def commit(self, offsets: dict[Any, Any] | None = None) -> None:
        raise RebalanceInProgressError("the group is rebalancing")


def test_a_commit_refused_while_the_group_rebalances_leaves_the_batch_recorded() -> None:
    # A batch read ahead can be done while the group rebalances; its offsets are then
    # not committed (whoever reads the records next finds them recorded), and the
    # worker goes on instead of failing its role.
    worker, _ = _worker([])
    worker.consumer = _Rebalancing([])  # type: ignore[assignment]
    worker.process([_keyed("acme", 0), _keyed("acme", 1)])
    assert worker.stats.commit_failures == 1
    assert worker.stats.transactions == 2


def test_dead_letters_the_broker_refused_stay_in_the_table_and_billing_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, letters = _worker([])
    worker.producer.refusing = "expired after 120000 ms"  # type: ignore[attr-defined]
    good = usage("r1").to_json()
    with caplog.at_level(logging.WARNING, logger="adapters.ingest.letters"):
        worker.process([_record(0, b"{not json"), _record(1, good)])
    assert sorted(letters.letters) == [("usage", 0, 0)]  # kept where the ledger keeps them
    assert worker.ledger.transaction(transaction_id("acme", "r1")).state is TxnState.RESERVED
    [offsets] = worker.consumer.commits  # type: ignore[attr-defined]
    assert [o.offset for o in offsets.values()] == [2]
    assert (
        "dead letters not on the dead-letter topic: 1 of 1 messages not acknowledged by the"
        " broker: expired after 120000 ms" in caplog.text
    )


@pytest.mark.parametrize("path", ["process", "write-behind"])
def test_a_record_whose_settling_refuses_it_is_set_aside_with_the_reason(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule that refuses one record after it was priced (``InvalidUsage`` raised while
    its line is settled, inside the save) sets that record aside with the rule's reason;
    the rest of the batch is recorded and its offsets committed, instead of the batch
    failing and coming back for ever."""
    from domain.errors import InvalidUsage
    from domain.invoice_line import InvoiceLine

    refused = str(transaction_id("acme", "r1"))
    settle = InvoiceLine.settle

    def refusing(self: InvoiceLine, entries: Any, *args: Any, **kwargs: Any) -> Any:
        if any(str(txn) == refused for txn, _ in entries):
            raise InvalidUsage("amount_not_exact: the line's total would need 61 digits")
        return settle(self, entries, *args, **kwargs)

    monkeypatch.setattr(InvoiceLine, "settle", refusing)
    batch = [_record(n, usage(f"r{n}").to_json()) for n in range(3)]
    worker, letters = _worker([batch] if path == "write-behind" else [])
    if path == "process":
        worker.process(batch)
    else:
        _run(worker)

    for usage_id in ("r0", "r2"):
        txn = worker.ledger.transaction(transaction_id("acme", usage_id))
        assert txn.state is TxnState.RESERVED
    assert {k[2]: d.reason for k, d in letters.letters.items()} == {
        1: "amount_not_exact: the line's total would need 61 digits"
    }
    offsets = worker.consumer.commits[-1]  # type: ignore[attr-defined]
    assert [o.offset for o in offsets.values()] == [3]
