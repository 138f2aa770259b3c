"""One batch's steps that need no consumer: decode, record, name the conflicting
duplicates, count and trace the outcomes (``adapters.ingest.worker`` runs them in order).

One record can never stop a batch. Decoding is total (``decode_usage`` raises only
``InvalidUsage``), and as a last resort anything else a record raises while it is
decoded or priced makes that record a dead letter with reason ``internal: <type>``
(logged with its traceback) while the rest of the batch is recorded. Pricing runs
inside the batch's save, so a batch whose save raises is probed record by record, with
the same pure decision and event encoding but no write; the records that raise alone
are set aside (an ``InvalidUsage`` raised past the decision's own rejections, as when a
line's total would not be exact, with its reason) and the others saved. An error no single record
causes (the database went away) still fails the batch, uncommitted, to be delivered
again.

A duplicate that is not the same record (``domain.duplicates``: a producer that
changed its mind) is not silent: the first stays billed and the duplicate becomes a
dead letter ``conflicting duplicate: ...`` naming what differs and both bodies' hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from adapters.ingest.decoding import decode_usage_fast
from adapters.ingest.letters import internal_reason, letter
from adapters.observability import telemetry
from adapters.observability.metrics import metrics
from domain.duplicates import Recorded, conflict
from domain.errors import InvalidUsage
from domain.metering import Metering
from domain.metering_events import MeteredBatch, meter_batch_events
from domain.ports import DeadLetter
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageWindow
from store.errors import DATABASE_ERRORS, ConcurrencyExhausted
from store.ledger import BillingLedger

__all__ = [
    "IngestStats",
    "conflicts",
    "count_outcomes",
    "decode",
    "record",
    "trace_reserve",
]


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
    in_line: int = 0  # batches saved behind that failed or were not decided: done in line
    batch_seconds: list[float] = field(default_factory=list)  # read to offsets committed

    def add(
        self,
        records: int,
        decision: MeteredBatch,
        *,
        dead_letters: int,
        conflicting: int,
        attempts: int,
        seconds: float,
    ) -> dict[str, int]:
        """Count a batch done (and its records by outcome in the metrics); its counts."""
        duplicates = len(decision.duplicates) - conflicting
        count_outcomes(decision, dead_letters, duplicates)
        self.records += records
        self.transactions += len(decision.transactions)
        self.duplicates += duplicates
        self.conflicting_duplicates += conflicting
        self.refused += len(decision.refused)
        self.dead_letters += dead_letters
        self.batches += 1
        self.conflicts += attempts - 1
        self.batch_seconds.append(seconds)
        return {
            "records": records,
            "transactions": len(decision.transactions),
            "duplicates": duplicates,
            "refused": len(decision.refused),
            "dead_letters": dead_letters,
        }


# Contention and the database: never blamed on a record by the last-resort guard.
_NOT_A_RECORDS_FAULT: tuple[type[Exception], ...] = (ConcurrencyExhausted, *DATABASE_ERRORS)


DEFAULT_WINDOW = UsageWindow()


def decode(
    records: Sequence[Any],
    max_bytes: int,
    window: UsageWindow = DEFAULT_WINDOW,
    now: datetime | None = None,
) -> tuple[list[Metering], list[DeadLetter]]:
    """The valid records as usage, and a dead letter for each of the others (``window``
    judges ``occurred_at`` against ``now``, the clock when omitted)."""
    valid: list[Metering] = []
    letters: list[DeadLetter] = []
    clock = now or datetime.now(UTC)
    for rec in records:
        source = Source(rec.topic, rec.partition, rec.offset)
        try:
            usage = window.check(decode_usage_fast(rec.value, max_bytes=max_bytes), clock)
            valid.append(Metering(usage, source))
        except InvalidUsage as exc:
            letters.append(letter(rec, str(exc)))
        except Exception as exc:  # the last resort: one record never stops a batch
            letters.append(letter(rec, internal_reason(exc, source)))
    return valid, letters


def record(
    ledger: BillingLedger, valid: list[Metering]
) -> tuple[MeteredBatch, list[tuple[Metering, str]]]:
    """``record_usage``; when it raises, the records that raise on their own are set
    aside (a refusal with its reason, anything else ``internal: <type>``) and the rest
    saved."""
    culprits: list[tuple[Metering, str]] = []
    while True:
        try:
            return ledger.record_usage(valid), culprits
        except _NOT_A_RECORDS_FAULT:
            raise
        except Exception:
            found = _culprits(ledger, valid)
            if not found:
                raise  # no single record causes it: fail the batch, uncommitted
        culprits += found
        bad = {id(m) for m, _ in found}
        valid = [m for m in valid if id(m) not in bad]


def _culprits(ledger: BillingLedger, valid: Sequence[Metering]) -> list[tuple[Metering, str]]:
    """The records whose decision or event encoding raises on its own (no write)."""
    found: list[tuple[Metering, str]] = []
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
        except InvalidUsage as exc:
            # Pricing's refusals the decision rejects itself; one raised past it (a rule
            # met while the record's line is settled, in the save) is still this
            # record's, with a reason of its own: set aside, not the batch failed again.
            found.append((metering, str(exc)))
        except DATABASE_ERRORS:
            raise  # loading the account failed: not this record's fault
        except Exception as exc:
            found.append((metering, internal_reason(exc, metering.source)))
    return found


def conflicts(ledger: BillingLedger, decision: MeteredBatch) -> list[tuple[Metering, str]]:
    """The duplicates that are not the same record as the one recorded, with their
    reasons (``domain.duplicates``); the rest are silent duplicates. The recorded side
    is read from the transactions' ``Metered`` events, one query per batch that has
    duplicates, none otherwise."""
    if not decision.duplicates:
        return []
    wanted = {m.transaction_id for m in decision.duplicates}
    # Only the duplicated ones: a transaction's Metered event is built when asked for.
    first: dict[Any, Any] = {t.id: t.metered for t in decision.transactions if t.id in wanted}
    earlier = [m.transaction_id for m in decision.duplicates if m.transaction_id not in first]
    if earlier:
        first.update(ledger.first_events(earlier))
    found: list[tuple[Metering, str]] = []
    for metering in decision.duplicates:
        metered = first.get(metering.transaction_id)
        if not isinstance(metered, BillingTransaction.Metered):
            continue  # not a transaction's history: nothing to compare with
        reason = conflict(metering.record, Recorded.of(metered))
        if reason is not None:
            found.append((metering, reason))
    return found


def count_outcomes(decision: MeteredBatch, dead_letters: int, duplicates: int) -> None:
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


def trace_reserve(
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
