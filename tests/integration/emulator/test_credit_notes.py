"""Credit notes on finalized invoices: amounts, bounds, pre- and post-payment (SDK-driven)."""

from __future__ import annotations

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import attach, draft, event_types, new_customer, open_invoice

pytestmark = pytest.mark.integration


def test_a_credit_note_on_an_open_invoice_reduces_what_is_owed(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 1000, 500)
    note = client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "amount": 300,
            "reason": "order_change",
            "memo": "usage corrected",
            "metadata": {"txn_id": "txn-9"},
        }
    )
    assert note.id.startswith("cn_")
    assert (note.amount, note.pre_payment_amount, note.post_payment_amount, note.type) == (
        300,
        300,
        0,
        "pre_payment",
    )
    assert (note.number, note.reason, note.memo) == (
        f"{invoice.number}-CN-01",
        "order_change",
        "usage corrected",
    )
    credited = client.v1.invoices.retrieve(invoice.id)
    assert (credited.status, credited.total, credited.amount_due, credited.amount_remaining) == (
        "open",
        1500,
        1200,
        1200,
    )
    assert credited.pre_payment_credit_notes_amount == 300
    assert event_types(emulator, note.id) == ["credit_note.created"]
    assert client.v1.invoices.pay(invoice.id).amount_paid == 1200


def test_credit_notes_never_exceed_the_invoice_total(client: stripe.StripeClient) -> None:
    invoice = open_invoice(client, 1000)
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 600})

    with pytest.raises(stripe.InvalidRequestError) as over:
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 401})
    assert (over.value.http_status, over.value.param) == (400, "amount")
    assert "exceeds" in str(over.value.user_message)
    assert len(client.v1.credit_notes.list(params={"invoice": invoice.id}).data) == 1

    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 400})
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 1})


def test_crediting_the_rest_of_an_open_invoice_marks_it_paid_without_a_payment(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 800)
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 800})
    settled = client.v1.invoices.retrieve(invoice.id)
    assert (settled.status, settled.amount_due, settled.amount_paid, settled.amount_remaining) == (
        "paid",
        0,
        0,
        0,
    )
    types = event_types(emulator, invoice.id)
    assert types[-1] == "invoice.paid"
    assert "invoice.payment_succeeded" not in types


def test_a_credit_note_on_a_paid_invoice_is_post_payment_and_must_be_given_out(
    client: stripe.StripeClient,
) -> None:
    invoice = client.v1.invoices.pay(open_invoice(client, 1000).id)

    with pytest.raises(stripe.InvalidRequestError) as unallocated:
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 250})
    assert "post-payment amount (250)" in str(unallocated.value.user_message)

    note = client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "amount": 250,
            "credit_amount": 200,
            "out_of_band_amount": 50,
        }
    )
    assert (note.pre_payment_amount, note.post_payment_amount, note.type) == (
        0,
        250,
        "post_payment",
    )
    after = client.v1.invoices.retrieve(invoice.id)
    assert (after.status, after.amount_paid, after.post_payment_credit_notes_amount) == (
        "paid",
        1000,
        250,
    )
    assert after.pre_payment_credit_notes_amount == 0
    assert client.v1.customers.retrieve(str(invoice.customer)).balance == -200


def test_credit_note_lines_credit_invoice_lines_up_to_their_amount(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id)
    attach(client, invoice, 700)
    attach(client, invoice, 300)
    invoice = client.v1.invoices.finalize_invoice(invoice.id)
    cpu, gpu = [line.id for line in invoice.lines.data][::-1]

    note = client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "lines": [
                {"type": "invoice_line_item", "invoice_line_item": cpu, "amount": 200},
                {"type": "custom_line_item", "unit_amount": 25, "quantity": 2, "description": "x"},
            ],
        }
    )
    assert note.amount == 250
    assert [line.invoice_line_item for line in note.lines.data] == [cpu, None]
    with pytest.raises(stripe.InvalidRequestError) as over_line:
        client.v1.credit_notes.create(
            params={
                "invoice": invoice.id,
                "lines": [{"type": "invoice_line_item", "invoice_line_item": cpu, "amount": 501}],
            }
        )
    assert over_line.value.param == "lines[0][amount]"
    whole = client.v1.credit_notes.create(
        params={
            "invoice": invoice.id,
            "lines": [{"type": "invoice_line_item", "invoice_line_item": gpu, "quantity": 1}],
        }
    )
    assert whole.amount == 300
    with pytest.raises(stripe.InvalidRequestError) as mismatch:
        client.v1.credit_notes.create(
            params={
                "invoice": invoice.id,
                "amount": 10,
                "lines": [{"type": "invoice_line_item", "invoice_line_item": cpu, "amount": 20}],
            }
        )
    assert mismatch.value.param == "amount"


def test_credit_notes_are_refused_on_drafts_and_void_invoices(
    client: stripe.StripeClient,
) -> None:
    a_draft = draft(client, new_customer(client).id)
    attach(client, a_draft, 100)
    voided = client.v1.invoices.void_invoice(open_invoice(client, 100).id)
    for invoice_id in (a_draft.id, voided.id):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            client.v1.credit_notes.create(params={"invoice": invoice_id, "amount": 10})
        assert (refused.value.http_status, refused.value.param) == (400, "invoice")
    with pytest.raises(stripe.InvalidRequestError) as no_amount:
        client.v1.credit_notes.create(params={"invoice": voided.id})
    assert no_amount.value.param == "amount"
    with pytest.raises(stripe.InvalidRequestError) as bad_reason:
        client.v1.credit_notes.create(
            params={"invoice": voided.id, "amount": 1, "reason": "because"}
        )
    assert bad_reason.value.param == "reason"


def test_credit_notes_list_by_invoice_and_retrieve(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice, other = open_invoice(client, 1000), open_invoice(client, 1000)
    notes = [
        client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 10 + n})
        for n in range(3)
    ]
    client.v1.credit_notes.create(params={"invoice": other.id, "amount": 5})

    page = client.v1.credit_notes.list(params={"invoice": invoice.id, "limit": 2})
    assert ([n.id for n in page.data], page.has_more) == ([notes[2].id, notes[1].id], True)
    everything = client.v1.credit_notes.list(params={"invoice": invoice.id, "limit": 1})
    assert {n.id for n in everything.auto_paging_iter()} == {n.id for n in notes}
    assert client.v1.credit_notes.retrieve(notes[0].id).amount == 10
    assert notes[2].number == f"{invoice.number}-CN-03"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.credit_notes.retrieve("cn_nothing")
    assert (missing.value.http_status, missing.value.code) == (404, "resource_missing")
    assert [n["id"] for n in emulator.credit_notes(invoice.id)] == [n.id for n in notes]
