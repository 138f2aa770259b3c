"""The re-pricer: usage priced by a price book version that is no longer the one in force
at its ``occurred_at`` is priced again, on lines whose invoice has not closed.

A pass reads candidates from SQL (``projections.transactions.repricing_candidates``:
transactions in a line, not compensated, whose ``price_version`` is not the one the
schedule puts in force at their moment), at most ``per_pass`` of them after a cursor
that cycles through the table, and decides each line from the loaded aggregates
(``domain.repricing.decide_line``: the read model only says where to look). A line whose
invoice is still a draft (open, or closed and not finalizing) has all of its decided
transactions, the line, the customer's account (and a closed invoice's ``Adjusted``)
saved in **one** save; when ingest, a pusher or the closer saved first, the version
check refuses it and the line is reloaded and decided again. A line of an invoice that
is finalizing or final is left alone and reported, with what the ledger bills and what
the prices in force would make it; a final one whose billed total would change needs an
operator's attention (``domain.repricing.final_attention``, raised once).

The reconciler runs a pass every interval while there may be work: after the price
book changes (a version seen for the first time), until a whole cycle finds nothing to
re-price, and once an hour otherwise (usage recorded just before a publication may reach
the read model after a clean cycle). Its first whole cycle after the book changes also
looks at finalizing and final invoices (reported, their attention raised); the others
read only draft invoices' usage, so an hourly cycle does not load the usage of every
final invoice again. ``billing-ledger prices publish`` with a past ``--effective-from``
and ``billing-ledger prices reprice`` run whole cycles of everything in the foreground.
Forward progress does not depend on either command finishing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.pusher import invoice_of
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.repricing import (
    DRAFT_STATES,
    LeftAlone,
    LineRepricing,
    apply_repricing,
    decide_line,
    final_attention,
)
from projections.transactions import repricing_candidates
from store.connections import Database
from store.ledger import BillingLedger

__all__ = ["FrozenLine", "RepriceReport", "Repricer"]

log = logging.getLogger(__name__)

_START = UUID(int=0)
RESCAN_S = 3600.0  # a whole cycle at least this often, even when the book did not change


@dataclass(frozen=True)
class FrozenLine:
    """A line of an invoice that is finalizing or final, left alone: what the versions in
    force would make of it, and the attention raised on its invoice (if any)."""

    decision: LineRepricing
    invoice_id: UUID
    invoice_state: str
    stripe_invoice_id: str | None
    attention: str | None = None  # raised by this pass


@dataclass
class RepriceReport:
    """What passes did: lines and transactions re-priced, left alone, reported."""

    lines: int = 0
    transactions: int = 0
    candidates: int = 0
    cycles: int = 0  # whole cycles through the candidates completed
    repriced: list[LineRepricing] = field(default_factory=list)
    left: list[LeftAlone] = field(default_factory=list)
    frozen: list[FrozenLine] = field(default_factory=list)
    raced: int = 0  # lines that lost every race (found again by the next pass)

    def add(self, other: RepriceReport) -> None:
        self.lines += other.lines
        self.transactions += other.transactions
        self.candidates += other.candidates
        self.cycles += other.cycles
        self.repriced += other.repriced
        self.left += other.left
        self.frozen += other.frozen
        self.raced += other.raced


class Repricer:
    """Finds usage to re-price and records it, line by line, bounded per pass."""

    max_races = 20

    def __init__(
        self,
        ledger: BillingLedger,
        database: Database,
        *,
        per_pass: int = 2000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.database = database
        self.per_pass = per_pass
        self.monotonic = monotonic
        self._after = _START
        self._found_in_cycle = False
        self._clean: tuple[int, float] | None = None  # (book version, when) of a clean cycle
        self._finals_seen: int | None = None  # the book version a cycle saw final ones at
        self._cycle_finals = True  # this cycle looks at finalizing and final invoices too

    def due(self) -> bool:
        """Whether the reconciler should run a pass now (see the module docstring)."""
        if self._clean is None:
            return True
        version, at = self._clean
        return (
            self.ledger.refresh_prices().latest.number != version
            or self.monotonic() - at >= RESCAN_S
        )

    def pass_once(
        self,
        stop: threading.Event | None = None,
        *,
        dry_run: bool = False,
        cursor: UUID | None = None,
    ) -> tuple[RepriceReport, UUID | None]:
        """One bounded pass from ``cursor`` (every invoice's usage), or, without one, from
        this re-pricer's own cursor (the reconciler's cycles: see the module docstring);
        what it did, and where the next pass starts (None: the cycle is complete).
        ``dry_run``: decide and report, record nothing."""
        schedule = self.ledger.refresh_prices()
        if cursor is None and self._after == _START:  # a new cycle
            self._cycle_finals = self._finals_seen != schedule.latest.number
        after = self._after if cursor is None else cursor
        drafts_only = cursor is None and not self._cycle_finals
        with self.database.connection() as conn:
            rows = repricing_candidates(
                conn, schedule.spans(), after=after, limit=self.per_pass, drafts_only=drafts_only
            )
        report = RepriceReport(candidates=len(rows))
        by_line: dict[UUID, list[UUID]] = {}
        for txn_id, line_id in rows:
            by_line.setdefault(line_id, []).append(txn_id)
        for line_id, txn_ids in by_line.items():
            if stop is not None and stop.is_set():
                return report, after  # the same pass again next time
            self._line(line_id, txn_ids, report, dry_run=dry_run)
        following = rows[-1][0] if len(rows) == self.per_pass else None
        if cursor is None:
            self._advance(following, report, schedule.latest.number)
        return report, following

    def run_cycle(
        self,
        *,
        dry_run: bool = False,
        progress: Callable[[RepriceReport], None] = lambda report: None,
    ) -> RepriceReport:
        """Every candidate once, from the start, pass after pass (the commands' run)."""
        total = RepriceReport()
        cursor: UUID | None = _START
        while cursor is not None:
            report, cursor = self.pass_once(dry_run=dry_run, cursor=cursor)
            total.add(report)
            progress(total)
        total.cycles += 1
        return total

    def _advance(self, following: UUID | None, report: RepriceReport, version: int) -> None:
        self._found_in_cycle = self._found_in_cycle or report.lines > 0 or report.raced > 0
        if following is not None:
            self._after = following
            return
        if not self._found_in_cycle:
            self._clean = (version, self.monotonic())
        if self._cycle_finals:
            self._finals_seen = version
        report.cycles += 1
        self._after, self._found_in_cycle = _START, False

    def _line(
        self, line_id: UUID, txn_ids: Sequence[UUID], report: RepriceReport, *, dry_run: bool
    ) -> None:
        """Decide one line and record it (reload and decide again after a lost race)."""
        schedule = self.ledger.refresh_prices()
        for _ in range(self.max_races):
            line = self.ledger.line_by_id(line_id)
            txns = {i: self.ledger.transaction(i) for i in txn_ids}
            decision = decide_line(line, txns.values(), schedule)
            if not decision.changes:
                report.left += decision.left
                return
            invoice = invoice_of(self.ledger, line)
            if invoice.state not in DRAFT_STATES:
                if self._left_alone(decision, invoice, report, dry_run=dry_run):
                    return
                continue
            if dry_run:
                report.repriced.append(decision)
                report.left += decision.left
                return
            account = self.ledger.account(line.customer_id, line.currency)
            assert account is not None  # reserved usage has its account (ingest's save)
            apply_repricing(decision, line, txns, account, invoice)
            changed = [txns[c.transaction_id] for c in decision.changes]
            adjusted = [invoice] if invoice.pending_events else []
            try:
                self.ledger.save(line, account, *adjusted, *changed)
            except (IntegrityError, IllegalTransition):
                continue
            report.lines += 1
            report.transactions += len(decision.changes)
            report.repriced.append(decision)
            report.left += decision.left
            _log_line(decision)
            return
        report.raced += 1

    def _left_alone(
        self, decision: LineRepricing, invoice: Invoice, report: RepriceReport, *, dry_run: bool
    ) -> bool:
        """Report a line of an invoice no longer a draft, and raise the attention a final
        one needs (unless it needs another now: raised by a later pass, once that one is
        settled); False when that save lost a race (decide again)."""
        reason = final_attention(decision, invoice)
        if reason is not None and not dry_run and invoice.attention is None:
            invoice.need_attention(reason)
            try:
                self.ledger.save(invoice)
            except IntegrityError:
                return False
            metrics().invoices.add(1, {"step": "needs_attention"})
            _log_attention(invoice, reason)
        else:
            reason = None
        report.frozen.append(
            FrozenLine(decision, invoice.id, str(invoice.state), invoice.stripe_invoice_id, reason)
        )
        report.left += decision.left
        return True


def _log_line(decision: LineRepricing) -> None:  # pragma: no mutate block
    log.info(
        "line repriced",
        extra=step_fields("reprice", "repriced", line_id=str(decision.line_id),
                          customer_id=decision.customer_id, meter=decision.meter,
                          transactions=len(decision.changes), billed=decision.new_billed,
                          was=decision.billed),
    )  # fmt: skip


def _log_attention(invoice: Invoice, reason: str) -> None:  # pragma: no mutate block
    log.warning(
        "invoice needs attention: %s", reason,
        extra=step_fields("reprice", "needs_attention", invoice_id=str(invoice.id),
                          customer_id=invoice.customer_id),
    )  # fmt: skip
