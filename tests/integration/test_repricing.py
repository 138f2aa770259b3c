"""Re-pricing against real PostgreSQL and the Stripe emulator over HTTP: usage on an open
period and usage on a finalized invoice, then a price version published effective from
before both (``prices publish`` through the command line). The open line is re-priced
(each transaction's Repriced with its old and new exact amounts, the line's total), the
next push sets the new total in Stripe's draft, and the invoice finalizes at it; the
finalized invoice is left alone and reported. The reconciler re-prices by itself when
no command runs. Each ends with a clean audit, Stripe included."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import pytest

from adapters.audit.replay import Scope
from adapters.audit.report import audit, stripe_invoice_items, stripe_invoice_totals
from adapters.bootstrap import build_closer, build_pusher, build_reconciler, build_scheduler
from adapters.charging.closer import InvoiceCloser
from adapters.charging.pusher import LinePusher
from adapters.settings import Settings
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering, Source
from domain.pricing import PriceList
from domain.transaction import BillingTransaction
from domain.usage import UsageRecord
from infra.stripe_emulator import StripeEmulator
from projections.balances import balances
from projections.projector import Projector
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import (
    finalize,
    price_file,
    projection_rows,
    rebuild_all,
)
from tools.summary import Balances

pytestmark = pytest.mark.integration

DONE_AT = datetime(2026, 12, 1, 12, tzinfo=UTC)  # a period whose invoice is finalized first
EFFECTIVE = "2026-11-01T00:00:00Z"  # the new version's moment: before both


@dataclass
class Parts:
    settings: Settings
    ledger: BillingLedger
    pusher: LinePusher
    closer: InvoiceCloser
    emulator: StripeEmulator

    def record(
        self, customer: str, usage_ids: list[str], at: datetime, first: int = 0
    ) -> list[UUID]:
        """Usage of api.requests, quantities 2500 + first, 2500 + first + 1, ..."""
        batch = [
            Metering(
                UsageRecord(
                    usage_id=u,
                    customer_id=customer,
                    meter="api.requests",
                    quantity=Decimal(2500 + first + i),
                    occurred_at=at,
                ),
                Source("usage", 0, first + i),
            )
            for i, u in enumerate(usage_ids)
        ]
        return [t.id for t in self.ledger.record_usage(batch).transactions]

    def line(self, txn: UUID) -> InvoiceLine:
        line_id = self.ledger.transaction(txn).line_id
        assert line_id is not None
        return self.ledger.line_by_id(line_id)

    def invoice(self, invoice_id: UUID) -> Invoice:
        found = self.ledger.invoice_by_id(invoice_id)
        assert found is not None
        return found

    def finalize(self, invoice_id: UUID) -> Invoice:
        return finalize(self.closer, self.ledger, invoice_id)

    def project(self) -> None:
        with (
            Database(self.settings.database_url) as db,
            Projector(db, self.ledger.mapper.to_domain_event) as projector,
        ):
            projector.pump_all()

    def stripe_total(self, stripe_invoice_id: str | None) -> int:
        [found] = [i for i in self.emulator.invoices() if i["id"] == stripe_invoice_id]
        return int(found["total"])

    def audit_findings(self) -> list[str]:
        self.project()
        with Database(self.settings.database_url) as db:
            report = audit(
                db, Scope(), horizon=self.settings.retry_policy().horizon,
                stripe_items=lambda: stripe_invoice_items(self.settings.stripe()),
                stripe_invoices=lambda: stripe_invoice_totals(self.settings.stripe()),
                progress=False,
            )  # fmt: skip
        return [f"{f.kind} {f.subject}: {f.detail}" for f in report.findings]


@pytest.fixture
def parts(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> Iterator[Parts]:
    settings = stripe_settings.model_copy(update={"billing_period": "day", "invoice_grace_s": 0.0})
    ledger.periods = settings.periods()
    pusher = build_pusher(settings, ledger)
    yield Parts(settings, ledger, pusher, build_closer(settings, pusher), emulator)


def _repriced(ledger: BillingLedger, txn: UUID) -> list[BillingTransaction.Repriced]:
    return [e for e in ledger.events.get(txn) if isinstance(e, BillingTransaction.Repriced)]


def test_a_version_published_for_the_past_reprices_the_open_line_and_reports_the_final_one(
    parts: Parts, tmp_path: Path
) -> None:
    # A finalized invoice, and an open one: one transaction charged (pushed), one not yet.
    [done] = parts.record("done", ["d-1"], DONE_AT)
    final = parts.finalize(parts.line(done).invoice_id)
    final_stripe = parts.stripe_total(final.stripe_invoice_id)
    # Closed, not finalizing yet: its draft still takes changes.
    [closing] = parts.record("closing", ["c-1"], DONE_AT)
    parts.pusher.push(parts.line(closing).id)
    closed, frozen = parts.invoice(parts.line(closing).invoice_id), parts.line(closing)
    closed.close("test")
    frozen.freeze()
    parts.ledger.save(closed, frozen)
    now = datetime.now(UTC)
    charged = parts.record("open", ["o-1"], now)[0]
    parts.pusher.push(parts.line(charged).id)
    waiting = parts.record("open", ["o-2"], now, first=1)[0]
    open_line = parts.line(charged)
    assert open_line.id == parts.line(waiting).id
    old = {t: parts.ledger.transaction(t).amount for t in (charged, waiting)}
    assert old == {charged: Decimal(250), waiting: Decimal("250.1")}  # 0.001 USD each
    parts.project()

    published = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "prices", "publish",
         str(price_file(tmp_path, "0.003")), "--effective-from", EFFECTIVE],
        env=settings_env(parts.settings), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    out = published.stdout.splitlines()
    assert out[0].startswith("published price book version 2, in force from 2026-11-01")
    assert "re-priced 3 transactions on 2 lines of draft invoices" in out
    assert out[-3].startswith("1 lines of finalizing or final invoices are left as they are")
    assert out[-1].split() == [
        str(final.id), final.stripe_invoice_id, "finalized", "done", "2026-12-01T00:00:00Z",
        "api.requests", "2.50", "USD", "7.50", "USD",
    ]  # fmt: skip

    # Each open transaction: its old and new versions and exact amounts; the line follows.
    for txn, amount in ((charged, Decimal(750)), (waiting, Decimal("750.3"))):
        [event] = _repriced(parts.ledger, txn)
        assert (event.old_price_version, event.price_version) == (1, 2)
        assert (event.old_amount, event.amount) == (old[txn], amount)
    line = parts.ledger.line_by_id(open_line.id)
    assert (line.exact_total, line.billed) == (Decimal("1500.3"), 1500)
    [line_event] = [e for e in parts.ledger.events.get(line.id, gt=open_line.version)
                    if isinstance(e, InvoiceLine.Repriced)]  # fmt: skip
    assert sorted(line_event.transaction_ids) == sorted([str(charged), str(waiting)])

    # The finalized invoice is left as it was, in the ledger and in Stripe; it needs an
    # operator, who settles it.
    assert parts.ledger.transaction(done).amount == Decimal(250)
    assert _repriced(parts.ledger, done) == []
    assert parts.stripe_total(final.stripe_invoice_id) == final_stripe == 250
    attention = parts.invoice(final.id).attention
    assert attention is not None
    assert attention.startswith("re-priced by price book version 2 after it was finalized")
    assert "bills 2.50 USD, the prices in force make it 7.50 USD" in attention

    # The closed invoice: re-priced, adjusted, finalized at its new total.
    assert [e.amount for e in _repriced(parts.ledger, closing)] == [Decimal(750)]
    adjusted = [e for e in parts.ledger.events.get(closed.id) if isinstance(e, Invoice.Adjusted)]
    assert [a.reason for a in adjusted] == ["re-priced by price book version 2"]
    assert parts.finalize(closed.id).total == 750
    assert parts.stripe_total(parts.invoice(closed.id).stripe_invoice_id) == 750

    # The next push sets the new total in the draft; the invoice finalizes at it.
    parts.pusher.push(line.id)
    invoice = parts.invoice(line.invoice_id)
    assert parts.stripe_total(invoice.stripe_invoice_id) == 1500
    finalized = parts.finalize(invoice.id)
    assert finalized.total == finalized.expected_total == 1500
    assert parts.stripe_total(finalized.stripe_invoice_id) == 1500
    assert parts.ledger.transaction(waiting).state.name == "CHARGED"

    assert parts.audit_findings() == []
    live = projection_rows(parts.settings.database_url)
    rebuild_all(parts.settings.database_url, parts.ledger)  # I5, with Repriced in the history
    assert projection_rows(parts.settings.database_url) == live
    fold = Balances().apply_all(parts.ledger.all_events()).by_customer["open"]["USD"]
    with Database(parts.settings.database_url) as db, db.connection() as conn:
        [row] = balances(conn, customer="open")
    assert (fold.metered, fold.charged, fold.in_flight) == (row["metered"], row["charged"], 0)
    assert (row["metered"], row["charged"], row["in_flight"]) == (
        Decimal("1500.3"), Decimal("1500.3"), Decimal(0),
    )  # fmt: skip

    settled = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "invoices", "settle", str(final.id),
         "--how", "credit note in Stripe for 5.00 USD", "--by", "ops@example.com"],
        env=settings_env(parts.settings), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    # Nothing is left to re-price on drafts; the final one is still reported, not raised.
    again = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "prices", "reprice", "--json"],
        env=settings_env(parts.settings), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["repriced"] == []
    assert [(c["customer_id"], c["billed_before"], c["billed_now"], c["attention_raised"])
            for c in report["final_invoices"]] == [("done", 250, 750, None)]  # fmt: skip
    assert parts.invoice(final.id).attention is None


def test_the_reconciler_reprices_by_itself_and_the_draft_follows(parts: Parts) -> None:
    now = datetime.now(UTC)
    txns = parts.record("solo", ["s-1", "s-2", "s-3"], now)
    line_id = parts.line(txns[0]).id
    parts.pusher.push(line_id)
    parts.project()
    cheaper = PriceList.from_meters(
        {**parts.ledger.refresh_prices().latest.prices.to_meters(),
         "api.requests": {"unit_price": "0.0004", "per": 1, "currency": "USD"}}
    )  # fmt: skip
    parts.ledger.publish_prices(cheaper, datetime(2026, 11, 1, tzinfo=UTC))
    with Database(parts.settings.database_url) as db:
        scheduler = build_scheduler(parts.settings, parts.pusher)
        reconciler = build_reconciler(parts.settings, parts.pusher, scheduler, db)
        report = reconciler.pass_once()
        assert report.repriced == 1
        assert reconciler.repricer is not None
        assert reconciler.repricer.due()  # a cycle that re-priced is not clean
        assert reconciler.pass_once().repriced == 0  # nothing more
        assert not reconciler.repricer.due()  # clean: skipped until the book changes
    amounts = [parts.ledger.transaction(t).amount for t in txns]
    assert amounts == [Decimal(100), Decimal("100.04"), Decimal("100.08")]  # 0.0004 USD x qty
    line = parts.ledger.line_by_id(line_id)
    assert (line.exact_total, line.billed) == (Decimal("300.12"), 300)
    parts.pusher.push(line_id)
    invoice = parts.invoice(line.invoice_id)
    assert parts.stripe_total(invoice.stripe_invoice_id) == 300
    assert parts.audit_findings() == []
