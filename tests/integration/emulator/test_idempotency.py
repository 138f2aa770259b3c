"""Stripe's v1 idempotency keys: replay, mismatch, concurrent use, expiry, on every POST."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import stripe
from stripe import RequestOptions

from infra.stripe_emulator import StripeEmulator

from .support import (
    attach,
    draft,
    err_header,
    executions,
    header,
    item_params,
    new_customer,
    open_invoice,
)

pytestmark = pytest.mark.integration


def test_same_key_same_params_replays_the_saved_response(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    params = item_params(customer.id, "txn-replay")

    first = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-replay"})
    second = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-replay"})

    assert second.id == first.id
    assert header(first, "Idempotent-Replayed") is None
    assert header(second, "Idempotent-Replayed") == "true"
    assert len(executions(emulator, "k-replay")) == 1
    assert len(emulator.live_invoice_items("txn-replay")) == 1

    # A saved error response is replayed too (status and body), marked as a replay.
    bad = item_params("cus_nobody", "txn-err")
    errors = []
    for _ in range(2):
        with pytest.raises(stripe.InvalidRequestError) as info:
            client.v1.invoice_items.create(params=bad, options={"idempotency_key": "k-error"})
        errors.append(info.value)
    assert errors[0].json_body == errors[1].json_body
    assert err_header(errors[0], "Idempotent-Replayed") is None
    assert err_header(errors[1], "Idempotent-Replayed") == "true"


def test_same_key_different_params_is_an_idempotency_error(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    client.v1.invoice_items.create(
        params=item_params(customer.id, "txn-a", 100), options={"idempotency_key": "k-diff"}
    )
    with pytest.raises(stripe.IdempotencyError) as info:
        client.v1.invoice_items.create(
            params=item_params(customer.id, "txn-a", 999), options={"idempotency_key": "k-diff"}
        )
    assert info.value.http_status == 400
    assert info.value.error is not None and info.value.error.type == "idempotency_error"
    assert len(executions(emulator, "k-diff")) == 1
    assert [i["amount"] for i in emulator.live_invoice_items("txn-a")] == [100]


def test_concurrent_use_of_a_key_gets_409(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    params = item_params(customer.id, "txn-concurrent")
    emulator.set_faults(latency_ms=1000)  # holds the first request in flight for a second
    outcome: dict[str, Any] = {}

    def first_request() -> None:
        try:
            outcome["item"] = client.v1.invoice_items.create(
                params=params, options={"idempotency_key": "k-busy"}
            )
        except Exception as exc:  # reported through `outcome`, asserted below
            outcome["error"] = exc

    worker = threading.Thread(target=first_request)
    worker.start()
    try:
        assert emulator.wait_for_in_flight("k-busy", timeout=5), "first request never arrived"
        emulator.set_faults(latency_ms=0)  # the second request is answered at once
        with pytest.raises(stripe.APIError) as info:
            client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-busy"})
    finally:
        worker.join(timeout=10)

    err = info.value
    assert err.http_status == 409
    assert err.error is not None
    assert (err.error.type, err.error.code) == ("idempotency_error", "idempotency_key_in_use")
    assert err_header(err, "Stripe-Should-Retry") == "true"
    assert "error" not in outcome, outcome.get("error")
    item = outcome["item"]
    assert len(executions(emulator, "k-busy")) == 1

    again = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-busy"})
    assert again.id == item.id
    assert header(again, "Idempotent-Replayed") == "true"


def test_keys_expire_after_the_ttl(emulator: StripeEmulator, client: stripe.StripeClient) -> None:
    emulator.set_faults(key_ttl_s=0.3)
    customer = new_customer(client)
    params = item_params(customer.id, "txn-ttl")

    first = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    replay = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    assert replay.id == first.id

    time.sleep(0.35)  # let the 0.3 s key lifetime pass (the behaviour under test is time)
    fresh = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    assert fresh.id != first.id
    assert header(fresh, "Idempotent-Replayed") is None
    assert len(executions(emulator, "k-ttl")) == 2


# ---------------------------------------------------------------------------------------------
# every new POST keeps the rules

_Act = Callable[[RequestOptions], stripe.StripeObject]


def _create_invoice(client: stripe.StripeClient) -> _Act:
    customer = new_customer(client)
    return lambda options: client.v1.invoices.create(
        params={"customer": customer.id, "currency": "usd"}, options=options
    )


def _attach_item(client: stripe.StripeClient) -> _Act:
    invoice = draft(client, new_customer(client).id)
    customer_id = str(invoice.customer)
    return lambda options: client.v1.invoice_items.create(
        params={"customer": customer_id, "invoice": invoice.id, "amount": 100}, options=options
    )


def _update_item(client: stripe.StripeClient) -> _Act:
    item = attach(client, draft(client, new_customer(client).id), 100)
    return lambda options: client.v1.invoice_items.update(
        item.id, params={"amount": 300, "metadata": {"seq": "2"}}, options=options
    )


def _delete_item(client: stripe.StripeClient) -> _Act:
    item = attach(client, draft(client, new_customer(client).id), 100)
    return lambda options: client.v1.invoice_items.delete(item.id, options=options)


def _update_invoice(client: stripe.StripeClient) -> _Act:
    invoice = draft(client, new_customer(client).id)
    return lambda options: client.v1.invoices.update(
        invoice.id, params={"metadata": {"synced": "1"}}, options=options
    )


def _finalize(client: stripe.StripeClient) -> _Act:
    invoice = draft(client, new_customer(client).id)
    attach(client, invoice, 100)
    return lambda options: client.v1.invoices.finalize_invoice(invoice.id, options=options)


def _pay(client: stripe.StripeClient) -> _Act:
    invoice = open_invoice(client, 100)
    return lambda options: client.v1.invoices.pay(invoice.id, options=options)


def _void(client: stripe.StripeClient) -> _Act:
    invoice = open_invoice(client, 100)
    return lambda options: client.v1.invoices.void_invoice(invoice.id, options=options)


def _mark_uncollectible(client: stripe.StripeClient) -> _Act:
    invoice = open_invoice(client, 100)
    return lambda options: client.v1.invoices.mark_uncollectible(invoice.id, options=options)


def _credit_note(client: stripe.StripeClient) -> _Act:
    invoice = open_invoice(client, 100)
    return lambda options: client.v1.credit_notes.create(
        params={"invoice": invoice.id, "amount": 40, "reason": "duplicate"}, options=options
    )


_NEW_POSTS: dict[str, Callable[[stripe.StripeClient], _Act]] = {
    "create invoice": _create_invoice,
    "attach item": _attach_item,
    "update item": _update_item,
    "delete item": _delete_item,
    "update invoice": _update_invoice,
    "finalize": _finalize,
    "pay": _pay,
    "void": _void,
    "mark uncollectible": _mark_uncollectible,
    "create credit note": _credit_note,
}


@pytest.mark.parametrize("name", list(_NEW_POSTS))
def test_each_new_post_replays_its_first_response_under_the_same_key(
    emulator: StripeEmulator, client: stripe.StripeClient, name: str
) -> None:
    act = _NEW_POSTS[name](client)
    key = "k-" + name.replace(" ", "-")
    first = act({"idempotency_key": key})
    events_after_first = len(emulator.events())

    second = act({"idempotency_key": key})

    assert header(first, "Idempotent-Replayed") is None
    assert header(second, "Idempotent-Replayed") == "true"
    assert first.last_response is not None and second.last_response is not None
    assert second.last_response.body == first.last_response.body
    assert len(executions(emulator, key)) == 1
    assert len(emulator.events()) == events_after_first  # the replay changed nothing


def test_a_new_post_with_a_reused_key_and_other_params_is_an_idempotency_error(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 1000)
    options: RequestOptions = {"idempotency_key": "k-credit"}
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 100}, options=options)
    with pytest.raises(stripe.IdempotencyError) as info:
        client.v1.credit_notes.create(
            params={"invoice": invoice.id, "amount": 200}, options=options
        )
    assert info.value.http_status == 400
    assert len(emulator.credit_notes(invoice.id)) == 1


def test_a_declined_payment_is_replayed_under_its_key_without_another_attempt(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 100)
    emulator.set_faults(payment_failures=2)
    errors = []
    for _ in range(2):
        with pytest.raises(stripe.CardError) as info:
            client.v1.invoices.pay(invoice.id, options={"idempotency_key": "k-pay"})
        errors.append(info.value)
    assert errors[0].json_body == errors[1].json_body
    assert err_header(errors[1], "Idempotent-Replayed") == "true"
    assert client.v1.invoices.retrieve(invoice.id).attempt_count == 1
    assert emulator.faults()["payment_failures"] == 1  # the replay used no failure
