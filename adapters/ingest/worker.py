"""The usage consumer: Kafka records in, billing transactions and dead letters out.

One poll is one batch. For each batch, in this order:

1. decode every record (``adapters.ingest.decoding``: ``domain.usage.decode_usage``'s
   verdicts, faster); invalid ones become dead letters;
2. ``BillingLedger.record_usage``: Metered + Reserved (or Compensated) for every new
   transaction and the touched accounts, in ONE database transaction;
3. dead letters: stored in ``billing.dead_letters`` (idempotent by source offset; a
   bounded prefix of the payload with its size and hash) and produced to the
   dead-letter topic with the reason in headers, then flushed. The topic gets the
   whole payload up to ``dlq_max_message_bytes`` (its message limit), else the stored
   prefix, with headers saying it was truncated and the whole one's size and SHA-256;
4. only then the consumed offsets are committed.

A batch is a fair round (``domain.fairness``), not simply what one poll returned: the
worker reads ahead (up to ``READ_AHEAD_ROUNDS`` batches) and takes each customer (the
record's key) a max-min fair share of ``batch_max_records``, from the front of that
customer's records. A customer whose records sit behind another customer's burst, in the same
partition or another, is recorded in the next batch, not after the burst. Offsets are
committed per partition only up to the first record still waiting, so a crash hands
every record not done to the next reader again.

A crash anywhere before step 4 redelivers the batch; step 2 then finds the
transactions already recorded and counts them as duplicates. Nothing is locked.

A duplicate that is not the same record (``domain.duplicates``: a producer that
changed its mind) is not silent: the first stays billed and the duplicate becomes a
dead letter ``conflicting duplicate: ...`` naming what differs and both bodies'
hashes. The recorded side is read from the transactions' ``Metered`` events, one
query per batch that has duplicates, none otherwise.

One record can never stop a batch. Decoding is total (``decode_usage`` raises only
``InvalidUsage``), and as a last resort anything else a record raises while it is
decoded or priced makes that record a dead letter with reason ``internal: <type>``
(logged with its traceback) while the rest of the batch is recorded. Pricing runs
inside the batch's save, so a batch whose save raises something unexpected is probed
record by record, with the same pure decision and event encoding but no write; the
records that raise alone are set aside and the others saved. An error no single record
causes (the database went away) still fails the batch, uncommitted, to be delivered
again.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from adapters.ingest.decoding import decode_usage_fast
from adapters.ingest.letters import internal_reason, letter, send_to_dlq
from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.duplicates import Recorded, conflict
from domain.errors import InvalidUsage
from domain.fairness import committable, fair_round
from domain.metering import Metering
from domain.metering_events import MeteredBatch, meter_batch_events
from domain.ports import DeadLetter, DeadLetterSink
from domain.transaction import BillingTransaction, Source
from store.errors import DATABASE_ERRORS, ConcurrencyExhausted
from store.ledger import BillingLedger

__all__ = ["IngestStats", "IngestWorker"]

log = logging.getLogger(__name__)

# Records a worker holds read ahead, in batches: it polls again only while it holds
# fewer (memory stays bounded; a poll takes records from every partition in turn).
READ_AHEAD_ROUNDS = 5

# Contention and the database: never blamed on a record by the last-resort guard.
_NOT_A_RECORDS_FAULT: tuple[type[Exception], ...] = (ConcurrencyExhausted, *DATABASE_ERRORS)


@dataclass
class IngestStats:
    """Running totals for one worker (read by progress displays and benchmarks)."""

    records: int = 0
    transactions: int = 0
    duplicates: int = 0
    refused: int = 0
    dead_letters: int = 0
    batches: int = 0
    conflicts: int = 0  # optimistic-concurrency retries of saves
    conflicting_duplicates: int = 0
    commit_failures: int = 0
    contended_batches: int = 0  # batches that lost every concurrency retry and waited
    batch_seconds: list[float] = field(default_factory=list)


class IngestWorker:
    """Consumes the usage topic until stopped (see the module docstring)."""

    def __init__(
        self,
        ledger: BillingLedger,
        dead_letters: DeadLetterSink,
        consumer: KafkaConsumer,
        producer: KafkaProducer,
        *,
        dlq_topic: str,
        max_record_bytes: int,
        poll_timeout_ms: int = 200,
        dlq_max_message_bytes: int = 1_000_000,
        batch_max_records: int = 2000,
    ) -> None:
        self.ledger = ledger
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.dead_letters = dead_letters
        self.consumer = consumer
        self.producer = producer
        self.dlq_topic = dlq_topic
        self.max_record_bytes = max_record_bytes
        self.poll_timeout_ms = poll_timeout_ms
        self.dlq_max_message_bytes = dlq_max_message_bytes
        self.batch_max_records = batch_max_records
        self.stats = IngestStats()
        self._waiting: list[Any] = []  # read ahead, not yet in a batch, oldest first
        # per partition, the offset after the last record read: every record
        # before it is recorded or waiting
        self._read_to: dict[tuple[str, int], int] = {}

    def run(
        self, stop: threading.Event, on_batch: Callable[[IngestStats], None] | None = None
    ) -> None:
        """Read ahead and process a fair round at a time until ``stop`` is set."""
        while not stop.is_set():
            self.pulse()
            self._read_ahead()
            if not self._waiting:
                continue
            records, self._waiting = fair_round(self._waiting, _customer, self.batch_max_records)
            saved = self._process_until_saved(records, stop)
            if saved and on_batch is not None:
                on_batch(self.stats)

    def _read_ahead(self) -> None:
        """Poll into the waiting records: waiting for the broker only when none wait,
        then as long as polls bring records and fewer than ``READ_AHEAD_ROUNDS`` batches
        wait. Records are never dropped, not even those of a partition that moved to
        another worker meanwhile (both record them: the store refuses the second), so
        every record read before ``_read_to`` is recorded or waiting."""
        timeout = 0 if self._waiting else self.poll_timeout_ms
        while len(self._waiting) < READ_AHEAD_ROUNDS * self.batch_max_records:
            polled = self.consumer.poll(timeout_ms=timeout)
            records = [r for batch in polled.values() for r in batch]
            if not records:
                return
            self._waiting += records
            for r in records:
                tp = (r.topic, r.partition)
                self._read_to[tp] = max(self._read_to.get(tp, 0), r.offset + 1)
            timeout = 0

    def _process_until_saved(self, records: Sequence[Any], stop: threading.Event) -> bool:
        """``process``, again after a jittered pause while the batch keeps losing
        concurrency races (nothing was saved, no offset committed). False when stopped
        first: the uncommitted batch is delivered again, to this worker or another."""
        for attempt in itertools.count():
            try:
                self.process(records)
                return True
            except ConcurrencyExhausted as exc:
                self.stats.contended_batches += 1
                delay = random.uniform(0, 0.1 * 2 ** min(attempt, 5))  # at most 3.2 s
                log.warning(
                    "batch not saved, trying again in %.2fs: %s", delay, exc,
                    extra={"step": "ingest", "status": "contended", "attempt": attempt + 1},
                )  # fmt: skip
                if stop.wait(delay):
                    return False
        raise AssertionError("unreachable")  # pragma: no cover

    def process(self, records: Sequence[Any]) -> None:
        """Handle one polled batch of ConsumerRecords, then commit their offsets."""
        with telemetry.span("ingest batch", billing__records=len(records)) as batch:
            self._process(records, batch)

    def _process(self, records: Sequence[Any], batch: telemetry.Span) -> None:
        started = time.perf_counter()
        valid: list[Metering] = []
        letters: list[DeadLetter] = []
        for rec in records:
            source = Source(rec.topic, rec.partition, rec.offset)
            try:
                valid.append(
                    Metering(decode_usage_fast(rec.value, max_bytes=self.max_record_bytes), source)
                )
            except InvalidUsage as exc:
                letters.append(letter(rec, str(exc)))
            except Exception as exc:  # the last resort: one record never stops a batch
                letters.append(letter(rec, internal_reason(exc, source)))

        raw_by_source = {(r.topic, r.partition, r.offset): r for r in records}
        saving = time.time_ns()
        decision, culprits = self._record(valid)
        if culprits:
            set_aside = {id(m) for m, _ in culprits}
            valid = [m for m in valid if id(m) not in set_aside]
        _trace_reserve(batch, records, valid, decision, (saving, time.time_ns()))
        conflicts = self._conflicts(decision)
        for metering, reason in [*culprits, *decision.rejected, *conflicts]:
            s = metering.source
            letters.append(letter(raw_by_source[(s.topic, s.partition, s.offset)], reason))
        letters.sort(key=lambda d: (d.topic, d.partition, d.offset))  # source order
        self._quarantine(letters)
        self._commit(records)

        elapsed = time.perf_counter() - started
        duplicates = len(decision.duplicates) - len(conflicts)
        _count(decision, len(letters), duplicates)
        st = self.stats
        st.records += len(records)
        st.transactions += len(decision.transactions)
        st.duplicates += duplicates
        st.conflicting_duplicates += len(conflicts)
        st.refused += len(decision.refused)
        st.dead_letters += len(letters)
        st.batches += 1
        st.conflicts += self.ledger.last_save.attempts - 1
        st.batch_seconds.append(elapsed)
        counts = {
            "records": len(records),
            "transactions": len(decision.transactions),
            "duplicates": duplicates,
            "refused": len(decision.refused),
            "dead_letters": len(letters),
        }
        batch.set_attributes({f"billing.{k}": v for k, v in counts.items()})
        log.info(
            "ingest batch",
            extra={**step_fields("ingest", "ok"), **counts, "seconds": round(elapsed, 4)},
        )

    def _record(self, valid: list[Metering]) -> tuple[MeteredBatch, list[tuple[Metering, str]]]:
        """``record_usage``; when it raises something no rule explains, the records that
        raise on their own are set aside (``internal: <type>``) and the rest saved."""
        culprits: list[tuple[Metering, str]] = []
        while True:
            try:
                return self.ledger.record_usage(valid), culprits
            except _NOT_A_RECORDS_FAULT:
                raise
            except Exception:
                found = self._culprits(valid)
                if not found:
                    raise  # no single record causes it: fail the batch, uncommitted
            culprits += found
            bad = {id(m) for m, _ in found}
            valid = [m for m in valid if id(m) not in bad]

    def _culprits(self, valid: Sequence[Metering]) -> list[tuple[Metering, str]]:
        """The records whose decision or event encoding raises on its own (no write)."""
        found: list[tuple[Metering, str]] = []
        ledger = self.ledger
        for metering in valid:
            try:
                decision = meter_batch_events(
                    [metering], ledger.prices, load_account=ledger.account,
                    load_line=ledger.line_or_none, load_invoice=ledger.invoice_by_id,
                    periods=ledger.periods, now=datetime.now(UTC),
                )  # fmt: skip
                touched = [*decision.accounts, *decision.lines, *decision.invoices]
                events = [e for a in touched for e in a.collect_events()]
                for event in [*decision.transaction_events, *events]:
                    ledger.mapper.to_stored_event(event)
            except InvalidUsage:
                continue  # a reason of its own: record_usage rejects it, it does not raise
            except DATABASE_ERRORS:
                raise  # loading the account failed: not this record's fault
            except Exception as exc:
                found.append((metering, internal_reason(exc, metering.source)))
        return found

    def _conflicts(self, decision: MeteredBatch) -> list[tuple[Metering, str]]:
        """The duplicates that are not the same record as the one recorded, with their
        reasons (``domain.duplicates``); the rest are silent duplicates."""
        if not decision.duplicates:
            return []
        wanted = {m.transaction_id for m in decision.duplicates}
        # Only the duplicated ones: a transaction's Metered event is built when asked for.
        first: dict[Any, Any] = {t.id: t.metered for t in decision.transactions if t.id in wanted}
        earlier = [m.transaction_id for m in decision.duplicates if m.transaction_id not in first]
        if earlier:
            first.update(self.ledger.first_events(earlier))
        found: list[tuple[Metering, str]] = []
        for metering in decision.duplicates:
            metered = first.get(metering.transaction_id)
            if not isinstance(metered, BillingTransaction.Metered):
                continue  # not a transaction's history: nothing to compare with
            reason = conflict(metering.record, Recorded.of(metered))
            if reason is not None:
                found.append((metering, reason))
        return found

    def _quarantine(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        self.dead_letters.record(letters)
        for d in letters:
            log.warning(
                "usage record quarantined",
                extra=step_fields("ingest", "dead_letter", error_code=d.code,
                                  reason=d.reason, source=f"{d.topic}/{d.partition}@{d.offset}"),
            )  # fmt: skip
            send_to_dlq(self.producer, self.dlq_topic, d, self.dlq_max_message_bytes)
        self.producer.flush()

    def _commit(self, records: Sequence[Any]) -> None:
        """Commit past the batch's records and what was done before, never past a
        record still waiting."""
        offsets = {
            TopicPartition(*tp): OffsetAndMetadata(offset, "", -1)
            for tp, offset in committable(
                (((r.topic, r.partition), r.offset) for r in records),
                (((r.topic, r.partition), r.offset) for r in self._waiting),
                self._read_to,
            ).items()
        }
        try:
            self.consumer.commit(offsets)
        except (CommitFailedError, RebalanceInProgressError) as exc:
            # The partitions moved to another worker mid-batch, or are moving (a batch
            # read ahead is done while the group rebalances); whoever reads them next
            # finds these records recorded. Nothing is lost or doubled.
            self.stats.commit_failures += 1
            log.warning("offset commit refused after a rebalance: %s", exc)


def _customer(record: Any) -> bytes | None:
    """Whose record it is, for fairness: its key (producers key usage by customer)."""
    key: bytes | None = record.key
    return key


def _count(decision: MeteredBatch, dead_letters: int, duplicates: int) -> None:
    """Count the batch's records by outcome (every record has exactly one)."""
    m = metrics()
    refused = len(decision.refused)
    for outcome, n in (
        ("reserved", len(decision.transactions) - refused),
        ("refused", refused),
        ("duplicate", duplicates),
        ("dead_letter", dead_letters),
    ):
        if n:
            m.ingested.add(n, {"outcome": outcome})
    if dead_letters:
        m.dead_letters.add(dead_letters)


def _trace_reserve(
    batch: telemetry.Span,
    records: Sequence[Any],
    valid: Sequence[Metering],
    decision: MeteredBatch,
    save_ns: tuple[int, int],
) -> None:
    """A ``reserve`` span per valid record, timed as the batch's save, in the record's
    transaction trace (``telemetry.usage_parent``) and linked to the batch span. Skipped
    when the batch is not recorded (no exporter): thousands of no-op spans cost time."""
    if not batch.is_recording():
        return
    headers = {(r.topic, r.partition, r.offset): r.headers for r in records}
    results: dict[Any, str] = {id(m): "duplicate" for m in decision.duplicates}
    results.update({id(m): "rejected" for m, _ in decision.rejected})
    refused = {t.id for t in decision.refused}
    batch_link = telemetry.link_to(batch)
    for m in valid:
        txn_id, s = m.transaction_id, m.source
        parent, links = telemetry.usage_parent(headers[(s.topic, s.partition, s.offset)], txn_id)
        result = results.get(id(m)) or ("refused" if txn_id in refused else "reserved")
        telemetry.start_span(
            "reserve",
            parent,
            [*links, batch_link],
            start_time=save_ns[0],
            billing__transaction_id=str(txn_id),
            billing__customer_id=m.record.customer_id,
            billing__usage_id=m.record.usage_id,
            billing__result=result,
            billing__source=str(s),
        ).end(save_ns[1])
