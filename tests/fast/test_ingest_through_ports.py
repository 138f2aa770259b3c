"""The ingest worker, through its ports: fake Kafka clients, a fake dead-letter sink and
the ledger in memory. What is recorded, what is set aside, and that offsets are
committed only after both."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from adapters.ingest.worker import IngestWorker
from domain.ids import transaction_id
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
    ledger.prices = FaultyPrices(ledger.prices.prices)
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


def test_a_failure_no_single_record_causes_fails_the_batch_and_commits_nothing() -> None:
    class StoreOnFire(BillingLedger):
        def save(self, *objs: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the store is on fire")

    ledger = StoreOnFire(memory_ledger().prices, env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    worker, letters = _worker([], ledger)
    with pytest.raises(RuntimeError, match="on fire"):
        worker.process([_record(0, usage("r0").to_json()), _record(1, usage("r1").to_json())])
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
