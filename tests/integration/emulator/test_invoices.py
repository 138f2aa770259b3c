"""Draft invoices, their items, and the invoice state machine, driven by the SDK."""

from __future__ import annotations

from typing import Any

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import attach, draft, event_types, http, new_customer, open_invoice

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------------------------------------
# drafts and their items


def test_draft_totals_follow_attached_items_updates_and_deletes(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    invoice = draft(client, customer.id, "eur", period="2026-11")
    assert (invoice.status, invoice.number, invoice.currency, invoice.auto_advance) == (
        "draft",
        None,
        "eur",
        False,
    )
    assert (invoice.total, invoice.amount_due, invoice.amount_remaining) == (0, 0, 0)

    first = attach(client, invoice, 1000, line="cpu")
    second = attach(client, invoice, 250, line="gpu")
    assert (first.invoice, first.currency) == (invoice.id, "eur")  # the invoice's currency
    assert client.v1.invoices.retrieve(invoice.id).total == 1250

    updated = client.v1.invoice_items.update(first.id, params={"amount": 4000})
    assert updated.amount == 4000
    fetched = client.v1.invoices.retrieve(invoice.id)
    assert (fetched.subtotal, fetched.total, fetched.amount_due, fetched.amount_remaining) == (
        4250,
        4250,
        4250,
        4250,
    )
    assert [line["invoice_item"] for line in fetched.lines.data] == [second.id, first.id]

    client.v1.invoice_items.delete(second.id)
    assert client.v1.invoices.retrieve(invoice.id).total == 4000
    assert event_types(emulator, invoice.id) == ["invoice.created"] + ["invoice.updated"] * 4
    assert event_types(emulator, second.id) == ["invoiceitem.created", "invoiceitem.deleted"]


def test_item_joins_only_a_draft_of_its_own_customer_and_currency(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id, "usd")
    stranger = new_customer(client)
    with pytest.raises(stripe.InvalidRequestError) as other_customer:
        client.v1.invoice_items.create(
            params={"customer": stranger.id, "invoice": invoice.id, "amount": 100}
        )
    assert (other_customer.value.http_status, other_customer.value.param) == (400, "invoice")
    with pytest.raises(stripe.InvalidRequestError) as other_currency:
        client.v1.invoice_items.create(
            params={
                "customer": str(invoice.customer),
                "invoice": invoice.id,
                "amount": 100,
                "currency": "eur",
            }
        )
    assert (other_currency.value.http_status, other_currency.value.param) == (400, "currency")
    with pytest.raises(stripe.InvalidRequestError) as unknown:
        client.v1.invoice_items.create(
            params={"customer": stranger.id, "invoice": "in_nothing", "amount": 100}
        )
    assert (unknown.value.http_status, unknown.value.code) == (400, "resource_missing")
    assert client.v1.invoices.retrieve(invoice.id).lines.data == []


def test_an_invoice_holds_at_most_250_items_and_lists_them_all(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id)
    created = [attach(client, invoice, 1 + n).id for n in range(250)]

    with pytest.raises(stripe.InvalidRequestError) as full:
        attach(client, invoice, 7)
    assert full.value.http_status == 400
    assert full.value.param == "invoice"
    assert "at most 250 invoice items" in str(full.value.user_message)

    page = client.v1.invoice_items.list(params={"invoice": invoice.id, "limit": 100})
    assert page.has_more is True
    listed = [item.id for item in page.auto_paging_iter()]
    assert listed == created[::-1]  # newest first, every one exactly once
    fetched = client.v1.invoices.retrieve(invoice.id)
    assert (fetched.total, len(fetched.lines.data), fetched.lines.has_more) == (
        sum(range(1, 251)),
        10,
        True,
    )
    lines = client.v1.invoices.line_items.list(invoice.id, params={"limit": 100})
    assert len([line.id for line in lines.auto_paging_iter()]) == 250


def test_item_update_merges_metadata_and_keeps_the_amount_bound(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id)
    item = attach(client, invoice, 100, keep="1", drop="2")

    updated = client.v1.invoice_items.update(
        item.id, params={"metadata": {"drop": "", "seq": "7"}, "description": "cpu-seconds"}
    )
    assert updated.metadata is not None
    assert updated.metadata.to_dict() == {"keep": "1", "seq": "7"}
    assert (updated.amount, updated.description) == (100, "cpu-seconds")

    with pytest.raises(stripe.InvalidRequestError) as too_big:
        client.v1.invoice_items.update(item.id, params={"amount": 100_000_000})
    assert (too_big.value.http_status, too_big.value.param) == (400, "amount")
    assert client.v1.invoice_items.update(item.id, params={"amount": 99_999_999}).amount == (
        99_999_999
    )


def test_items_of_a_finalized_invoice_cannot_be_updated_deleted_or_added(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id)
    item = attach(client, invoice, 500)
    client.v1.invoices.finalize_invoice(invoice.id)

    with pytest.raises(stripe.InvalidRequestError) as update:
        client.v1.invoice_items.update(item.id, params={"amount": 1})
    with pytest.raises(stripe.InvalidRequestError) as delete:
        client.v1.invoice_items.delete(item.id)
    with pytest.raises(stripe.InvalidRequestError) as add:
        attach(client, invoice, 1)
    for refused in (update.value, delete.value, add.value):
        assert (refused.http_status, refused.code) == (400, "invoice_not_editable")
    assert client.v1.invoice_items.retrieve(item.id).amount == 500
    assert client.v1.invoices.retrieve(invoice.id).total == 500


# ---------------------------------------------------------------------------------------------
# finalize


def test_finalize_numbers_invoices_in_the_customers_sequence_and_only_once(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    first, second = draft(client, customer.id), draft(client, customer.id)
    attach(client, first, 100)
    attach(client, second, 200)

    finalized = client.v1.invoices.finalize_invoice(first.id)
    assert finalized.status == "open"
    assert finalized.number == f"{customer.invoice_prefix}-0001"
    assert finalized.status_transitions is not None
    assert finalized.status_transitions.finalized_at is not None
    assert client.v1.invoices.finalize_invoice(second.id).number == (
        f"{customer.invoice_prefix}-0002"
    )
    assert client.v1.customers.retrieve(customer.id).next_invoice_sequence == 3

    with pytest.raises(stripe.InvalidRequestError) as again:
        client.v1.invoices.finalize_invoice(first.id)
    assert again.value.http_status == 400
    assert "already finalized" in str(again.value.user_message)
    assert event_types(emulator, first.id).count("invoice.finalized") == 1


def test_a_zero_total_invoice_is_paid_as_it_is_finalized(client: stripe.StripeClient) -> None:
    invoice = draft(client, new_customer(client).id)
    finalized = client.v1.invoices.finalize_invoice(invoice.id)
    assert (finalized.status, finalized.amount_paid, finalized.attempt_count) == ("paid", 0, 0)


def test_a_draft_with_auto_advance_stays_a_draft(client: stripe.StripeClient) -> None:
    customer = new_customer(client)
    invoice = client.v1.invoices.create(params={"customer": customer.id, "auto_advance": True})
    client.v1.invoice_items.create(
        params={"customer": customer.id, "invoice": invoice.id, "amount": 100}
    )
    fetched = client.v1.invoices.retrieve(invoice.id)
    assert (fetched.status, fetched.auto_advance, fetched.number) == ("draft", True, None)


# ---------------------------------------------------------------------------------------------
# pay, payment failures, void, uncollectible


def test_pay_moves_open_to_paid_and_records_the_payment_events(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 700, 300)
    paid = client.v1.invoices.pay(invoice.id)
    assert (paid.status, paid.amount_paid, paid.amount_remaining, paid.attempt_count) == (
        "paid",
        1000,
        0,
        1,
    )
    assert paid.status_transitions is not None and paid.status_transitions.paid_at is not None
    assert event_types(emulator, invoice.id)[-2:] == ["invoice.paid", "invoice.payment_succeeded"]

    with pytest.raises(stripe.InvalidRequestError) as again:
        client.v1.invoices.pay(invoice.id)
    assert (again.value.http_status, again.value.user_message) == (400, "Invoice is already paid")


def test_a_declined_payment_is_a_402_card_error_and_the_invoice_stays_open(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 1200)
    emulator.set_faults(payment_failures=1)

    with pytest.raises(stripe.CardError) as declined:
        client.v1.invoices.pay(invoice.id)
    assert (declined.value.http_status, declined.value.code) == (402, "card_declined")
    assert declined.value.error is not None
    assert declined.value.error.decline_code == "generic_decline"
    after_failure = client.v1.invoices.retrieve(invoice.id)
    assert (after_failure.status, after_failure.attempt_count, after_failure.amount_paid) == (
        "open",
        1,
        0,
    )
    assert after_failure.next_payment_attempt is not None
    assert emulator.faults()["payment_failures"] == 0

    paid = client.v1.invoices.pay(invoice.id)  # the fault is used up
    assert (paid.status, paid.attempt_count, paid.next_payment_attempt) == ("paid", 2, None)
    assert event_types(emulator, invoice.id).count("invoice.payment_failed") == 1


def test_a_declined_card_fails_every_attempt_of_that_customer_only(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    declined, fine = open_invoice(client, 100), open_invoice(client, 100)
    emulator.set_card_declined(str(declined.customer))
    for _ in range(2):
        with pytest.raises(stripe.CardError):
            client.v1.invoices.pay(declined.id)
    assert client.v1.invoices.retrieve(declined.id).attempt_count == 2
    assert client.v1.invoices.pay(fine.id).status == "paid"

    emulator.set_card_declined(str(declined.customer), declined=False)
    assert client.v1.invoices.pay(declined.id).status == "paid"


def test_paying_a_draft_finalizes_it_first(client: stripe.StripeClient) -> None:
    invoice = draft(client, new_customer(client).id)
    attach(client, invoice, 900)
    paid = client.v1.invoices.pay(invoice.id)
    assert paid.status == "paid"
    assert paid.number is not None and paid.number.endswith("-0001")


def test_void_is_final_and_refused_for_drafts_and_paid_invoices(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 400)
    voided = client.v1.invoices.void_invoice(invoice.id)
    assert voided.status == "void"
    assert voided.status_transitions is not None
    assert voided.status_transitions.voided_at is not None
    assert event_types(emulator, invoice.id)[-1] == "invoice.voided"

    refusals: list[stripe.InvalidRequestError] = []
    for act in (
        lambda: client.v1.invoices.pay(invoice.id),
        lambda: client.v1.invoices.void_invoice(invoice.id),
        lambda: client.v1.invoices.mark_uncollectible(invoice.id),
        lambda: client.v1.invoices.void_invoice(draft(client, new_customer(client).id).id),
        lambda: client.v1.invoices.void_invoice(
            client.v1.invoices.pay(open_invoice(client, 5).id).id
        ),
    ):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            act()
        refusals.append(refused.value)
    assert [r.http_status for r in refusals] == [400] * 5
    assert "paid" in str(refusals[-1].user_message)
    assert client.v1.invoices.retrieve(invoice.id).status == "void"


def test_only_a_draft_is_deleted_with_its_items_and_is_gone_after(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    item = attach(client, invoice, 300)
    deleted = client.v1.invoices.delete(invoice.id)
    assert (deleted.id, deleted.deleted) == (invoice.id, True)
    assert event_types(emulator, invoice.id)[-1] == "invoice.deleted"
    for gone in (
        lambda: client.v1.invoices.retrieve(invoice.id),
        lambda: client.v1.invoices.delete(invoice.id),
        lambda: client.v1.invoice_items.retrieve(item.id),
    ):
        with pytest.raises(stripe.InvalidRequestError) as missing:
            gone()
        assert missing.value.http_status == 404
    final = open_invoice(client, 100)
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.invoices.delete(final.id)
    assert refused.value.http_status == 400
    assert "Void finalized invoices" in str(refused.value.user_message)
    assert client.v1.invoices.retrieve(final.id).status == "open"


def test_uncollectible_can_still_be_paid_or_voided(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    to_pay, to_void = open_invoice(client, 100), open_invoice(client, 100)
    for invoice in (to_pay, to_void):
        marked = client.v1.invoices.mark_uncollectible(invoice.id)
        assert marked.status == "uncollectible"
        assert marked.status_transitions is not None
        assert marked.status_transitions.marked_uncollectible_at is not None
    with pytest.raises(stripe.InvalidRequestError) as twice:
        client.v1.invoices.mark_uncollectible(to_pay.id)
    assert "already been marked uncollectible" in str(twice.value.user_message)

    assert client.v1.invoices.pay(to_pay.id).status == "paid"
    assert client.v1.invoices.void_invoice(to_void.id).status == "void"
    assert event_types(emulator, to_pay.id)[-3:] == [
        "invoice.marked_uncollectible",
        "invoice.paid",
        "invoice.payment_succeeded",
    ]


def test_control_helpers_pay_or_fail_an_invoice_as_the_customer_would(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    failed = emulator.fail_payment(open_invoice(client, 100).id)
    assert (failed["status"], failed["attempt_count"]) == ("open", 1)
    failed_event = emulator.events("invoice.payment_failed")[-1]
    assert failed_event["request"] == {"id": None, "idempotency_key": None}

    emulator.set_faults(payment_failures=5)  # the helper pays whatever the faults say
    assert emulator.pay_invoice(failed["id"])["status"] == "paid"

    invoice = open_invoice(client, 200)
    status, _, body = http(emulator, "POST", f"/_emulator/invoices/{invoice.id}/fail_payment")
    assert (status, body["attempt_count"]) == (200, 1)
    status, _, body = http(emulator, "POST", f"/_emulator/invoices/{invoice.id}/pay")
    assert (status, body["status"]) == (200, "paid")
    status, _, body = http(emulator, "POST", f"/_emulator/invoices/{invoice.id}/pay")
    assert status == 400 and "paid" in body["error"]["message"]
    assert http(emulator, "POST", "/_emulator/invoices/in_nothing/pay")[0] == 404
    with pytest.raises(ValueError, match="draft"):
        emulator.pay_invoice(draft(client, new_customer(client).id).id)


# ---------------------------------------------------------------------------------------------
# list, search, update


def test_invoices_list_by_customer_and_status_with_cursor_pagination(
    client: stripe.StripeClient,
) -> None:
    customer = new_customer(client)
    drafts = [draft(client, customer.id) for _ in range(3)]
    opened = open_invoice(client, 100)
    draft(client, new_customer(client).id)

    mine = client.v1.invoices.list(params={"customer": customer.id, "limit": 2})
    assert mine.has_more is True
    assert [i.id for i in mine.data] == [drafts[2].id, drafts[1].id]
    rest = client.v1.invoices.list(
        params={"customer": customer.id, "limit": 2, "starting_after": mine.data[-1].id}
    )
    assert ([i.id for i in rest.data], rest.has_more) == ([drafts[0].id], False)
    back = client.v1.invoices.list(
        params={"customer": customer.id, "limit": 2, "ending_before": drafts[0].id}
    )
    assert [i.id for i in back.data] == [drafts[2].id, drafts[1].id]
    assert [i.id for i in client.v1.invoices.list(params={"status": "open"}).data] == [opened.id]
    with pytest.raises(stripe.InvalidRequestError) as bad:
        client.v1.invoices.list(params={"status": "closed"})
    assert bad.value.param == "status"


def test_invoices_search_by_metadata_customer_and_status(client: stripe.StripeClient) -> None:
    customer = new_customer(client)
    november = draft(client, customer.id, period="2026-11")
    draft(client, customer.id, period="2026-12")
    draft(client, new_customer(client).id, period="2026-11")

    found = client.v1.invoices.search(
        params={"query": f"metadata['period']:'2026-11' AND customer:'{customer.id}'"}
    )
    assert [i.id for i in found.data] == [november.id]
    drafts = client.v1.invoices.search(params={"query": "status:'draft'"})
    assert len(drafts.data) == 3
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoices.search(params={"query": "total>100"})


def test_a_finalized_invoice_takes_metadata_but_not_a_new_description(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 100)
    updated = client.v1.invoices.update(invoice.id, params={"metadata": {"synced": "yes"}})
    assert updated.metadata is not None and updated.metadata.to_dict() == {"synced": "yes"}
    last: dict[str, Any] = emulator.events("invoice.updated")[-1]
    assert last["data"]["previous_attributes"] == {"metadata": {"synced": None}}
    with pytest.raises(stripe.InvalidRequestError) as refused:
        client.v1.invoices.update(invoice.id, params={"description": "late"})
    assert (refused.value.http_status, refused.value.param) == (400, "description")
