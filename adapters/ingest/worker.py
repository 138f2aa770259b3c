"""The usage consumer: Kafka records in, billing transactions and dead letters out.

A batch goes through these steps, in this order (``adapters.ingest.batch`` holds the
ones that need no consumer):

1. decode every record (``adapters.ingest.decoding``: ``domain.usage.decode_usage``'s
   verdicts, faster); invalid ones become dead letters;
2. decide and save, in ONE database transaction, Metered + Reserved (or Compensated)
   for every new transaction and the touched accounts and lines
   (``BillingLedger.decide`` / ``save_decided``, or ``record_usage`` which does both
   and retries after a lost race);
3. dead letters: stored, then produced to the dead-letter topic with the reason in
   headers (``adapters.ingest.letters.quarantine``);
4. only then the consumed offsets are committed.

Write-behind (``overlap_saves``, on by default): batch k's save (step 2's write) runs
on one writer thread while this thread decodes and decides batch k+1 on the state k's
decision left (``BillingLedger.decide(after=...)``); then k is landed (steps 3 and 4)
and k+1's save starts. PostgreSQL's time is no longer the worker's. The rules stay
those of one batch at a time:

* at most one save is in flight and saves land in order, so the offsets committed for
  k never pass a record of k+1 (k+1's records count as waiting until k+1 lands);
* if k's save fails (a lost version race, anything), k is done again the ordinary way
  (``record_usage``, with its retries and culprit probing) and k+1's decision, made on
  a state that was never saved, is thrown away and made again before k+1 is saved.
  The version constraint alone would not always catch it: when k done again leaves an
  aggregate alone (its records were duplicates), k+1's events for it would follow
  versions never written, and its money would include k's;
* if k's save succeeded, k+1's save still goes through the version constraint: a
  writer that moved one of its aggregates meanwhile makes it fail, and it is done
  again the ordinary way.

A batch is a fair round (``domain.fairness``), not simply what one poll returned: the
worker reads ahead (up to ``READ_AHEAD_ROUNDS`` batches) and takes each customer (the
record's key) a max-min fair share of ``batch_max_records``, from the front of that
customer's records. A customer whose records sit behind another customer's burst, in the same
partition or another, is recorded in the next batch, not after the burst. Offsets are
committed per partition only up to the first record still waiting, so a crash hands
every record not done to the next reader again.

A crash anywhere before step 4 redelivers the batch; step 2 then finds the
transactions already recorded and counts them as duplicates. Nothing is locked.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import IntegrityError
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from adapters.ingest import batch as steps
from adapters.ingest.batch import DEFAULT_WINDOW, IngestStats
from adapters.ingest.letters import letter, quarantine
from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from domain.fairness import committable, fair_round
from domain.metering import Metering
from domain.metering_events import MeteredBatch
from domain.ports import DeadLetter, DeadLetterSink
from domain.usage import UsageWindow
from store.errors import ConcurrencyExhausted
from store.ledger import BillingLedger, Decided

__all__ = ["IngestStats", "IngestWorker"]

log = logging.getLogger(__name__)

# Records a worker holds read ahead, in batches: it polls again only while it holds
# fewer (memory stays bounded; a poll takes records from every partition in turn).
READ_AHEAD_ROUNDS = 5

OnBatch = Callable[["IngestStats"], None] | None


@dataclass
class _Batch:
    """A batch decided on this thread whose save runs (or will run) on the writer's."""

    records: Sequence[Any]
    valid: list[Metering]
    letters: list[DeadLetter]
    span: telemetry.Span
    started: float
    decided: Decided | None  # None: to decide (again) before saving
    saving_ns: int = 0
    saved_ns: int = 0  # when the writer was done with it
    future: Future[MeteredBatch] | None = None


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
        usage_window: UsageWindow = DEFAULT_WINDOW,
        poll_timeout_ms: int = 200,
        dlq_max_message_bytes: int = 1_000_000,
        batch_max_records: int = 2000,
        overlap_saves: bool = True,
    ) -> None:
        self.ledger = ledger
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.dead_letters = dead_letters
        self.consumer = consumer
        self.producer = producer
        self.dlq_topic = dlq_topic
        self.max_record_bytes = max_record_bytes
        self.usage_window = usage_window
        self.poll_timeout_ms = poll_timeout_ms
        self.dlq_max_message_bytes = dlq_max_message_bytes
        self.batch_max_records = batch_max_records
        self.stats = IngestStats()
        self._waiting: list[Any] = []  # read ahead, not yet in a batch, oldest first
        self._holding: Sequence[Any] = ()  # the next batch, decided while one is saved
        self._saving: _Batch | None = None  # the batch whose save is in flight
        # per partition, the offset after the last record read: every record
        # before it is recorded, waiting, held or being saved
        self._read_to: dict[tuple[str, int], int] = {}
        self._writer = ThreadPoolExecutor(1, "ingest-save") if overlap_saves else None

    def close(self) -> None:
        """Stop the writer thread (after the save in flight, if any)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    def run(self, stop: threading.Event, on_batch: OnBatch = None) -> None:
        """Read ahead and process a fair round at a time until ``stop`` is set."""
        try:
            while not stop.is_set():
                self.pulse()
                self._read_ahead(wait=self._saving is None)
                if not self._waiting:
                    self._land(stop, on_batch)
                    continue
                records, self._waiting = fair_round(
                    self._waiting, _customer, self.batch_max_records
                )
                if self._writer is None:
                    if self._process_until_saved(records, stop) and on_batch is not None:
                        on_batch(self.stats)
                    continue
                self._next(records, stop, on_batch)
            self._land(stop, on_batch)  # stopped: the save in flight lands, its offsets too
        finally:
            saving, self._saving = self._saving, None
            if saving is not None:  # failed with a save in flight: let it end, uncommitted
                assert saving.future is not None
                wait_for_futures([saving.future])
                saving.span.end()

    def _next(self, records: Sequence[Any], stop: threading.Event, on_batch: OnBatch) -> None:
        """Decide ``records`` while the batch in flight is saved, land that one, then
        start saving ``records`` (the write-behind of the module docstring)."""
        self._holding = records
        try:
            batch = self._begin(records, self._saving.decided if self._saving else None)
            try:
                if not self._land(stop, on_batch):
                    batch.decided = None  # decided on a state that was not saved
            except BaseException:
                batch.span.end()
                raise
        finally:
            self._holding = ()
        if stop.is_set():  # not saved, not committed: delivered again
            batch.span.end()
            return
        self._launch(batch, stop, on_batch)

    def _read_ahead(self, *, wait: bool = True) -> None:
        """Poll into the waiting records: waiting for the broker only when none wait
        (and ``wait``), then as long as polls bring records and fewer than
        ``READ_AHEAD_ROUNDS`` batches wait. Records are never dropped, not even those of
        a partition that moved to another worker meanwhile (both record them: the store
        refuses the second), so every record read before ``_read_to`` is recorded,
        waiting, held or being saved."""
        timeout = 0 if self._waiting or not wait else self.poll_timeout_ms
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

    def _begin(self, records: Sequence[Any], after: Decided | None) -> _Batch:
        """Decode and decide a batch (on ``after``'s state, if given), without saving."""
        started = time.perf_counter()
        span = telemetry.start_span("ingest batch", billing__records=len(records))
        valid, letters = steps.decode(records, self.max_record_bytes, self.usage_window)
        batch = _Batch(records, valid, letters, span, started, None)
        batch.decided = self._decide(batch, after)
        return batch

    def _decide(self, batch: _Batch, after: Decided | None) -> Decided | None:
        """``decide``, or None when it raises: the batch is then done in line, where
        whatever raised is met again and handled (a record set aside, a retry, or the
        batch failed)."""
        try:
            return self.ledger.decide(batch.valid, after=after)
        except Exception as exc:
            batch.span.record_exception(exc)
            log.warning(
                "batch not decided behind (%s: %s), doing it in line", type(exc).__name__, exc,
                extra={"step": "ingest", "status": "in_line"},
            )  # fmt: skip
            return None

    def _launch(self, batch: _Batch, stop: threading.Event, on_batch: OnBatch) -> None:
        """Start saving ``batch`` on the writer thread; in line, here and now, when it
        cannot be decided."""
        assert self._writer is not None
        if batch.decided is None:
            batch.decided = self._decide(batch, None)
        if batch.decided is None:
            batch.span.end()
            self.stats.in_line += 1
            if self._process_until_saved(batch.records, stop) and on_batch is not None:
                on_batch(self.stats)
            return
        batch.saving_ns = time.time_ns()
        try:
            batch.future = self._writer.submit(self.ledger.save_decided, batch.decided)
        except BaseException:
            batch.span.end()
            raise
        batch.future.add_done_callback(lambda _: setattr(batch, "saved_ns", time.time_ns()))
        self._saving = batch

    def _land(self, stop: threading.Event, on_batch: OnBatch) -> bool:
        """Wait for the save in flight (if any), then its dead letters and offsets. False
        when the save failed and the batch was done again in line."""
        batch = self._saving
        if batch is None:
            return True
        assert batch.future is not None
        try:
            decision = batch.future.result()
        except Exception as exc:  # done again below, in line, where it is handled
            self._saving = None
            telemetry.end_failed(batch.span, exc)
            self.stats.in_line += 1
            if isinstance(exc, IntegrityError):
                self.stats.conflicts += 1
            log.info(
                "batch saved behind lost its save (%s), saving it again", type(exc).__name__,
                extra={"step": "ingest", "status": "retry"},
            )  # fmt: skip
            if self._process_until_saved(batch.records, stop) and on_batch is not None:
                on_batch(self.stats)
            return False
        self._saving = None
        with telemetry.ending(batch.span):
            steps.trace_reserve(
                batch.span, batch.records, batch.valid, decision,
                (batch.saving_ns, batch.saved_ns or time.time_ns()),
            )  # fmt: skip
            self._complete(
                batch.records, decision, letters=batch.letters, set_aside=[],
                span=batch.span, started=batch.started,
            )  # fmt: skip
        if on_batch is not None:
            on_batch(self.stats)
        return True

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
        """Handle one batch of ConsumerRecords, here and now, then commit their offsets."""
        with telemetry.span("ingest batch", billing__records=len(records)) as span:
            started = time.perf_counter()
            valid, letters = steps.decode(records, self.max_record_bytes, self.usage_window)
            saving = time.time_ns()
            decision, culprits = steps.record(self.ledger, valid)
            if culprits:
                set_aside = {id(m) for m, _ in culprits}
                valid = [m for m in valid if id(m) not in set_aside]
            steps.trace_reserve(span, records, valid, decision, (saving, time.time_ns()))
            self._complete(
                records, decision, letters=letters, set_aside=culprits, span=span, started=started
            )

    def _complete(
        self,
        records: Sequence[Any],
        decision: MeteredBatch,
        *,
        letters: list[DeadLetter],
        set_aside: list[tuple[Metering, str]],
        span: telemetry.Span,
        started: float,
    ) -> None:
        """Steps 3 and 4 for a saved batch, and its counts."""
        conflicts = steps.conflicts(self.ledger, decision)
        raw_by_source = {(r.topic, r.partition, r.offset): r for r in records}
        for metering, reason in [*set_aside, *decision.rejected, *conflicts]:
            s = metering.source
            letters.append(letter(raw_by_source[(s.topic, s.partition, s.offset)], reason))
        letters.sort(key=lambda d: (d.topic, d.partition, d.offset))  # source order
        quarantine(letters, self.dead_letters, self.producer, self.dlq_topic,
                   self.dlq_max_message_bytes)  # fmt: skip
        self._commit(records)

        elapsed = time.perf_counter() - started
        counts = self.stats.add(
            len(records), decision, dead_letters=len(letters), conflicting=len(conflicts),
            attempts=self.ledger.last_save.attempts, seconds=elapsed,
        )  # fmt: skip
        span.set_attributes({f"billing.{k}": v for k, v in counts.items()})
        log.info(
            "ingest batch",
            extra={**step_fields("ingest", "ok"), **counts, "seconds": round(elapsed, 4)},
        )

    def _commit(self, records: Sequence[Any]) -> None:
        """Commit past the batch's records and what was done before, never past a
        record still waiting or held (the next batch, decided while this one was saved)."""
        not_done = itertools.chain(self._waiting, self._holding)
        offsets = {
            TopicPartition(*tp): OffsetAndMetadata(offset, "", -1)
            for tp, offset in committable(
                (((r.topic, r.partition), r.offset) for r in records),
                (((r.topic, r.partition), r.offset) for r in not_done),
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
