"""The ingest worker, through its ports: fake Kafka clients, a fake dead-letter sink and
the ledger in memory. What is recorded, what is set aside, and that offsets are
committed only after both."""

from __future__ import annotations

import json

from adapters.ingest.worker import IngestWorker
from domain.ids import transaction_id
from domain.transaction import TxnState
from tests.fast.fakes import (
    FakeConsumer,
    FakeDeadLetters,
    FakeProducer,
    FakeRecord,
    memory_ledger,
    usage,
)


def _record(offset: int, value: bytes | None, partition: int = 0) -> FakeRecord:
    return FakeRecord("usage", partition, offset, b"acme", value)


def _worker(batches: list[list[FakeRecord]]) -> tuple[IngestWorker, FakeDeadLetters]:
    letters = FakeDeadLetters()
    worker = IngestWorker(
        memory_ledger(),
        letters,
        FakeConsumer(batches),  # type: ignore[arg-type]
        FakeProducer(),  # type: ignore[arg-type]
        dlq_topic="usage.dlq",
        max_record_bytes=4096,
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
