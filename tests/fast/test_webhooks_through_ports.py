"""The webhook handler's decisions, without a database: the in-memory ledger, receipts
kept by a fake store that refuses an event id twice as the real recorder does
(``AlreadyReceived``), requests signed as Stripe signs them. What each request is
answered, what it records on the invoice, and what it leaves alone."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from eventsourcing.persistence import OperationalError

from adapters.charging.closer import InvoiceCloser
from adapters.charging.pusher import LinePusher
from adapters.stripe.views import StripeEvent
from adapters.webhooks.handler import WebhookHandler, WebhookOutcome
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.periods import PeriodPolicy
from domain.saga import RetryPolicy
from infra.stripe_emulator.webhooks import sign
from store.ledger import BillingLedger
from store.webhooks import AlreadyReceived, WebhookReceipt
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve

SECRET, OLD = "whsec_now", "whsec_before"
NOW = 1_800_000_000
PERIOD_END = PeriodPolicy().period_of(T0).end


@dataclass
class FakeReceipts:
    """``store.webhooks.WebhookStore``'s part the handler uses, in memory; the receipts
    arrive with the ledger's saves (``Receipting``), as the recorder writes them."""

    received: dict[str, WebhookReceipt] = field(default_factory=dict)
    counted: list[str] = field(default_factory=list)
    down: bool = False

    def seen_any(self, event_ids: Sequence[str]) -> set[str]:
        if self.down:
            raise OperationalError("the database is away")
        return {e for e in event_ids if e in self.received}

    def count(self, outcome: str) -> None:
        self.counted.append(outcome)

    def close(self) -> None:
        pass


class Receipting:
    """The ledger, whose saves also record their webhook receipts once (as the recorder
    does in the same transaction): an event id recorded before refuses the whole save."""

    def __init__(self, ledger: BillingLedger, receipts: FakeReceipts) -> None:
        self._ledger = ledger
        self._receipts = receipts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def save(self, *objs: Any, webhooks: Sequence[WebhookReceipt] = ()) -> Any:
        if any(r.event_id in self._receipts.received for r in webhooks):
            raise AlreadyReceived(webhooks[0].event_id)
        saved = self._ledger.save(*objs)
        self._receipts.received.update((r.event_id, r) for r in webhooks)
        return saved


def _finalizing() -> tuple[BillingLedger, Invoice]:
    """An invoice of one line, finalizing, its draft in Stripe as ``in_1``."""
    clock = Clock(PERIOD_END)
    ledger, gateway = memory_ledger(), FakeGateway(clock=clock)
    pusher = LinePusher(ledger, gateway, RetryPolicy(), clock=clock, jitter=lambda: 0.5)
    [txn] = reserve(ledger, 1, quantity=1000)
    line = ledger.transaction(txn).line_id
    assert line is not None
    pusher.push(line)
    invoice_id = ledger.line_by_id(line).invoice_id
    closer = InvoiceCloser(
        ledger, gateway, lambda line, _: pusher.push(line), RetryPolicy(), timedelta(0),
        clock=clock,
    )  # fmt: skip
    closer.step(invoice_id, close_now="test")  # closed, its line pushed
    invoice = ledger.invoice_by_id(invoice_id)
    assert invoice is not None
    invoice.start_finalizing([(line, ledger.line_by_id(line).sequence, 100)])
    ledger.save(invoice)
    return ledger, invoice


def _handler() -> tuple[WebhookHandler, FakeReceipts, BillingLedger, Invoice]:
    ledger, invoice = _finalizing()
    receipts = FakeReceipts()
    handler = WebhookHandler(
        Receipting(ledger, receipts),  # type: ignore[arg-type]
        receipts,  # type: ignore[arg-type]
        [SECRET, OLD],
        clock=lambda: NOW,
        max_group=1,
    )
    return handler, receipts, ledger, invoice


def _event(event_id: str, type_: str, invoice: Invoice, **obj: Any) -> bytes:
    data: dict[str, Any] = {
        "id": invoice.stripe_invoice_id, "object": "invoice", "status": "open",
        "number": "INV-1", "total": 100, "amount_paid": 0, "attempt_count": 0,
        "created": NOW, "metadata": {"invoice_id": str(invoice.id)}, **obj,
    }  # fmt: skip
    return json.dumps(
        {"id": event_id, "type": type_, "created": NOW, "data": {"object": data}}
    ).encode()


def _signed(handler: WebhookHandler, body: bytes, secret: str = SECRET) -> Any:
    return handler.handle(*_pair(body, secret))


def test_a_forged_or_unsigned_request_is_refused_and_counted_and_changes_nothing() -> None:
    handler, receipts, ledger, invoice = _handler()
    body = _event("evt_1", "invoice.finalized", invoice)
    forged = _signed(handler, body, secret="whsec_someone_else")
    unsigned = handler.handle(body, None)
    assert [(a.status, a.outcome) for a in (forged, unsigned)] == [
        (400, WebhookOutcome.BAD_SIGNATURE)
    ] * 2
    assert receipts.counted == ["bad_signature", "bad_signature"]
    assert ledger.invoice_by_id(invoice.id).state is InvoiceState.FINALIZING  # type: ignore[union-attr]


def test_a_signed_body_that_is_not_an_event_is_refused_as_malformed() -> None:
    handler, receipts, _, _ = _handler()
    answer = _signed(handler, b'{"id": 7}')
    assert (answer.status, answer.outcome) == (400, WebhookOutcome.MALFORMED)
    assert receipts.counted == ["malformed"]


def test_finalized_is_applied_once_with_either_secret_of_a_rotation() -> None:
    handler, receipts, ledger, invoice = _handler()
    answer = _signed(handler, _event("evt_1", "invoice.finalized", invoice), secret=OLD)
    assert (answer.status, answer.outcome, answer.event_id) == (
        200, WebhookOutcome.APPLIED, "evt_1",
    )  # fmt: skip
    final = ledger.invoice_by_id(invoice.id)
    assert final is not None and (final.state, final.number, final.total) == (
        InvoiceState.FINALIZED, "INV-1", 100,
    )  # fmt: skip
    again = _signed(handler, _event("evt_1", "invoice.finalized", invoice))
    assert (again.status, again.outcome) == (200, WebhookOutcome.DUPLICATE)
    assert receipts.received["evt_1"].outcome == "applied"


def test_paid_before_finalized_records_both_and_the_late_finalized_is_stale() -> None:
    handler, receipts, ledger, invoice = _handler()
    paid = _event("evt_2", "invoice.paid", invoice, status="paid", amount_paid=100)
    assert _signed(handler, paid).outcome is WebhookOutcome.APPLIED
    late = _signed(handler, _event("evt_1", "invoice.finalized", invoice))
    assert late.outcome is WebhookOutcome.STALE
    final = ledger.invoice_by_id(invoice.id)
    assert final is not None and (final.state, final.amount_paid) == (InvoiceState.PAID, 100)
    assert {k: r.outcome for k, r in receipts.received.items()} == {
        "evt_2": "applied", "evt_1": "stale",
    }  # fmt: skip


def test_a_finalized_total_other_than_expected_is_recorded_as_a_mismatch() -> None:
    handler, _, ledger, invoice = _handler()
    answer = _signed(handler, _event("evt_1", "invoice.finalized", invoice, total=90))
    assert answer.outcome is WebhookOutcome.APPLIED
    final = ledger.invoice_by_id(invoice.id)
    assert final is not None and final.mismatch == (100, 90)


def test_events_the_ledger_does_not_own_or_act_on_are_recorded_and_answered_200() -> None:
    handler, receipts, ledger, invoice = _handler()
    other = _event("evt_3", "invoice.finalized", invoice, id="in_someone_else")
    unknown = _event(
        "evt_4", "invoice.finalized", invoice, metadata={"invoice_id": str(UUID(int=5))}
    )
    ignored = _event("evt_5", "customer.created", invoice)
    unreadable = _event("evt_6", "invoice.finalized", invoice, total=-1)
    outcomes = [_signed(handler, body).outcome for body in (other, unknown, ignored, unreadable)]
    assert outcomes == [
        WebhookOutcome.UNKNOWN_INVOICE, WebhookOutcome.UNKNOWN_INVOICE,
        WebhookOutcome.IGNORED, WebhookOutcome.UNREADABLE,
    ]  # fmt: skip
    assert set(receipts.received) == {"evt_3", "evt_4", "evt_5", "evt_6"}
    assert ledger.invoice_by_id(invoice.id).state is InvoiceState.FINALIZING  # type: ignore[union-attr]


def test_a_deleted_draft_stops_its_invoice_at_once_and_only_its_own_draft_does() -> None:
    handler, receipts, ledger, invoice = _handler()
    other = _event("evt_1", "invoice.deleted", invoice, id="in_someone_else", status="draft")
    assert _signed(handler, other).outcome is WebhookOutcome.UNKNOWN_INVOICE
    deleted = _event("evt_2", "invoice.deleted", invoice, status="draft")
    assert _signed(handler, deleted).outcome is WebhookOutcome.APPLIED
    stopped = ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.state is InvoiceState.FINALIZING
    assert stopped.attention == (
        f"Stripe says its draft {invoice.stripe_invoice_id} was deleted: bill it on a new"
        " draft (billing-ledger invoices redraft) or settle how it was billed"
    )
    again = _event("evt_3", "invoice.deleted", invoice, status="draft")  # Stripe's resend
    assert _signed(handler, again).outcome is WebhookOutcome.STALE
    final = _event("evt_4", "invoice.finalized", invoice)
    assert _signed(handler, final).outcome is WebhookOutcome.APPLIED
    late = _event("evt_5", "invoice.deleted", invoice, status="draft")  # final: never stops
    assert _signed(handler, late).outcome is WebhookOutcome.STALE
    assert {k: r.outcome for k, r in receipts.received.items()}["evt_2"] == "applied"


def test_a_credit_note_made_in_the_dashboard_is_recorded_as_an_external_credit() -> None:
    handler, _, ledger, invoice = _handler()
    _signed(handler, _event("evt_1", "invoice.finalized", invoice))
    note = json.dumps({
        "id": "evt_7", "type": "credit_note.created", "created": NOW,
        "data": {"object": {"id": "cn_by_hand", "object": "credit_note", "amount": 30,
                            "invoice": invoice.stripe_invoice_id,
                            "metadata": {"invoice_id": str(invoice.id)}}},
    }).encode()  # fmt: skip
    assert _signed(handler, note).outcome is WebhookOutcome.APPLIED
    credited = ledger.invoice_by_id(invoice.id)
    assert credited is not None
    assert (credited.credited, credited.credited_amount) == ({"cn_by_hand": ""}, 30)
    assert _signed(handler, note).outcome is WebhookOutcome.DUPLICATE


def test_a_group_with_one_event_delivered_twice_has_one_effect() -> None:
    handler, _, ledger, invoice = _handler()
    event = handler.read(*_pair(_event("evt_1", "invoice.finalized", invoice)))
    assert isinstance(event, StripeEvent)
    answers = handler.apply_group([event, event])
    assert [a.outcome for a in answers] == [WebhookOutcome.APPLIED, WebhookOutcome.DUPLICATE]
    finalized = [e for e in ledger.events.get(invoice.id) if isinstance(e, Invoice.Finalized)]
    assert len(finalized) == 1


def test_the_database_away_is_503_so_stripe_delivers_it_again() -> None:
    handler, receipts, ledger, invoice = _handler()
    receipts.down = True
    answer = _signed(handler, _event("evt_1", "invoice.finalized", invoice))
    assert (answer.status, answer.outcome) == (503, WebhookOutcome.UNAVAILABLE)
    assert ledger.invoice_by_id(invoice.id).state is InvoiceState.FINALIZING  # type: ignore[union-attr]
    receipts.down = False
    assert _signed(handler, _event("evt_1", "invoice.finalized", invoice)).outcome is (
        WebhookOutcome.APPLIED
    )


def _pair(body: bytes, secret: str = SECRET) -> tuple[bytes, str]:
    """The body and its signature, made now (the SDK's check reads the real clock)."""
    return body, sign(secret, int(time.time()), body)


def test_a_credit_note_that_cannot_be_read_is_recorded_unreadable_not_credited() -> None:
    handler, receipts, ledger, invoice = _handler()
    _signed(handler, _event("evt_1", "invoice.finalized", invoice))
    for n, obj in enumerate(({"id": 7, "amount": 30}, {"id": "cn_1", "amount": -5})):
        note = json.dumps({
            "id": f"evt_n{n}", "type": "credit_note.created", "created": NOW,
            "data": {"object": {**obj, "object": "credit_note",
                                "invoice": invoice.stripe_invoice_id,
                                "metadata": {"invoice_id": str(invoice.id)}}},
        }).encode()  # fmt: skip
        assert _signed(handler, note).outcome is WebhookOutcome.UNREADABLE
    assert ledger.invoice_by_id(invoice.id).credited == {}  # type: ignore[union-attr]
    assert {receipts.received[f"evt_n{n}"].outcome for n in (0, 1)} == {"unreadable"}
