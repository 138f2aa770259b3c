"""The webhook handler pinned through its ports: the in-memory ledger, the fake receipts
store (``tests.fast.test_webhooks_through_ports``), requests signed as Stripe signs
them. What each request is answered (status, outcome, event and type), what its
receipt records, what reaches the invoice, how a group is saved (one transaction, rows
in one order), and what a group or a single event does when another writer records
first."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import OperationalError

from adapters.charging.closer import InvoiceCloser
from adapters.charging.pusher import LinePusher
from adapters.stripe.views import StripeEvent
from adapters.webhooks.handler import WebhookAnswer, WebhookHandler, WebhookOutcome
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.saga import RetryPolicy
from infra.stripe_emulator.webhooks import sign
from store.ledger import BillingLedger
from store.webhooks import WebhookReceipt
from tests.fast.fakes import Clock, FakeGateway, memory_ledger, reserve
from tests.fast.test_webhooks_through_ports import (
    NOW,
    OLD,
    PERIOD_END,
    SECRET,
    FakeReceipts,
    Receipting,
    _event,
    _pair,
)

CREATED = datetime.fromtimestamp(NOW, UTC)


class Recorder(Receipting):
    """The receipting ledger, remembering what each save wrote (aggregates and receipts,
    in the order given); ``before_save`` runs first on the next saves, as another writer
    recording first would (each entry once, in order)."""

    def __init__(self, ledger: BillingLedger, receipts: FakeReceipts) -> None:
        super().__init__(ledger, receipts)
        self.saves: list[tuple[list[UUID], list[str]]] = []
        self.before_save: list[Callable[[], object]] = []

    def save(self, *objs: Any, webhooks: Sequence[WebhookReceipt] = ()) -> Any:
        self.saves.append(([o.id for o in objs], [r.event_id for r in webhooks]))
        if self.before_save:
            self.before_save.pop(0)()
        return super().save(*objs, webhooks=webhooks)


def _finalizing(ledger: BillingLedger, customer: str) -> Invoice:
    """``customer``'s invoice of one line (100), finalizing, its draft in the fake Stripe."""
    clock = Clock(PERIOD_END)
    gateway = FakeGateway(clock=clock)
    pusher = LinePusher(ledger, gateway, RetryPolicy(), clock=clock, jitter=lambda: 0.5)
    [txn] = reserve(ledger, 1, customer, quantity=1000)
    line = ledger.transaction(txn).line_id
    assert line is not None
    pusher.push(line)
    invoice_id = ledger.line_by_id(line).invoice_id
    closer = InvoiceCloser(
        ledger, gateway, lambda line, _: pusher.push(line), RetryPolicy(), timedelta(0),
        clock=clock,
    )  # fmt: skip
    closer.step(invoice_id, close_now="test")
    invoice = ledger.invoice_by_id(invoice_id)
    assert invoice is not None
    invoice.start_finalizing([(line, ledger.line_by_id(line).sequence, 100)])
    ledger.save(invoice)
    return invoice


class Parts:
    def __init__(self, *customers: str, **handler_kw: Any) -> None:
        self.ledger = memory_ledger()
        self.invoices = [_finalizing(self.ledger, c) for c in customers or ("acme",)]
        self.receipts = FakeReceipts()
        self.recorder = Recorder(self.ledger, self.receipts)
        handler_kw.setdefault("max_group", 1)
        self.handler = self.make_handler(**handler_kw)

    def make_handler(self, **kw: Any) -> WebhookHandler:
        return WebhookHandler(
            self.recorder,  # type: ignore[arg-type]
            self.receipts,  # type: ignore[arg-type]
            [SECRET, OLD],
            **kw,
        )

    @property
    def invoice(self) -> Invoice:
        return self.invoices[0]

    def now(self, invoice: Invoice | None = None) -> Invoice:
        found = self.ledger.invoice_by_id((invoice or self.invoice).id)
        assert found is not None
        return found

    def read(self, body: bytes) -> StripeEvent:
        event = self.handler.read(*_pair(body))
        assert isinstance(event, StripeEvent)
        return event

    def events(self, kind: type, invoice: Invoice | None = None) -> list[Any]:
        return [
            e for e in self.ledger.events.get((invoice or self.invoice).id) if isinstance(e, kind)
        ]


def _answer(a: WebhookAnswer) -> tuple[int, WebhookOutcome, str | None, str | None]:
    return (a.status, a.outcome, a.event_id, a.type)


def _note(event_id: str, invoice: Invoice, **obj: Any) -> bytes:
    data = {
        "id": "cn_1", "object": "credit_note", "amount": 30,
        "invoice": invoice.stripe_invoice_id, "metadata": {"invoice_id": str(invoice.id)},
        **obj,
    }  # fmt: skip
    return json.dumps(
        {"id": event_id, "type": "credit_note.created", "created": NOW, "data": {"object": data}}
    ).encode()


def _finalized(event_id: str, invoice: Invoice, **obj: Any) -> bytes:
    return _event(event_id, "invoice.finalized", invoice, **obj)


# -- construction ------------------------------------------------------------------------


def test_a_handler_without_a_signing_secret_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"^the webhook handler needs at least one signing secret$"
    ):
        WebhookHandler(memory_ledger(), FakeReceipts(), [])  # type: ignore[arg-type]


def test_its_repr_shows_how_many_secrets_and_the_tolerance_never_a_secret() -> None:
    parts = Parts()
    assert repr(parts.handler) == "WebhookHandler(secrets=2, tolerance_s=300)"
    assert SECRET not in repr(parts.handler) and OLD not in repr(parts.handler)
    assert repr(parts.make_handler(tolerance_s=60)) == "WebhookHandler(secrets=2, tolerance_s=60)"


def test_a_group_size_of_1_applies_each_request_alone_and_more_groups_them() -> None:
    parts = Parts()
    assert parts.make_handler(max_group=1).group is None
    two = parts.make_handler(max_group=2).group
    assert two is not None and two.max_group == 2
    grouped = parts.make_handler().group  # the defaults
    assert grouped is not None
    assert (grouped.max_group, grouped.answer_within_s) == (200, 20.0)


def test_a_started_handler_applies_requests_on_its_named_group_threads_until_stopped() -> None:
    parts = Parts()
    handler = parts.make_handler(answer_within_s=5.0)
    handler.start()
    try:
        assert _group_threads() == [f"webhook-group-{i}" for i in range(4)]
        answer = handler.handle(*_pair(_finalized("evt_1", parts.invoice)))
        assert _answer(answer) == (200, WebhookOutcome.APPLIED, "evt_1", "invoice.finalized")
        assert handler.group is not None and handler.group.groups == 1
    finally:
        handler.stop()
    assert _group_threads() == []
    assert parts.now().state is InvoiceState.FINALIZED
    assert handler.group.answer_within_s == 5.0
    two = parts.make_handler(group_workers=2)
    two.start()
    try:
        assert _group_threads() == ["webhook-group-0", "webhook-group-1"]
    finally:
        two.stop()
    assert _group_threads() == []


def _group_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("webhook-"))


class Broken(Recorder):
    """A ledger failing in a way no rule expects (a bug): the group cannot be applied."""

    def invoices_by_id(self, ids: Sequence[UUID]) -> dict[UUID, Invoice]:
        raise RuntimeError("a bug")


def test_a_group_that_cannot_be_applied_answers_503_so_stripe_delivers_again() -> None:
    parts = Parts()
    handler = WebhookHandler(
        Broken(parts.ledger, parts.receipts),  # type: ignore[arg-type]
        parts.receipts,  # type: ignore[arg-type]
        [SECRET],
        answer_within_s=5.0,
    )
    handler.start()
    try:
        answer = handler.handle(*_pair(_finalized("evt_1", parts.invoice)))
    finally:
        handler.stop()
    assert _answer(answer) == (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized")
    assert parts.receipts.received == {}


# -- verifying ---------------------------------------------------------------------------


def test_a_signature_older_than_the_tolerance_is_refused_and_a_recent_one_accepted() -> None:
    parts = Parts(tolerance_s=60)
    body = _finalized("evt_1", parts.invoice)
    old = parts.handler.handle(body, sign(SECRET, int(time.time()) - 120, body))
    assert (old.status, old.outcome) == (400, WebhookOutcome.BAD_SIGNATURE)
    assert parts.receipts.counted == ["bad_signature"]
    recent = parts.handler.handle(body, sign(SECRET, int(time.time()) - 30, body))
    assert (recent.status, recent.outcome) == (200, WebhookOutcome.APPLIED)


def _padded(signature: str, length: int) -> str:
    """``signature`` with an entry of another scheme, Stripe ignores, to ``length``."""
    pad = ",v0="
    return signature + pad + "a" * (length - len(signature) - len(pad))


def test_a_signature_header_of_up_to_4096_characters_is_checked_a_longer_one_refused() -> None:
    parts = Parts()
    body, signature = _pair(_finalized("evt_1", parts.invoice))
    longest = _padded(signature, 4096)
    too_long = _padded(signature, 4097)
    assert (len(longest), len(too_long)) == (4096, 4097)
    assert parts.handler.handle(body, too_long).outcome is WebhookOutcome.BAD_SIGNATURE
    assert parts.handler.handle(body, longest).outcome is WebhookOutcome.APPLIED


def test_a_body_that_is_not_utf8_is_refused_as_unsigned() -> None:
    parts = Parts()
    body = b'{"id": "evt_\xff"}'
    answer = parts.handler.handle(body, sign(SECRET, int(time.time()), body))
    assert _answer(answer) == (400, WebhookOutcome.BAD_SIGNATURE, None, None)
    assert parts.receipts.counted == ["bad_signature"]


# -- applying ----------------------------------------------------------------------------


def test_an_applied_event_is_answered_with_its_id_and_type_and_receipted_in_full() -> None:
    parts = Parts()
    answer = parts.handler.handle(*_pair(_finalized("evt_1", parts.invoice)))
    assert _answer(answer) == (200, WebhookOutcome.APPLIED, "evt_1", "invoice.finalized")
    assert answer.body == {"outcome": "applied", "event": "evt_1"}
    assert parts.receipts.received == {
        "evt_1": WebhookReceipt("evt_1", "invoice.finalized", parts.invoice.id, "applied", CREATED)
    }
    [finalized] = parts.events(Invoice.Finalized)
    assert (finalized.number, finalized.total, finalized.source) == ("INV-1", 100, "evt_1")


def test_a_repeated_delivery_is_answered_duplicate_with_its_id_and_type() -> None:
    parts = Parts()
    event = parts.read(_finalized("evt_1", parts.invoice))
    answers = parts.handler.apply_group([event, event])
    assert [_answer(a) for a in answers] == [
        (200, WebhookOutcome.APPLIED, "evt_1", "invoice.finalized"),
        (200, WebhookOutcome.DUPLICATE, "evt_1", "invoice.finalized"),
    ]


def test_the_database_away_answers_each_event_of_a_group_503_with_its_id() -> None:
    parts = Parts()
    first = parts.read(_finalized("evt_1", parts.invoice))
    other = parts.read(_event("evt_2", "customer.created", parts.invoice))
    parts.receipts.down = True
    answers = parts.handler.apply_group([first, other])
    assert [_answer(a) for a in answers] == [
        (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized"),
        (503, WebhookOutcome.UNAVAILABLE, "evt_2", "customer.created"),
    ]
    assert parts.recorder.saves == []


def test_a_group_is_saved_in_one_transaction_its_rows_in_id_order() -> None:
    parts = Parts("acme", "beta")
    later, earlier = sorted(parts.invoices, key=lambda i: i.id, reverse=True)
    events = [
        parts.read(_finalized("evt_c", later)),
        parts.read(_finalized("evt_a", earlier)),
        parts.read(_event("evt_b", "customer.created", later)),
        parts.read(_finalized("evt_d", later, total=-1)),  # unreadable
    ]
    answers = parts.handler.apply_group(events)
    assert [a.outcome for a in answers] == [
        WebhookOutcome.APPLIED, WebhookOutcome.APPLIED,
        WebhookOutcome.IGNORED, WebhookOutcome.UNREADABLE,
    ]  # fmt: skip
    assert parts.recorder.saves == [([earlier.id, later.id], ["evt_a", "evt_b", "evt_c", "evt_d"])]
    assert {parts.now(i).state for i in parts.invoices} == {InvoiceState.FINALIZED}


def test_a_group_of_events_the_ledger_does_not_act_on_records_only_their_receipts() -> None:
    parts = Parts()
    events = [
        parts.read(_event("evt_1", "customer.created", parts.invoice)),
        parts.read(_finalized("evt_2", parts.invoice, metadata={})),
    ]
    answers = parts.handler.apply_group(events)
    assert [_answer(a) for a in answers] == [
        (200, WebhookOutcome.IGNORED, "evt_1", "customer.created"),
        (200, WebhookOutcome.UNKNOWN_INVOICE, "evt_2", "invoice.finalized"),
    ]
    assert parts.recorder.saves == [([], ["evt_1", "evt_2"])]
    assert parts.receipts.received["evt_1"] == WebhookReceipt(
        "evt_1", "customer.created", None, "ignored", CREATED
    )
    assert parts.receipts.received["evt_2"].invoice_id is None


# -- credit notes ------------------------------------------------------------------------


def _finalized_by_webhook(parts: Parts) -> None:
    answer = parts.handler.handle(*_pair(_finalized("evt_f", parts.invoice)))
    assert answer.outcome is WebhookOutcome.APPLIED


def test_a_credit_note_the_ledger_requested_is_recorded_with_its_transaction() -> None:
    parts = Parts()
    _finalized_by_webhook(parts)
    txn = UUID(int=42)
    metadata = {"invoice_id": str(parts.invoice.id), "transaction_id": str(txn)}
    answer = parts.handler.handle(*_pair(_note("evt_n", parts.invoice, metadata=metadata)))
    assert _answer(answer) == (200, WebhookOutcome.APPLIED, "evt_n", "credit_note.created")
    [credited] = parts.events(Invoice.Credited)
    assert (credited.transaction_id, credited.credit_note_id, credited.amount, credited.source) == (
        txn, "cn_1", 30, "evt_n",
    )  # fmt: skip
    assert parts.now().credited == {"cn_1": str(txn)}
    assert parts.receipts.received["evt_n"] == WebhookReceipt(
        "evt_n", "credit_note.created", parts.invoice.id, "applied", CREATED
    )


def test_a_credit_note_of_0_is_recorded() -> None:
    parts = Parts()
    _finalized_by_webhook(parts)
    answer = parts.handler.handle(*_pair(_note("evt_n", parts.invoice, amount=0)))
    assert answer.outcome is WebhookOutcome.APPLIED
    assert (parts.now().credited, parts.now().credited_amount) == ({"cn_1": ""}, 0)


def test_a_credit_note_id_of_up_to_255_characters_is_read_a_longer_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parts = Parts()
    _finalized_by_webhook(parts)
    longest, too_long = "c" * 255, "d" * 256
    caplog.set_level(logging.WARNING, "adapters.webhooks.handler")
    refused = parts.handler.handle(*_pair(_note("evt_n1", parts.invoice, id=too_long)))
    assert refused.outcome is WebhookOutcome.UNREADABLE
    reason = f"credit note id {'d' * 80!r} is not a string"
    assert [r.getMessage() for r in caplog.records] == [
        f"webhook evt_n1 (credit_note.created) unreadable: {reason}"
    ]
    read = parts.handler.handle(*_pair(_note("evt_n2", parts.invoice, id=longest)))
    assert read.outcome is WebhookOutcome.APPLIED
    assert parts.now().credited == {longest: ""}


def test_an_unreadable_credit_notes_reason_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    parts = Parts()
    _finalized_by_webhook(parts)
    caplog.set_level(logging.WARNING, "adapters.webhooks.handler")
    for n, obj in enumerate(({"id": 7}, {"amount": -5}, {"amount": "30"})):
        answer = parts.handler.handle(*_pair(_note(f"evt_n{n}", parts.invoice, **obj)))
        assert answer.outcome is WebhookOutcome.UNREADABLE
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "credit note id '7' is not a string",
        "credit note amount -5 is not a whole amount",
        "credit note amount '30' is not a whole amount",
    ]
    assert parts.now().credited == {}


def test_a_credit_note_on_an_invoice_the_ledger_has_not_finalized_is_stale() -> None:
    parts = Parts()  # finalizing: Stripe's finalized event not seen yet
    answer = parts.handler.handle(*_pair(_note("evt_n", parts.invoice)))
    assert _answer(answer) == (200, WebhookOutcome.STALE, "evt_n", "credit_note.created")
    assert parts.now().credited == {}
    assert parts.receipts.received["evt_n"].outcome == "stale"


# -- races ---------------------------------------------------------------------------------


def _attention_meanwhile(parts: Parts) -> Callable[[], None]:
    """Another writer (the closer, say) saves the invoice first."""

    def write() -> None:
        invoice = parts.now()
        invoice.need_attention(f"looked at {len(parts.recorder.saves)}")
        parts.ledger.save(invoice)

    return write


def test_a_group_that_loses_a_race_is_applied_again_one_event_at_a_time() -> None:
    parts = Parts()
    events = [
        parts.read(_finalized("evt_1", parts.invoice)),
        parts.read(_event("evt_2", "customer.created", parts.invoice)),
        parts.read(_finalized("evt_1", parts.invoice)),
    ]
    parts.recorder.before_save.append(_attention_meanwhile(parts))
    answers = parts.handler.apply_group(events)
    assert [_answer(a) for a in answers] == [
        (200, WebhookOutcome.APPLIED, "evt_1", "invoice.finalized"),
        (200, WebhookOutcome.IGNORED, "evt_2", "customer.created"),
        (200, WebhookOutcome.DUPLICATE, "evt_1", "invoice.finalized"),
    ]
    invoice_id = parts.invoice.id
    assert parts.recorder.saves == [
        ([invoice_id], ["evt_1", "evt_2"]),  # lost
        ([invoice_id], ["evt_1"]),
        ([], ["evt_2"]),
    ]
    assert parts.now().state is InvoiceState.FINALIZED
    assert len(parts.events(Invoice.Finalized)) == 1
    assert parts.receipts.received["evt_1"] == WebhookReceipt(
        "evt_1", "invoice.finalized", invoice_id, "applied", CREATED
    )


def test_an_event_recorded_by_another_delivery_meanwhile_is_a_duplicate() -> None:
    parts = Parts()
    body = _finalized("evt_1", parts.invoice)
    event = parts.read(body)
    other = parts.make_handler(max_group=1)
    parts.recorder.before_save.append(lambda: other.handle(*_pair(body)))
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (200, WebhookOutcome.DUPLICATE, "evt_1", "invoice.finalized")
    assert len(parts.events(Invoice.Finalized)) == 1


def test_an_event_applied_alone_decides_again_after_each_lost_race() -> None:
    parts = Parts()
    event = parts.read(_finalized("evt_1", parts.invoice))
    parts.recorder.before_save += [_attention_meanwhile(parts)] * 3
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (200, WebhookOutcome.APPLIED, "evt_1", "invoice.finalized")
    assert len(parts.recorder.saves) == 4
    assert parts.now().state is InvoiceState.FINALIZED


def test_an_event_that_keeps_losing_races_is_answered_503_after_20_tries() -> None:
    parts = Parts()
    event = parts.read(_finalized("evt_1", parts.invoice))
    parts.recorder.before_save += [_attention_meanwhile(parts)] * 30
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized")
    assert len(parts.recorder.saves) == 1 + 20
    assert parts.receipts.received == {}
    assert parts.now().state is InvoiceState.FINALIZING


def test_an_event_recorded_by_another_delivery_while_applied_alone_is_a_duplicate() -> None:
    parts = Parts()
    body = _finalized("evt_1", parts.invoice)
    event = parts.read(body)
    other = parts.make_handler(max_group=1)

    def delivered_again() -> None:  # the other delivery's own save runs no hook
        parts.recorder.before_save.clear()
        other.handle(*_pair(body))

    parts.recorder.before_save += [_attention_meanwhile(parts), delivered_again]
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (200, WebhookOutcome.DUPLICATE, "evt_1", "invoice.finalized")
    assert len(parts.events(Invoice.Finalized)) == 1


def test_the_database_away_while_applied_alone_is_503() -> None:
    parts = Parts()
    event = parts.read(_finalized("evt_1", parts.invoice))

    def away() -> None:
        _attention_meanwhile(parts)()
        parts.receipts.down = True

    parts.recorder.before_save.append(away)
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized")
    assert parts.receipts.received == {}


def test_an_event_the_ledger_does_not_act_on_applied_alone_records_only_its_receipt() -> None:
    parts = Parts()
    events = [
        parts.read(_finalized("evt_1", parts.invoice)),
        parts.read(_finalized("evt_2", parts.invoice, metadata={})),
        parts.read(_finalized("evt_3", parts.invoice, total=-1)),
    ]
    parts.recorder.before_save.append(_attention_meanwhile(parts))
    answers = parts.handler.apply_group(events)
    assert [a.outcome for a in answers] == [
        WebhookOutcome.APPLIED, WebhookOutcome.UNKNOWN_INVOICE, WebhookOutcome.UNREADABLE,
    ]  # fmt: skip
    assert parts.recorder.saves[1:] == [
        ([parts.invoice.id], ["evt_1"]),
        ([], ["evt_2"]),
        ([], ["evt_3"]),
    ]
    assert parts.receipts.received["evt_2"] == WebhookReceipt(
        "evt_2", "invoice.finalized", None, "unknown_invoice", CREATED
    )
    assert parts.receipts.received["evt_3"] == WebhookReceipt(
        "evt_3", "invoice.finalized", parts.invoice.id, "unreadable", CREATED
    )


def test_the_database_failing_a_save_answers_503() -> None:
    parts = Parts()
    event = parts.read(_finalized("evt_1", parts.invoice))

    def fail() -> None:
        raise OperationalError("the database is away")

    parts.recorder.before_save.append(fail)
    [answer] = parts.handler.apply_group([event])
    assert _answer(answer) == (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized")
    parts.recorder.before_save += [_attention_meanwhile(parts), fail]
    [alone] = parts.handler.apply_group([event])
    assert _answer(alone) == (503, WebhookOutcome.UNAVAILABLE, "evt_1", "invoice.finalized")
    assert parts.receipts.received == {}
