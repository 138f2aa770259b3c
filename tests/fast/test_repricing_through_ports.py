"""The re-pricer through its ports: an in-memory ledger and a hand-written read model of
candidates. A pass re-prices draft invoices' lines in one save each (reloading after a
lost race), reports final ones and raises their attention once, walks the candidates
in bounded passes, and is due again only when the price book changed or an hour went
by; the reconciler runs it while it is due."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.corrections import Corrections
from adapters.charging.reconciler import Reconciler
from adapters.charging.repricing import RESCAN_S, Repricer, RepriceReport
from adapters.charging.scheduler import LineScheduler
from domain.invoice import Invoice
from domain.invoice_states import StripeInvoiceView
from domain.pricing import PriceList
from domain.transaction import BillingTransaction
from store.ledger import BillingLedger
from tests.fast.fakes import T0, FakeGateway, memory_ledger, reserve

NOVEMBER = T0 - timedelta(days=30)


class Candidates:
    """``billing.transactions`` as the re-pricer reads it: every (transaction, line) the
    test names, in id order after the cursor, at most the limit (a superset of what the
    SQL would give: the decision is the aggregates')."""

    def __init__(self, ledger: BillingLedger, txns: list[UUID]) -> None:
        self.ledger = ledger
        self.txns = txns
        self.queries: list[dict[str, Any]] = []

    @contextmanager
    def connection(self) -> Iterator[Candidates]:
        yield self

    def execute(self, query: Any, params: dict[str, Any]) -> Candidates._Rows:
        assert "price_version" in query.as_string(None)
        self.queries.append(params)
        rows = sorted((t, self.ledger.transaction(t).line_id) for t in self.txns)
        after = [r for r in rows if r[0] > params["after"]]
        return self._Rows(after[: params["limit"]])

    class _Rows:
        def __init__(self, rows: list[Any]) -> None:
            self.rows = rows

        def fetchall(self) -> list[Any]:
            return self.rows


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _publish(ledger: BillingLedger, unit_price: str, at: datetime = NOVEMBER) -> None:
    meters = ledger.refresh_prices().latest.prices.to_meters()
    meters["api.requests"] = {"unit_price": unit_price, "per": 1, "currency": "USD"}
    ledger.publish_prices(PriceList.from_meters(meters), at)


def _repricer(
    ledger: BillingLedger, txns: list[UUID], per_pass: int = 2000
) -> tuple[Repricer, Candidates, Clock]:
    candidates, clock = Candidates(ledger, txns), Clock()
    return Repricer(ledger, candidates, per_pass=per_pass, monotonic=clock), candidates, clock  # type: ignore[arg-type]


def _repriced(ledger: BillingLedger, txn: UUID) -> list[BillingTransaction.Repriced]:
    return [e for e in ledger.events.get(txn) if isinstance(e, BillingTransaction.Repriced)]


def _finalize(ledger: BillingLedger, txn: UUID) -> Invoice:
    """Its invoice closed, finalizing and finalized, as the closer and Stripe leave it."""
    line_id = ledger.transaction(txn).line_id
    assert line_id is not None
    line = ledger.line_by_id(line_id)
    invoice = ledger.invoice_by_id(line.invoice_id)
    assert invoice is not None
    invoice.record_draft(f"in_{invoice.customer_id}", f"cus_{invoice.customer_id}")
    invoice.close("test")
    line.freeze()
    invoice.start_finalizing([(line.id, line.sequence, line.billed)])
    view = StripeInvoiceView("open", "INV-1", line.billed, 0, 0, None, T0, "finalize")
    assert invoice.observe(view)
    ledger.save(invoice, line)
    return invoice


def test_a_pass_reprices_each_draft_line_in_one_save_and_moves_the_account() -> None:
    ledger = memory_ledger()
    txns = reserve(ledger, 2, quantity=1000)  # 1.00 USD each at 0.001
    _publish(ledger, "0.0025")
    repricer, candidates, _ = _repricer(ledger, txns)
    report, following = repricer.pass_once()
    assert following is None
    assert (report.lines, report.transactions, report.candidates, report.cycles) == (1, 2, 2, 1)
    for txn in txns:
        [event] = _repriced(ledger, txn)
        assert (event.old_amount, event.amount, event.price_version) == (100, 250, 2)
    line = ledger.line_by_id(ledger.transaction(txns[0]).line_id)  # type: ignore[arg-type]
    assert (line.exact_total, line.billed) == (Decimal(500), 500)
    account = ledger.account("acme", "USD")
    assert account is not None and account.reserved == Decimal(500)
    spans = candidates.queries[0]
    assert (spans["numbers"], spans["starts"][1], spans["drafts_only"]) == ([1, 2], NOVEMBER, False)
    assert repricer.pass_once()[0].lines == 0  # nothing left: priced by the version in force


def test_passes_walk_the_candidates_and_are_due_again_only_when_the_book_changes() -> None:
    ledger = memory_ledger()
    txns = [reserve(ledger, 1, customer=c)[0] for c in ("a", "b", "c")]  # three lines
    _publish(ledger, "0.002")
    repricer, candidates, clock = _repricer(ledger, txns, per_pass=2)
    assert repricer.due()  # never ran
    first, following = repricer.pass_once()
    assert (first.lines, first.cycles, following) == (2, 0, sorted(txns)[1])
    second, following = repricer.pass_once()
    assert (second.lines, second.cycles, following) == (1, 1, None)
    assert [q["after"] for q in candidates.queries] == [UUID(int=0), sorted(txns)[1]]
    assert repricer.due()  # that cycle re-priced: look again
    repricer.pass_once()
    assert repricer.pass_once()[0].cycles == 1  # a whole cycle with nothing to do
    assert not repricer.due()
    clock.now += RESCAN_S - 1
    assert not repricer.due()
    clock.now += 1
    assert repricer.due()  # hourly anyway
    clock.now -= 1
    _publish(ledger, "0.003")
    assert repricer.due()  # a new version
    repricer.pass_once()
    repricer.pass_once()
    # Each cycle's first pass: the first after a version looks at final invoices too.
    firsts = [q["drafts_only"] for q in candidates.queries if q["after"] == UUID(int=0)]
    assert firsts == [False, True, False]
    assert repricer.run_cycle().cycles == 1
    assert candidates.queries[-1]["drafts_only"] is False  # the commands: every invoice


def test_a_final_invoice_is_left_alone_reported_and_needs_attention_once() -> None:
    ledger = memory_ledger()
    [done] = reserve(ledger, 1, customer="done")
    final = _finalize(ledger, done)
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, [done])
    report, _ = repricer.pass_once()
    assert (report.lines, _repriced(ledger, done)) == (0, [])
    [left] = report.frozen
    assert (left.invoice_id, left.invoice_state, left.decision.new_billed) == (
        final.id,
        "finalized",
        200,
    )
    invoice = ledger.invoice_by_id(final.id)
    assert invoice is not None and invoice.attention == left.attention
    assert left.attention is not None and "bills 1.00 USD" in left.attention
    invoice.settle_attention("credit note", "ops")
    ledger.save(invoice)
    again, _ = repricer.pass_once()
    assert again.frozen[0].attention is None  # raised once
    settled = ledger.invoice_by_id(final.id)
    assert settled is not None and settled.attention is None


def test_an_invoice_that_needs_another_attention_keeps_it_and_gets_this_one_later() -> None:
    ledger = memory_ledger()
    [done] = reserve(ledger, 1, customer="done")
    final = _finalize(ledger, done)
    final.need_attention("something else")
    ledger.save(final)
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, [done])
    assert repricer.pass_once()[0].frozen[0].attention is None
    invoice = ledger.invoice_by_id(final.id)
    assert invoice is not None and invoice.attention == "something else"


def test_a_dry_run_reports_and_records_nothing() -> None:
    ledger = memory_ledger()
    txns = reserve(ledger, 1)
    [done] = reserve(ledger, 1, customer="done")
    _finalize(ledger, done)
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, [*txns, done])
    versions = {t: ledger.transaction(t).version for t in (*txns, done)}
    report = repricer.run_cycle(dry_run=True)
    assert (report.lines, len(report.repriced), len(report.frozen)) == (0, 1, 1)
    assert report.frozen[0].attention is None
    assert {t: ledger.transaction(t).version for t in (*txns, done)} == versions
    invoice = ledger.invoice_by_id(report.frozen[0].invoice_id)
    assert invoice is not None and invoice.attention is None


class Racing(BillingLedger):
    """A ledger whose first ``losses`` saves with a transaction in them lose the race."""

    losses = 0

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        if self.losses and any(isinstance(o, BillingTransaction) for o in objs):
            self.losses -= 1
            raise IntegrityError("another writer saved first")
        return super().save(*objs, **kwargs)


def _racing() -> Racing:
    return Racing(memory_ledger().configured, env={"PERSISTENCE_MODULE": "eventsourcing.popo"})


def test_a_lost_race_is_decided_again_and_one_that_never_ends_is_reported() -> None:
    ledger = _racing()
    txns = reserve(ledger, 1)
    _publish(ledger, "0.002")
    ledger.losses = 1
    repricer, _, _ = _repricer(ledger, txns)
    assert repricer.pass_once()[0].lines == 1
    assert len(_repriced(ledger, txns[0])) == 1

    ledger = _racing()
    txns = reserve(ledger, 1)
    _publish(ledger, "0.002")
    ledger.losses = Repricer.max_races
    repricer, _, _ = _repricer(ledger, txns)
    report, _ = repricer.pass_once()
    assert (report.lines, report.raced) == (0, 1)
    assert repricer.due()  # raced: not clean


def test_a_stop_ends_the_pass_before_the_next_line_and_keeps_the_cursor() -> None:
    ledger = memory_ledger()
    txns = reserve(ledger, 1)
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, txns)
    stop = threading.Event()
    stop.set()
    report, following = repricer.pass_once(stop)
    assert (report.lines, following) == (0, UUID(int=0))
    assert _repriced(ledger, txns[0]) == []


def test_run_cycle_reports_progress_pass_by_pass() -> None:
    ledger = memory_ledger()
    txns = [reserve(ledger, 1, customer=c)[0] for c in ("a", "b", "c")]
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, txns, per_pass=2)
    seen: list[int] = []
    report = repricer.run_cycle(progress=lambda r: seen.append(r.transactions))
    assert (seen, report.lines, report.cycles) == ([2, 3], 3, 1)


class Stub(Repricer):
    def __init__(self, due: bool) -> None:
        self.is_due, self.passes = due, 0

    def due(self) -> bool:
        return self.is_due

    def pass_once(self, stop: threading.Event | None = None, **_: Any) -> Any:
        self.passes += 1
        report = RepriceReport(lines=3)
        return report, None


class NoWork:
    @contextmanager
    def connection(self) -> Iterator[NoWork]:
        yield self

    def execute(self, query: Any, params: Any = None) -> Any:
        return Candidates._Rows([])


def test_the_reconciler_runs_a_pass_only_while_one_is_due() -> None:
    ledger = memory_ledger()
    scheduler = LineScheduler.__new__(LineScheduler)  # never called: no open line
    for due, passes, repriced in ((True, 1, 3), (False, 0, 0)):
        stub = Stub(due)
        reconciler = Reconciler(
            Corrections(ledger, FakeGateway()),
            scheduler,
            NoWork(),
            repricer=stub,  # type: ignore[arg-type]
        )
        assert reconciler.pass_once().repriced == repriced
        assert stub.passes == passes


def test_a_cycle_adds_up_its_passes_and_each_line_reports_what_it_left_alone() -> None:
    ledger = memory_ledger()
    gpu = [reserve(ledger, 1, customer=c, meter="gpu.a100.seconds")[0] for c in ("g1", "g2")]
    api = [reserve(ledger, 1, customer=c)[0] for c in ("a1", "a2")]
    [done] = reserve(ledger, 1, customer="done")
    final = _finalize(ledger, done)
    meters = ledger.refresh_prices().latest.prices.to_meters()
    meters["api.requests"] = {"unit_price": "0.002", "per": 1, "currency": "USD"}
    del meters["gpu.a100.seconds"]
    ledger.publish_prices(PriceList.from_meters(meters), NOVEMBER)
    repricer, candidates, _ = _repricer(ledger, [*gpu, *api, done], per_pass=3)
    report = repricer.run_cycle()
    assert [q["limit"] for q in candidates.queries] == [3, 3]
    assert (report.candidates, report.lines, report.transactions, report.cycles) == (5, 2, 2, 1)
    assert sorted(left.transaction_id for left in report.left) == sorted(gpu)
    assert {d.line_id for d in report.repriced} == {ledger.transaction(t).line_id for t in api}
    [left] = report.frozen
    assert (left.stripe_invoice_id, left.invoice_id) == ("in_done", final.id)


def test_the_default_pass_reads_2000_candidates_and_a_cycle_of_one_line_is_not_clean() -> None:
    ledger = memory_ledger()
    txns = reserve(ledger, 1)
    _publish(ledger, "0.002")
    candidates = Candidates(ledger, txns)
    repricer = Repricer(ledger, candidates)  # type: ignore[arg-type]
    report, _ = repricer.pass_once()
    assert (candidates.queries[0]["limit"], report.lines, report.cycles) == (2000, 1, 1)
    assert repricer.due()
    assert repricer.pass_once()[0].cycles == 1
    assert not repricer.due()


def test_a_first_cycle_with_nothing_to_do_is_clean() -> None:
    ledger = memory_ledger()
    repricer, _, _ = _repricer(ledger, [])
    assert repricer.pass_once()[0].cycles == 1
    assert not repricer.due()


def test_the_next_pass_starts_after_the_last_candidate_read() -> None:
    ledger = memory_ledger()
    txns = [reserve(ledger, 1, customer=c)[0] for c in ("a", "b", "c", "d")]
    repricer, _, _ = _repricer(ledger, txns, per_pass=3)
    assert repricer.pass_once()[1] == sorted(txns)[2]


def test_a_closed_invoice_is_repriced_with_its_adjustment_in_the_same_save() -> None:
    ledger = memory_ledger()
    txns = reserve(ledger, 1)
    line = ledger.line_by_id(ledger.transaction(txns[0]).line_id)  # type: ignore[arg-type]
    invoice = ledger.invoice_by_id(line.invoice_id)
    assert invoice is not None
    invoice.close("test")
    line.freeze()
    ledger.save(invoice, line)
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, txns)
    assert repricer.pass_once()[0].lines == 1
    adjusted = [e for e in ledger.events.get(invoice.id) if isinstance(e, Invoice.Adjusted)]
    assert [a.transaction_ids for a in adjusted] == [[str(txns[0])]]


class InvoiceRacing(BillingLedger):
    """A ledger whose first save of an invoice alone loses the race."""

    lost = False

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        if not self.lost and len(objs) == 1 and isinstance(objs[0], Invoice):
            self.lost = True
            raise IntegrityError("a webhook saved first")
        return super().save(*objs, **kwargs)


def test_an_attention_that_lost_a_race_is_decided_again_and_raised() -> None:
    ledger = InvoiceRacing(
        memory_ledger().configured, env={"PERSISTENCE_MODULE": "eventsourcing.popo"}
    )
    [done] = reserve(ledger, 1, customer="done")
    final = _finalize(ledger, done)
    ledger.lost = False
    _publish(ledger, "0.002")
    repricer, _, _ = _repricer(ledger, [done])
    report, _ = repricer.pass_once()
    assert ledger.lost
    [left] = report.frozen
    assert left.attention is not None
    invoice = ledger.invoice_by_id(final.id)
    assert invoice is not None and invoice.attention == left.attention


def test_every_line_that_never_stops_racing_is_counted() -> None:
    ledger = _racing()
    txns = [reserve(ledger, 1, customer=c)[0] for c in ("a", "b")]
    _publish(ledger, "0.002")
    ledger.losses = 2 * Repricer.max_races
    repricer, _, _ = _repricer(ledger, txns)
    assert repricer.pass_once()[0].raced == 2
