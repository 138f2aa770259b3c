"""The ingest's write-behind, through its ports: batch k saved on the writer thread
while batch k+1 is decided on the state k's decision left. A save that fails is done
again the ordinary way and the batch decided on it is decided again; offsets are never
committed past a batch not saved; the outcome is the one of a batch at a time."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from eventsourcing.application import AggregateNotFoundError

from adapters.ingest.worker import IngestWorker
from domain.ids import transaction_id
from domain.transaction import BillingTransaction, TxnState
from store.ledger import BillingLedger, Decided
from tests.fast.fakes import (
    FakeConsumer,
    FakeDeadLetters,
    FakeProducer,
    FakeRecord,
    memory_ledger,
    usage,
)


def _keyed(customer: str, offset: int, usage_id: str | None = None, **kw: Any) -> FakeRecord:
    record = usage(usage_id or f"{customer}-{offset}", customer=customer, **kw)
    return FakeRecord("usage", 0, offset, customer.encode(), record.to_json())


def _worker(
    polls: list[list[FakeRecord]], ledger: BillingLedger, *, overlap: bool = True
) -> tuple[IngestWorker, FakeDeadLetters]:
    letters = FakeDeadLetters()
    worker = IngestWorker(
        ledger,
        letters,
        FakeConsumer(polls),  # type: ignore[arg-type]
        FakeProducer(),  # type: ignore[arg-type]
        dlq_topic="usage.dlq",
        max_record_bytes=4096,
        batch_max_records=2,
        overlap_saves=overlap,
    )
    return worker, letters


def _drive(worker: IngestWorker) -> None:
    """Run until every record the fake consumer had is done."""
    consumer: Any = worker.consumer
    stop = threading.Event()

    def on_batch(stats: Any) -> None:
        if not consumer.batches and not worker._waiting and not worker._holding:
            stop.set()

    try:
        worker.run(stop, on_batch)
    finally:
        worker.close()


def _commits(worker: IngestWorker) -> list[int]:
    return [o.offset for c in worker.consumer.commits for o in c.values()]  # type: ignore[attr-defined]


def _decisions(ledger: BillingLedger) -> list[bool]:
    """Record, for each decision the ledger makes, whether it was made behind a save."""
    made: list[bool] = []
    decide = ledger.decide

    def spied(batch: Any, **kwargs: Any) -> Decided:
        made.append(kwargs.get("after") is not None)
        return decide(batch, **kwargs)

    ledger.decide = spied  # type: ignore[method-assign]
    return made


def test_batches_are_decided_behind_the_save_of_the_one_before() -> None:
    ledger = memory_ledger()
    made = _decisions(ledger)
    worker, _ = _worker([[_keyed("acme", i) for i in range(6)]], ledger)
    _drive(worker)
    assert made == [False, True, True]  # batch 1 alone, 2 behind 1, 3 behind 2
    assert worker.stats.transactions == 6 and worker.stats.conflicts == 0
    assert _commits(worker) == [2, 4, 6]


def test_a_rival_write_while_a_batch_is_saved_behind_redoes_it_and_the_batch_decided_on_it() -> (
    None
):
    ledger = memory_ledger()
    save = ledger.save_decided
    saves = [0]

    def rival_first(decided: Decided, **kwargs: Any) -> Any:
        saves[0] += 1
        if saves[0] == 1:  # another writer sets acme's limit as batch 1 is saved
            ledger.set_spend_limit("acme", "USD", 10**9)
        return save(decided, **kwargs)

    ledger.save_decided = rival_first  # type: ignore[method-assign]
    made = _decisions(ledger)
    worker, letters = _worker([[_keyed("acme", i) for i in range(6)]], ledger)
    _drive(worker)

    # Batch 1 lost its save and was done again the ordinary way (one decision, first
    # attempt); batch 2, decided behind it, was decided again before it was saved.
    assert made == [False, True, False, False, True]
    assert worker.stats.conflicts == 1 and worker.stats.contended_batches == 0
    assert worker.stats.in_line == 1
    txns = [ledger.transaction(transaction_id("acme", f"acme-{i}")) for i in range(6)]
    assert all(t.state is TxnState.RESERVED for t in txns)
    account = ledger.account("acme", "USD")
    assert account is not None and account.spend_limit == 10**9  # the rival's write stays
    assert account.reserved == sum(t.amount for t in txns)
    assert worker.stats.transactions == 6 and letters.letters == {}
    assert _commits(worker) == [2, 4, 6]


def test_offsets_are_never_committed_past_a_batch_decided_but_not_saved() -> None:
    ledger = memory_ledger()
    insert = ledger.recorder.insert_events
    calls = [0]

    def fails_from_the_second(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] >= 2:
            raise RuntimeError("the store is on fire")
        return insert(*args, **kwargs)

    ledger.recorder.insert_events = fails_from_the_second  # type: ignore[method-assign]
    worker, _ = _worker([[_keyed("acme", i) for i in range(4)]], ledger)
    with pytest.raises(RuntimeError, match="on fire"):
        _drive(worker)
    # Batch 1 landed while batch 2 was held: its commit stops at batch 2's first record.
    assert _commits(worker) == [2]
    assert worker.stats.transactions == 2


def test_a_batch_redelivered_after_a_crash_then_new_usage_bills_each_record_once() -> None:
    """Records 0 and 1 were saved by a worker that died before committing. Batch 1 (them
    again) loses its save behind and, done in line, finds only duplicates: it leaves the
    account alone. Batch 2 was decided on batch 1's state, which was never saved: it is
    decided again, so the account holds each record once, with no version skipped."""
    ledger = memory_ledger()
    records = [_keyed("acme", i) for i in range(4)]
    crashed, _ = _worker([], ledger)
    crashed.process(records[:2])
    worker, _ = _worker([records], ledger)
    _drive(worker)

    assert (worker.stats.duplicates, worker.stats.transactions) == (2, 2)
    account = ledger.account("acme", "USD")
    assert account is not None
    txns = [ledger.transaction(transaction_id("acme", f"acme-{i}")) for i in range(4)]
    assert account.reserved == sum(t.amount for t in txns)
    versions = [e.originator_version for e in ledger.events.get(account.id)]
    assert versions == list(range(1, len(versions) + 1))


def _stop_in(worker: IngestWorker, stop: threading.Event, *, decision: int) -> None:
    """Set ``stop`` while the ledger makes its ``decision``-th decision (this thread)."""
    decide, made = worker.ledger.decide, [0]

    def stopping(batch: Any, **kwargs: Any) -> Decided:
        made[0] += 1
        if made[0] == decision:
            stop.set()
        return decide(batch, **kwargs)

    worker.ledger.decide = stopping  # type: ignore[method-assign]


def test_stopped_while_the_next_batch_is_decided_the_batch_in_flight_lands_and_no_other() -> None:
    ledger = memory_ledger()
    worker, _ = _worker([[_keyed("acme", i) for i in range(6)]], ledger)
    stop = threading.Event()
    _stop_in(worker, stop, decision=2)  # batch 2, decided behind batch 1's save
    worker.run(stop)
    worker.close()
    # Batch 1 saved and committed; batch 2 decided but never saved: delivered again.
    assert worker.stats.transactions == 2 and _commits(worker) == [2]
    metered = [e for e in ledger.all_events() if isinstance(e, BillingTransaction.Metered)]
    assert sorted(e.usage_id for e in metered) == ["acme-0", "acme-1"]


def test_stopped_with_a_save_in_flight_it_lands_with_its_offsets() -> None:
    ledger = memory_ledger()
    worker, _ = _worker([[_keyed("acme", i) for i in range(2)]], ledger)
    stop = threading.Event()
    writer: Any = worker._writer
    submit = writer.submit

    def submit_then_stop(*args: Any) -> Any:
        stop.set()  # as the save starts: the loop sees the stop before it lands the batch
        return submit(*args)

    writer.submit = submit_then_stop
    worker.run(stop)
    worker.close()
    assert worker.stats.transactions == 2 and _commits(worker) == [2]


def _outcome(worker: IngestWorker, ledger: BillingLedger, letters: FakeDeadLetters) -> Any:
    txns = {}
    for customer in ("acme", "bolt"):
        for i in range(10):
            try:
                t = ledger.transaction(transaction_id(customer, f"{customer}-{i}"))
            except AggregateNotFoundError:  # not this customer's offset, or a dead letter
                continue
            txns[t.usage_id, customer] = (t.state, t.amount, t.compensation_reason)
    accounts = {c: ledger.account(c, "USD") for c in ("acme", "bolt")}
    st = worker.stats
    return (
        txns,
        {c: (a.reserved, a.spend_limit) for c, a in accounts.items() if a is not None},
        {k: d.reason for k, d in letters.letters.items()},
        (st.records, st.transactions, st.duplicates, st.refused, st.dead_letters),
        _commits(worker)[-1],
    )


def test_saving_behind_records_what_one_batch_at_a_time_records() -> None:
    """Two customers, one with a limit that refuses part of its usage, an invalid record,
    a redelivered one and a producer that changed its mind, in batches of two."""
    polls = [
        [_keyed("acme", 0), _keyed("bolt", 1), _keyed("acme", 2, quantity=400_000)],
        [FakeRecord("usage", 0, 3, b"acme", b"{not json"), _keyed("bolt", 4)],
        [_keyed("acme", 5, "acme-0"), _keyed("bolt", 6, "bolt-1", quantity=7)],
        [_keyed("acme", 7), _keyed("acme", 8, quantity=400_000), _keyed("bolt", 9)],
    ]
    outcomes = []
    for overlap in (True, False):
        ledger = memory_ledger()
        ledger.set_spend_limit("acme", "USD", 1_000)  # 10.00 USD: 400,000 requests are 400
        worker, letters = _worker([list(p) for p in polls], ledger, overlap=overlap)
        _drive(worker)
        outcomes.append(_outcome(worker, ledger, letters))
    behind, one_at_a_time = outcomes
    assert behind == one_at_a_time
    txns, _, reasons, counts, last_commit = behind
    assert TxnState.COMPENSATED in {state for state, _, _ in txns.values()}  # refused
    assert len(reasons) == 2 and counts == (10, 7, 1, 2, 2) and last_commit == 10
