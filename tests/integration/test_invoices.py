"""Invoices against real PostgreSQL and the Stripe emulator over HTTP: a period closed,
its lines' final totals pushed, finalized in Stripe once, paid through a signed
webhook on the ledger's own listener; webhooks deduplicated in the effect's
transaction, applied in any order, refused when forged or replayed, answered 503
while the database is away and recorded once when Stripe retries; late usage on the
next period; a reversal after finalizing credited once by racing closers. Each ends
with the audit."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from adapters.audit.replay import Scope
from adapters.audit.report import audit, stripe_invoice_items, stripe_invoice_totals
from adapters.bootstrap import (
    build_closer,
    build_corrections,
    build_pusher,
    build_webhook_server,
    database,
)
from adapters.charging.closer import CloseResult, InvoiceCloser
from adapters.charging.drafts import CheckResult, DraftChecker
from adapters.charging.pusher import LinePusher
from adapters.http.server import HttpServer
from adapters.settings import Settings
from adapters.stripe.client import StripeGateway
from adapters.stripe.views import stripe_event
from adapters.webhooks.app import PATH
from adapters.webhooks.handler import WebhookHandler
from domain.closing import TRUE_UP_METER
from domain.contract import check_terms
from domain.health import assess
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.metering import Metering, Source
from domain.money import format_money
from domain.ports import ItemRepair
from domain.price_book import EPOCH
from domain.saga import ChargeFailure
from domain.usage import UsageRecord
from domain.verification import DraftView
from infra.stripe_emulator import StripeEmulator
from infra.stripe_emulator.webhooks import sign
from projections.invoices import drafts_to_check
from projections.projector import Projector
from projections.queue_health import read_health
from store.connections import Database
from store.ledger import BillingLedger
from store.webhooks import WebhookStore
from tests.integration.support import finalize, record, run_cli, wait_for

SECRET = "whsec_test_invoices"
OLD_SECRET = "whsec_test_rotated_out"


@dataclass
class Parts:
    settings: Settings
    ledger: BillingLedger
    pusher: LinePusher
    closer: InvoiceCloser
    server: HttpServer
    store: WebhookStore
    emulator: StripeEmulator

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}{PATH}"

    def invoice(self, invoice_id: UUID) -> Invoice:
        found = self.ledger.invoice_by_id(invoice_id)
        assert found is not None
        return found

    def finalize(self, invoice_id: UUID) -> Invoice:
        """Close now, push the final totals, finalize: as the close role does."""
        return finalize(self.closer, self.ledger, invoice_id)

    def post(self, body: bytes, signature: str | None) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if signature is not None:
            headers["Stripe-Signature"] = signature
        request = urllib.request.Request(self.url, body, headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def parts(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> Iterator[Parts]:
    settings = stripe_settings.model_copy(
        update={
            "billing_period": "day",
            "invoice_grace_s": 0.0,
            "webhook_port": 0,
            "webhook_secrets": SecretStr(f"{SECRET},{OLD_SECRET}"),
            "webhook_timeout_s": 5.0,
        }
    )
    ledger.periods = settings.periods()
    pusher = build_pusher(settings, ledger)
    with database(settings) as db:
        server = build_webhook_server(settings, ledger)
        server.start()
        assert server.wait_started()
        try:
            yield Parts(settings, ledger, pusher, build_closer(settings, pusher), server,
                        WebhookStore(db), emulator)  # fmt: skip
        finally:
            server.stop()


def _invoice_of(ledger: BillingLedger, txn: UUID) -> UUID:
    line_id = ledger.transaction(txn).line_id
    assert line_id is not None
    return ledger.line_by_id(line_id).invoice_id


def _close_until_it_stops(parts: Parts, invoice_id: UUID) -> CloseResult:
    """Close the invoice now and step it while it waits (five steps at most)."""
    step = parts.closer.step(invoice_id, close_now="test")
    for _ in range(5):
        if step.result is not CloseResult.WAITING:
            break
        step = parts.closer.step(invoice_id)
    return step.result


def _audit_clean(parts: Parts) -> None:
    with Database(parts.settings.database_url) as db:
        with Projector(db, parts.ledger.mapper.to_domain_event) as projector:
            projector.pump_all()
        report = audit(
            db, Scope(), horizon=parts.settings.retry_policy().horizon,
            stripe_items=lambda: stripe_invoice_items(parts.settings.stripe()), progress=False,
            stripe_invoices=lambda: stripe_invoice_totals(parts.settings.stripe()),
        )  # fmt: skip
    assert report.findings == []


def _stripe_event(emulator: StripeEmulator, type_: str, stripe_invoice: str) -> dict[str, Any]:
    found = [e for e in emulator.events(type_) if e["data"]["object"]["id"] == stripe_invoice]
    assert len(found) == 1, found
    return found[0]


def _signed(event: dict[str, Any], secret: str = SECRET, t: int | None = None) -> tuple[bytes, str]:
    body = json.dumps(event).encode()
    return body, sign(secret, int(time.time()) if t is None else t, body)


def test_a_period_invoice_is_closed_finalized_and_paid_through_a_webhook(parts: Parts) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*", "credit_note.*"])
    txns = record(parts.ledger, "acme", ["a-1", "a-2", "a-3"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txns[0])
    final = parts.finalize(invoice_id)
    [stripe_invoice] = parts.emulator.invoices()
    lines = [parts.ledger.line_by_id(line) for line in final.lines]
    assert (
        final.total
        == final.expected_total
        == stripe_invoice["total"]
        == sum(line.billed for line in lines)
        > 0
    )
    assert (final.number, stripe_invoice["status"]) == (stripe_invoice["number"], "open")
    assert all(line.frozen for line in lines)

    parts.emulator.pay_invoice(stripe_invoice["id"])
    paid = wait_for(
        lambda: (i := parts.invoice(invoice_id)).state is InvoiceState.PAID and i,
        what="invoice.paid to reach the ledger",
    )
    assert paid.amount_paid == final.total
    assert parts.emulator.wait_for_webhooks()
    receipts = {r["type"]: r["outcome"] for r in parts.store.receipts(invoice_id=invoice_id)}
    assert receipts["invoice.paid"] == "applied"
    # The finalize answer and the webhook race to record it: whichever is second is stale,
    # and Finalized is recorded once.
    assert receipts["invoice.finalized"] in ("stale", "applied")
    finalized = [e for e in parts.ledger.events.get(invoice_id) if isinstance(e, Invoice.Finalized)]
    assert len(finalized) == 1
    _audit_clean(parts)


def test_a_webhook_delivered_three_times_has_one_effect(parts: Parts) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.paid"])
    [txn] = record(parts.ledger, "dup", ["d-1"], qty=2500)
    invoice = parts.finalize(_invoice_of(parts.ledger, txn))
    parts.emulator.set_faults(webhook_duplicate_next=1)  # Stripe sends it twice
    parts.emulator.pay_invoice(str(invoice.stripe_invoice_id))
    assert parts.emulator.wait_for_webhooks()
    paid = _stripe_event(parts.emulator, "invoice.paid", str(invoice.stripe_invoice_id))
    assert parts.emulator.resend_event(paid["id"]) == 1  # and an operator resends it
    assert parts.emulator.wait_for_webhooks()
    deliveries = parts.emulator.webhook_deliveries(paid["id"])
    assert [d["status"] for d in deliveries] == [200, 200, 200]
    history = parts.ledger.history(invoice.id)
    assert [type(e) for e in history].count(Invoice.Paid) == 1
    assert [r["event_id"] for r in parts.store.receipts()] == [paid["id"]]
    _audit_clean(parts)


def test_paid_before_finalized_records_both_and_the_late_finalized_changes_nothing(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    [txn] = record(parts.ledger, "order", ["o-1"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txn)
    # The closer's finalize gets no answer (Stripe finalized it all the same, below).
    lost = ChargeFailure("timeout", "no answer", retryable=True)
    monkeypatch.setattr(parts.closer.gateway, "finalize_invoice", lambda *a, **k: lost)
    step = parts.closer.step(invoice_id, close_now="test")
    while parts.invoice(invoice_id).state is InvoiceState.CLOSED:
        step = parts.closer.step(invoice_id)
    assert parts.invoice(invoice_id).state is InvoiceState.FINALIZING, step
    monkeypatch.undo()
    stripe_id = str(parts.invoice(invoice_id).stripe_invoice_id)
    client = parts.pusher.gateway.client  # type: ignore[attr-defined]
    client.v1.invoices.finalize_invoice(stripe_id)
    parts.emulator.pay_invoice(stripe_id)
    paid = _stripe_event(parts.emulator, "invoice.paid", stripe_id)
    finalized = _stripe_event(parts.emulator, "invoice.finalized", stripe_id)

    assert parts.post(*_signed(paid)) == (200, {"outcome": "applied", "event": paid["id"]})
    after_paid = parts.invoice(invoice_id)
    assert after_paid.state is InvoiceState.PAID
    assert after_paid.number == paid["data"]["object"]["number"]
    assert parts.post(*_signed(finalized)) == (200, {"outcome": "stale", "event": finalized["id"]})
    assert parts.invoice(invoice_id).version == after_paid.version
    parts.closer.clock = lambda: datetime.now(UTC) + timedelta(days=1)  # retry due
    assert parts.closer.step(invoice_id).result is CloseResult.DONE  # no second finalize
    _audit_clean(parts)


def test_forged_unsigned_and_replayed_old_signatures_are_refused_and_record_nothing(
    parts: Parts,
) -> None:
    [txn] = record(parts.ledger, "forge", ["f-1"], qty=2500)
    invoice = parts.finalize(_invoice_of(parts.ledger, txn))
    parts.emulator.pay_invoice(str(invoice.stripe_invoice_id))
    paid = _stripe_event(parts.emulator, "invoice.paid", str(invoice.stripe_invoice_id))
    body, _ = _signed(paid)
    forged = _signed(paid, secret="whsec_not_ours")[1]
    old = _signed(paid, t=int(time.time()) - parts.settings.webhook_tolerance_s - 5)[1]
    tampered = _signed(paid)[1]
    for signature, payload in [(forged, body), (None, body), (old, body),
                               (tampered, body.replace(b"paid", b"void"))]:  # fmt: skip
        status, answer = parts.post(payload, signature)
        assert (status, answer["outcome"]) == (400, "bad_signature")
    assert parts.store.receipts() == []
    assert parts.store.counts() == {"bad_signature": 4}
    assert parts.invoice(invoice.id).state is InvoiceState.FINALIZED
    with psycopg.connect(parts.settings.database_url) as conn:
        row = conn.execute(
            "SELECT webhook_signature_failures_1h FROM billing.queue_health"
        ).fetchone()
    assert row == (4,)
    # Signed with the secret being rotated out: still accepted.
    assert parts.post(*_signed(paid, secret=OLD_SECRET))[0] == 200
    assert parts.invoice(invoice.id).state is InvoiceState.PAID


def test_a_body_over_the_limit_is_413_and_other_types_and_unknown_invoices_are_recorded(
    parts: Parts,
) -> None:
    big = b"{" + b" " * (parts.settings.webhook_max_body_bytes + 1) + b"}"
    status, answer = parts.post(big, sign(SECRET, int(time.time()), big))
    assert (status, answer["outcome"]) == (413, "too_large")
    other = {"id": "evt_other", "type": "customer.created", "data": {"object": {"id": "cus_1"}}}
    assert parts.post(*_signed(other))[1]["outcome"] == "ignored"
    stranger = {
        "id": "evt_stranger", "type": "invoice.paid",
        "data": {"object": {"id": "in_x", "status": "paid", "metadata": {}}},
    }  # fmt: skip
    assert parts.post(*_signed(stranger))[1]["outcome"] == "unknown_invoice"
    assert parts.post(*_signed(stranger))[1]["outcome"] == "duplicate"
    outcomes = {r["event_id"]: r["outcome"] for r in parts.store.receipts()}
    assert outcomes == {"evt_other": "ignored", "evt_stranger": "unknown_invoice"}
    assert parts.store.counts() == {"too_large": 1}


def _allow_connections(admin_url: str, dbname: str, allowed: bool) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(dbname), sql.SQL("true" if allowed else "false")
            )
        )
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (dbname,),
            )


def test_the_database_away_during_a_delivery_is_503_and_the_retry_is_recorded_once(
    parts: Parts, pg_server_url: str
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(parts.settings.database_url)["dbname"]
    [txn] = record(parts.ledger, "away", ["w-1"], qty=2500)
    invoice = parts.finalize(_invoice_of(parts.ledger, txn))
    parts.emulator.set_faults(webhook_retry_base_s=0.5)
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.paid"])
    _allow_connections(pg_server_url, str(dbname), False)
    try:
        parts.emulator.pay_invoice(str(invoice.stripe_invoice_id))
        paid = _stripe_event(parts.emulator, "invoice.paid", str(invoice.stripe_invoice_id))
        wait_for(lambda: parts.emulator.webhook_deliveries(paid["id"]), what="a delivery attempt")
        first = parts.emulator.webhook_deliveries(paid["id"])[0]
        assert first["status"] == 503, first
    finally:
        _allow_connections(pg_server_url, str(dbname), True)
    assert parts.emulator.wait_for_webhooks(timeout=60)
    statuses = [d["status"] for d in parts.emulator.webhook_deliveries(paid["id"])]
    assert statuses[-1] == 200 and 503 in statuses
    assert [type(e) for e in parts.ledger.history(invoice.id)].count(Invoice.Paid) == 1
    assert [r["event_id"] for r in parts.store.receipts()] == [paid["id"]]
    _audit_clean(parts)


def test_a_late_record_after_close_lands_on_the_next_periods_invoice(parts: Parts) -> None:
    [txn] = record(parts.ledger, "late", ["l-1"], qty=2500)
    closed = parts.finalize(_invoice_of(parts.ledger, txn))
    occurred = datetime(2026, 12, 1, 12, tzinfo=UTC)  # in the closed period
    late = UsageRecord(usage_id="l-2", customer_id="late", meter="api.requests",
                       quantity=Decimal(2500), occurred_at=occurred)  # fmt: skip
    [late_txn] = parts.ledger.record_usage([Metering(late, Source("usage", 0, 99))]).transactions
    line = parts.ledger.line_by_id(parts.ledger.transaction(late_txn.id).line_id)  # type: ignore[arg-type]
    assert line.late_of_start == closed.period_start
    assert line.period.start >= closed.period_end  # the customer's open period
    assert parts.invoice(line.invoice_id).state is InvoiceState.OPEN
    assert parts.invoice(closed.id).version == closed.version  # the final invoice unchanged
    parts.pusher.push(line.id)
    _audit_clean(parts)


def test_a_reversal_after_finalizing_is_credited_exactly_once_by_racing_closers(
    parts: Parts,
) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["credit_note.created"])
    txns = record(parts.ledger, "credit", ["c-1", "c-2", "c-3"], qty=2500)
    invoice = parts.finalize(_invoice_of(parts.ledger, txns[0]))
    assert build_corrections(parts.pusher).reverse(txns[1], "refund").name == "REVERSED"
    closers = [build_closer(parts.settings, build_pusher(parts.settings, parts.ledger))
               for _ in range(3)]  # fmt: skip
    start = threading.Barrier(len(closers))

    def race(closer: InvoiceCloser) -> None:
        start.wait()
        closer.step(invoice.id)

    threads = [threading.Thread(target=race, args=(c,)) for c in closers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    notes = parts.emulator.credit_notes(str(invoice.stripe_invoice_id))
    credited = parts.invoice(invoice.id)
    assert len(notes) == 1
    assert credited.credited == {notes[0]["id"]: str(txns[1])}
    assert (
        credited.credited_amount == notes[0]["amount"] == credited.credits_requested[str(txns[1])]
    )
    assert 0 < notes[0]["amount"] <= parts.ledger.transaction(txns[1]).amount + 1
    assert parts.emulator.wait_for_webhooks()
    assert [r["outcome"] for r in parts.store.receipts()] == ["stale"]  # recorded already
    _audit_clean(parts)


_cli = run_cli


def test_the_cli_closes_a_period_early_lists_invoices_and_credits_a_reversal(
    parts: Parts,
) -> None:
    txns = record(parts.ledger, "cli", ["k-1", "k-2"], qty=2500)
    record(parts.ledger, "other", ["o-1"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txns[0])
    for line in parts.invoice(invoice_id).lines:
        parts.pusher.push(line)
    closed = _cli(parts.settings, "invoices", "close", "--period", "2026-12-01",
                  "--customer", "cli")  # fmt: skip
    assert closed.returncode == 0, closed.stderr
    assert "[1/1] cli USD 2026-12-01: finalized" in closed.stdout
    final = parts.invoice(invoice_id)
    assert final.state is InvoiceState.FINALIZED
    with (
        Database(parts.settings.database_url) as db,
        Projector(db, parts.ledger.mapper.to_domain_event) as projector,
    ):
        projector.pump_all()
    listed = _cli(parts.settings, "invoices", "--state", "finalized", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["customer_id"], r["number"], r["total"]) for r in rows] == [
        ("cli", final.number, final.total)
    ]
    assert _cli(parts.settings, "invoices", "--state", "nonsense").returncode == 2

    reversed_ = _cli(parts.settings, "reverse", str(txns[0]), "--reason", "refund")
    assert reversed_.returncode == 0, reversed_.stderr
    credited = parts.invoice(invoice_id)
    [(note, txn)] = credited.credited.items()
    assert txn == str(txns[0])
    amount = format_money(credited.credits_requested[txn], "USD")
    assert f"credit note {note} of {amount} on invoice" in reversed_.stdout
    assert parts.emulator.credit_notes(str(final.stripe_invoice_id))[0]["id"] == note
    _audit_clean(parts)


def test_idle_trickling_and_slow_body_clients_are_cut_off_and_others_still_served(
    parts: Parts,
) -> None:
    settings = parts.settings.model_copy(update={"webhook_timeout_s": 0.5, "webhook_port": 0})
    server = build_webhook_server(settings, parts.ledger)
    server.start()
    assert server.wait_started()
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
        trickling = socket.create_connection(("127.0.0.1", server.port))
        trickling.sendall(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n")  # never ends
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        for sock in [*idle, trickling]:
            sock.settimeout(30)
            assert sock.recv(1024) == b""  # closed by the header deadline
        slow.settimeout(30)
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"server:" not in answer.lower()
        other = {"id": "evt_after", "type": "customer.created", "data": {"object": {}}}
        body, signature = _signed(other)
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}{PATH}", body,
            {"Stripe-Signature": signature}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as served:  # noqa: S310
            assert served.status == 200
        for sock in [*idle, trickling, slow]:
            sock.close()
    finally:
        server.stop()
    assert parts.store.counts() == {"slow_body": 1}


def _handler(parts: Parts, db: Database) -> WebhookHandler:
    """A handler of the listener's kind with no group thread: ``apply_group`` called here."""
    return WebhookHandler(parts.ledger, WebhookStore(db), [SECRET], max_group=1)


def test_a_group_of_webhooks_is_applied_once_each_in_one_transaction(parts: Parts) -> None:
    """Duplicates inside the group answer ``duplicate``; two events of one invoice apply in
    order to the same aggregate; unknown invoices and other types are recorded as such."""
    a, b = (
        parts.finalize(_invoice_of(parts.ledger, record(parts.ledger, c, [f"{c}-1"], 2500)[0]))
        for c in ("grp-a", "grp-b")
    )
    for invoice in (a, b):
        parts.emulator.fail_payment(str(invoice.stripe_invoice_id))
        parts.emulator.pay_invoice(str(invoice.stripe_invoice_id))
    failed_b = _stripe_event(parts.emulator, "invoice.payment_failed", str(b.stripe_invoice_id))
    paid_a = _stripe_event(parts.emulator, "invoice.paid", str(a.stripe_invoice_id))
    paid_b = _stripe_event(parts.emulator, "invoice.paid", str(b.stripe_invoice_id))
    stranger = {**paid_a, "id": "evt_stranger", "data": {"object": {
        **paid_a["data"]["object"], "metadata": {"invoice_id": str(UUID(int=7))}}}}  # fmt: skip
    other = {"id": "evt_other", "type": "customer.created", "data": {"object": {}}}
    group = [paid_a, failed_b, paid_a, paid_b, stranger, other]
    with Database(parts.settings.database_url) as db:
        answers = _handler(parts, db).apply_group([stripe_event(_signed(e)[0]) for e in group])
    assert [(x.status, x.outcome.value) for x in answers] == [
        (200, "applied"), (200, "applied"), (200, "duplicate"), (200, "applied"),
        (200, "unknown_invoice"), (200, "ignored"),
    ]  # fmt: skip
    assert parts.invoice(a.id).state is parts.invoice(b.id).state is InvoiceState.PAID
    b_events = [type(e) for e in parts.ledger.history(b.id)]
    assert b_events[-2:] == [Invoice.PaymentFailed, Invoice.Paid]
    assert sorted(r["event_id"] for r in parts.store.receipts()) == sorted(
        e["id"] for e in (paid_a, failed_b, paid_b, stranger, other)
    )
    _audit_clean(parts)


def test_a_group_that_loses_a_race_is_applied_again_one_event_at_a_time(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another delivery records one of the group's invoices between the group's read and
    its save: the group's transaction fails whole and each event is decided again alone."""
    c, d = (
        parts.finalize(_invoice_of(parts.ledger, record(parts.ledger, x, [f"{x}-1"], 2500)[0]))
        for x in ("race-c", "race-d")
    )
    for invoice in (c, d):
        parts.emulator.pay_invoice(str(invoice.stripe_invoice_id))
    paid_c, paid_d = (
        stripe_event(
            _signed(_stripe_event(parts.emulator, "invoice.paid", str(i.stripe_invoice_id)))[0]
        )
        for i in (c, d)
    )
    with Database(parts.settings.database_url) as db:
        handler, rival = _handler(parts, db), _handler(parts, db)
        read = parts.ledger.invoices_by_id

        def read_then_lose(ids: Any) -> Any:
            found = read(ids)
            assert rival.apply_one(paid_c).outcome.value == "applied"  # commits first
            return found

        monkeypatch.setattr(parts.ledger, "invoices_by_id", read_then_lose)
        answers = handler.apply_group([paid_c, paid_d])
    assert [x.outcome.value for x in answers] == ["duplicate", "applied"]
    for invoice in (c, d):
        assert [type(e) for e in parts.ledger.history(invoice.id)].count(Invoice.Paid) == 1
    assert sorted(r["event_id"] for r in parts.store.receipts()) == sorted([paid_c.id, paid_d.id])


def test_an_item_added_by_hand_to_a_draft_stops_the_invoice_until_an_operator_settles_it(
    parts: Parts,
) -> None:
    [txn] = record(parts.ledger, "hand", ["h-1"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txn)
    line = parts.ledger.transaction(txn).line_id
    assert line is not None
    parts.pusher.push(line)
    draft = parts.invoice(invoice_id)
    assert draft.stripe_invoice_id is not None and draft.stripe_customer_id is not None
    stripe_client = StripeGateway(parts.settings.stripe()).client
    by_hand = stripe_client.v1.invoice_items.create(
        params={
            "customer": draft.stripe_customer_id,
            "invoice": draft.stripe_invoice_id,
            "amount": 999,
            "currency": "usd",
        }
    )
    assert _close_until_it_stops(parts, invoice_id) is CloseResult.ATTENTION
    stopped = parts.invoice(invoice_id)
    assert stopped.state is InvoiceState.FINALIZING
    assert stopped.attention is not None and f"{by_hand.id} (9.99 USD)" in stopped.attention
    assert parts.emulator.invoices()[0]["status"] == "draft"  # never finalized

    with Database(parts.settings.database_url) as db:
        with Projector(db, parts.ledger.mapper.to_domain_event) as projector:
            projector.pump_all()
        with db.connection() as conn:
            row = conn.execute(
                "SELECT attention FROM billing.invoices WHERE invoice_id = %s", (invoice_id,)
            ).fetchone()
            assert row is not None and row[0] == stopped.attention
            health = read_health(conn)
    assert health["invoices_needing_attention"] == 1
    assert any("need attention" in r for r in assess(health)[1])

    refused = _cli(parts.settings, "invoices", "settle", str(invoice_id), "--how", "x", "--by", "")
    assert refused.returncode == 2, refused.stderr
    stripe_client.v1.invoice_items.delete(by_hand.id)
    settled = _cli(
        parts.settings, "invoices", "settle", str(invoice_id),
        "--how", f"deleted {by_hand.id} in the dashboard", "--by", "ops@example.com",
    )  # fmt: skip
    assert settled.returncode == 0, settled.stderr
    assert "settled" in settled.stdout
    again = _cli(parts.settings, "invoices", "settle", str(invoice_id), "--how", "x", "--by", "y")
    assert again.returncode == 2 and "needs no attention" in again.stderr
    assert parts.closer.step(invoice_id).result is CloseResult.DONE
    final = parts.invoice(invoice_id)
    assert final.state is InvoiceState.FINALIZED
    assert final.total == final.expected_total == parts.emulator.invoices()[0]["total"]
    _audit_clean(parts)


def test_a_draft_deleted_in_stripe_is_billed_on_a_new_draft_after_an_operator_redrafts(
    parts: Parts,
) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    txns = record(parts.ledger, "gone", ["g-1", "g-2"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txns[0])
    line = parts.ledger.transaction(txns[0]).line_id
    assert line is not None
    parts.pusher.push(line)
    lost = parts.invoice(invoice_id).stripe_invoice_id
    assert lost is not None
    stripe_client = StripeGateway(parts.settings.stripe()).client
    stripe_client.v1.invoices.delete(lost)  # by hand, in the dashboard
    # Stripe's invoice.deleted stops the open invoice at once, before any push meets the 404.
    wait_for(lambda: parts.invoice(invoice_id).attention is not None, timeout=30)
    stopped = parts.invoice(invoice_id)
    assert stopped.state is InvoiceState.OPEN
    assert stopped.attention == (
        f"Stripe says its draft {lost} was deleted: bill it on a new draft"
        " (billing-ledger invoices redraft) or settle how it was billed"
    )

    refused = _cli(parts.settings, "invoices", "redraft", str(invoice_id), "--how", "x", "--by", "")
    assert refused.returncode == 2 and "--how and --by" in refused.stderr, refused.stderr
    before = datetime.now(UTC)
    redrafted = _cli(
        parts.settings, "invoices", "redraft", str(invoice_id),
        "--how", "deleted by mistake in the dashboard", "--by", "ops@example.com",
    )  # fmt: skip
    assert redrafted.returncode == 0, redrafted.stderr
    assert f"Stripe no longer has draft {lost}" in redrafted.stdout
    assert "go on draft 2" in redrafted.stdout
    again = _cli(parts.settings, "invoices", "redraft", str(invoice_id), "--how", "x", "--by", "y")
    assert again.returncode == 2 and "has no draft in Stripe yet" in again.stderr, again.stderr

    with Database(parts.settings.database_url) as db:
        with Projector(db, parts.ledger.mapper.to_domain_event) as projector:
            projector.pump_all()
        with db.connection() as conn:
            row = conn.execute(
                "SELECT state, stripe_invoice_id, attention FROM billing.invoices"
                " WHERE invoice_id = %s", (invoice_id,),
            ).fetchone()  # fmt: skip
            kinds = [
                r[0] for r in conn.execute(
                    "SELECT kind FROM billing.invoice_events WHERE invoice_id = %s"
                    " ORDER BY version", (invoice_id,),
                )
            ]  # fmt: skip
            unsent = conn.execute(
                "SELECT pushed_sequence, oldest_unsent_at >= %s FROM billing.invoice_lines"
                " WHERE line_id = %s", (before, line),
            ).fetchone()  # fmt: skip
    assert row == ("open", None, None)
    assert kinds[-2:] == ["needs_attention", "draft_replaced"]
    # Nothing on the new draft yet: the reconciler sees it open, unsent since the redraft.
    assert unsent == (0, True)

    final = parts.finalize(invoice_id)
    assert final.state is InvoiceState.FINALIZED and final.draft == 2
    assert final.stripe_invoice_id not in (None, lost)
    held = stripe_client.v1.invoices.retrieve(final.stripe_invoice_id or "")
    assert held.total == final.total == final.expected_total == parts.ledger.line_by_id(line).billed
    assert held.metadata["draft"] == "2"
    assert all(parts.ledger.transaction(t).state.value == "charged" for t in txns)
    _audit_clean(parts)


def test_the_gateway_reads_every_item_of_a_draft_past_the_embedded_lines_and_repairs_one(
    stripe_settings: Settings, emulator: StripeEmulator
) -> None:
    gateway = StripeGateway(stripe_settings.stripe())
    customer = gateway.create_customer("read-back")
    client = gateway.client
    invoice = client.v1.invoices.create(params={"customer": customer, "auto_advance": False})
    assert invoice.id is not None
    made = [
        client.v1.invoice_items.create(
            params={
                "customer": customer,
                "invoice": invoice.id,
                "amount": 10 + n,
                "currency": "usd",
            }
        )
        for n in range(13)  # more than the 10 lines an invoice embeds
    ]
    view = gateway.read_draft(invoice.id)
    assert isinstance(view, DraftView)
    assert view.status == "draft" and view.total == sum(10 + n for n in range(13))
    assert sorted((i.item_id, i.amount) for i in view.items) == sorted(
        (str(m.id), 10 + n) for n, m in enumerate(made)
    )
    assert (
        gateway.repair_items([ItemRepair(str(made[0].id), 500, 4, "line-repair:x:0:4:1")]) is None
    )
    again = gateway.read_draft(invoice.id)
    assert isinstance(again, DraftView) and again.total == view.total - 10 + 500
    keys = [r["idempotency_key"] for r in emulator.requests() if r["method"] == "POST"]
    assert "line-repair:x:0:4:1" in keys


def test_open_drafts_pushed_since_their_last_check_are_found_oldest_first_and_checked(
    parts: Parts,
) -> None:
    firsts = [record(parts.ledger, c, [f"{c}-1"], qty=2500)[0] for c in ("dc-a", "dc-b")]
    for txn in firsts:
        line = parts.ledger.transaction(txn).line_id
        assert line is not None
        parts.pusher.push(line)
    invoices = [_invoice_of(parts.ledger, t) for t in firsts]
    checker = DraftChecker(parts.ledger, parts.pusher.gateway, lambda *_: None)

    def found(limit: int = 10) -> list[UUID]:
        with Database(parts.settings.database_url) as db:
            with Projector(db, parts.ledger.mapper.to_domain_event) as projector:
                projector.pump_all()
            with db.connection() as conn:
                return drafts_to_check(conn, 0.0, limit)

    assert sorted(found()) == sorted(invoices)
    assert len(found(limit=1)) == 1  # the budget
    assert checker.check(invoices[0]) is CheckResult.EQUAL
    assert found() == [invoices[1]]  # checked since its last push
    [more] = record(parts.ledger, "dc-a", ["dc-a-2"], qty=2500)
    line = parts.ledger.transaction(more).line_id
    assert line is not None
    parts.pusher.push(line)
    assert found() == [invoices[1], invoices[0]]  # never checked first, then the oldest
    with Database(parts.settings.database_url) as db, db.connection() as conn:
        assert drafts_to_check(conn, 3600.0, 10) == []  # pushed too recently: may still land


def test_a_minimum_commitment_is_trued_up_on_the_finalized_invoice_as_the_preview_said(
    parts: Parts,
) -> None:
    listed = parts.ledger.refresh_prices().latest.prices
    minimums = {"USD": "25.00", "meters": {"gpt-4o.input_tokens": "1.00"}}  # a meter unused
    parts.ledger.set_contract("acme", check_terms({}, minimums, listed), EPOCH)
    acme = record(parts.ledger, "acme", ["m-1", "m-2"], qty=2500)  # 2.50 + 2.501 USD
    beta = record(parts.ledger, "beta", ["b-1"], qty=2500)  # no contract: no minimum
    with (
        Database(parts.settings.database_url) as db,
        Projector(db, parts.ledger.mapper.to_domain_event) as projector,
    ):
        projector.pump_all()
    shown = _cli(parts.settings, "invoices", "preview", "--customer", "acme", "--json")
    assert shown.returncode == 0, shown.stderr
    preview = json.loads(shown.stdout)
    assert [(r["meter"], r["billed"]) for r in preview] == [
        ("api.requests", 500),  # 5.001 USD billed, rounded once
        (f"{TRUE_UP_METER} gpt-4o.input_tokens", 100),  # the meter's minimum
        (TRUE_UP_METER, 1900),  # the invoice's: 25.00 less 5.00 and 1.00
    ]
    assert {(r["invoice_total"], r["invoice_lines"]) for r in preview} == {(2500, 3)}

    final = parts.finalize(_invoice_of(parts.ledger, acme[0]))
    lines = {parts.ledger.line_by_id(i).meter: parts.ledger.line_by_id(i) for i in final.lines}
    assert lines[TRUE_UP_METER].billed == 1900
    assert lines[f"{TRUE_UP_METER} gpt-4o.input_tokens"].billed == 100
    assert all(line.frozen for line in lines.values())
    [stripe_invoice] = parts.emulator.invoices(final.stripe_customer_id)
    items = sorted(i["amount"] for i in parts.emulator.live_invoice_items()
                   if i["invoice"] == stripe_invoice["id"])  # fmt: skip
    assert items == [100, 500, 1900]  # each true-up is an item of its own
    assert final.total == final.expected_total == stripe_invoice["total"] == 2500
    assert final.expected_total == preview[0]["invoice_total"]  # what the preview said

    other = parts.finalize(_invoice_of(parts.ledger, beta[0]))
    assert other.expected_total == other.total == 250
    assert len(other.lines) == 1
    _audit_clean(parts)
