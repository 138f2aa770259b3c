"""Customers, invoice items and invoices as the SDK sees them: create, retrieve, list, search."""

from __future__ import annotations

from typing import Any, cast

import pytest
import stripe
from stripe.params import InvoiceItemCreateParams

from infra.stripe_emulator import StripeEmulator

from .support import (
    API_KEY,
    attach,
    draft,
    err_header,
    executions,
    header,
    http,
    item_params,
    new_customer,
)

pytestmark = pytest.mark.integration


def test_customers_create_retrieve_and_search_by_metadata(client: stripe.StripeClient) -> None:
    alice = new_customer(client, account_id="acct-1")
    new_customer(client, account_id="acct-2")

    assert alice.id.startswith("cus_")
    assert alice.object == "customer"
    assert alice.metadata is not None and alice.metadata.to_dict() == {"account_id": "acct-1"}
    assert client.v1.customers.retrieve(alice.id).email == "ops@example.com"

    found = client.v1.customers.search(params={"query": "metadata['account_id']:'acct-1'"})
    assert found["object"] == "search_result"
    assert [c.id for c in found.data] == [alice.id]
    none = client.v1.customers.search(params={"query": "metadata['account_id']:'nobody'"})
    assert none.data == []

    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.customers.retrieve("cus_doesnotexist")
    assert missing.value.http_status == 404
    assert missing.value.code == "resource_missing"


def test_invoice_items_create_list_paginate_delete_and_search(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    other = new_customer(client)
    created = [
        client.v1.invoice_items.create(params=item_params(customer.id, f"txn-{n}", 100 + n))
        for n in range(3)
    ]
    client.v1.invoice_items.create(params=item_params(other.id, "txn-other"))

    first = created[0]
    assert first.id.startswith("ii_")
    assert (first.object, first.amount, first.currency, first.customer) == (
        "invoiceitem",
        100,
        "usd",
        customer.id,
    )
    fetched_first = client.v1.invoice_items.retrieve(first.id)
    assert fetched_first.metadata is not None
    assert fetched_first.metadata.to_dict() == {"txn_id": "txn-0"}

    page = client.v1.invoice_items.list(params={"customer": customer.id, "limit": 2})
    assert page["object"] == "list"
    assert page.has_more is True
    assert [i.id for i in page.data] == [created[2].id, created[1].id]  # newest first
    rest = client.v1.invoice_items.list(
        params={"customer": customer.id, "limit": 2, "starting_after": page.data[-1].id}
    )
    assert rest.has_more is False
    assert [i.id for i in rest.data] == [created[0].id]
    everything = client.v1.invoice_items.list(params={"customer": customer.id, "limit": 1})
    assert {i.id for i in everything.auto_paging_iter()} == {i.id for i in created}

    deleted = client.v1.invoice_items.delete(created[1].id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created[1].id, "invoiceitem", True)
    remaining = client.v1.invoice_items.list(params={"customer": customer.id})
    assert [i.id for i in remaining.data] == [created[2].id, created[0].id]
    with pytest.raises(stripe.InvalidRequestError) as gone:
        client.v1.invoice_items.retrieve(created[1].id)
    assert (gone.value.http_status, gone.value.code) == (404, "resource_missing")

    # /v1/invoiceitems/search is emulator-only (the SDK has no method for it): raw request.
    raw = client.raw_request("get", "/v1/invoiceitems/search", query="metadata['txn_id']:'txn-2'")
    result = client.deserialize(raw, api_mode="V1")
    assert result["object"] == "search_result"
    assert [i.id for i in result["data"]] == [created[2].id]
    raw_deleted = client.raw_request(
        "get", "/v1/invoiceitems/search", query="metadata['txn_id']:'txn-1'"
    )
    assert client.deserialize(raw_deleted, api_mode="V1")["data"] == []

    # The control view counts live charges per transaction and still shows the deleted one.
    assert [i["id"] for i in emulator.live_invoice_items("txn-2")] == [created[2].id]
    assert emulator.live_invoice_items("txn-1") == []
    status, _, all_txn_1 = http(emulator, "GET", "/_emulator/invoiceitems?txn_id=txn-1")
    assert status == 200
    assert [(i["id"], i["deleted"]) for i in all_txn_1] == [(created[1].id, True)]


def test_invoice_create_includes_pending_items(client: stripe.StripeClient) -> None:
    customer = new_customer(client)
    item = client.v1.invoice_items.create(params=item_params(customer.id, "txn-inv", 700))

    invoice = client.v1.invoices.create(
        params={"customer": customer.id, "pending_invoice_items_behavior": "include"}
    )
    assert invoice.id.startswith("in_")
    assert (invoice.status, invoice.amount_due) == ("draft", 700)
    fetched = client.v1.invoices.retrieve(invoice.id)
    assert [line["invoice_item"] for line in fetched.lines.data] == [item.id]
    assert client.v1.invoice_items.retrieve(item.id).invoice == invoice.id


def test_unknown_customer_and_bad_amount_are_invalid_requests(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    with pytest.raises(stripe.InvalidRequestError) as unknown:
        client.v1.invoice_items.create(params=item_params("cus_nobody", "txn-x"))
    err = unknown.value
    assert (err.http_status, err.code, err.param) == (400, "resource_missing", "customer")
    assert err.error is not None and err.error.type == "invalid_request_error"
    assert err_header(err, "Stripe-Should-Retry") == "false"

    customer = new_customer(client)
    bad = cast(dict[str, Any], item_params(customer.id, "txn-bad"))
    for amount in (-100_000_000, "12.5"):  # a negative item (a credit) is fine above that
        bad["amount"] = amount
        with pytest.raises(stripe.InvalidRequestError) as invalid:
            client.v1.invoice_items.create(
                params=cast(InvoiceItemCreateParams, bad), options={"idempotency_key": "bad-amount"}
            )
        assert (invalid.value.http_status, invalid.value.param) == (400, "amount")

    # A validation failure is not saved under the key: the corrected request executes.
    good = client.v1.invoice_items.create(
        params=item_params(customer.id, "txn-bad"), options={"idempotency_key": "bad-amount"}
    )
    assert header(good, "Idempotent-Replayed") is None
    assert len(executions(emulator, "bad-amount")) == 1


def test_a_drafts_bulk_update_sets_a_negative_amount_a_credit(
    client: stripe.StripeClient,
) -> None:
    invoice = draft(client, new_customer(client).id)
    attach(client, invoice, 500, line="usage")
    credit = attach(client, invoice, -100, line="credit")
    lines = client.v1.invoices.line_items.list(invoice.id).data
    [line] = [ln for ln in lines if ln.invoice_item == credit.id]
    change = {"lines": [{"id": line.id, "amount": -300, "metadata": {"sequence": "2"}}]}
    client.v1.invoices.update_lines(invoice.id, params=change)  # type: ignore[arg-type]
    assert client.v1.invoice_items.retrieve(credit.id).amount == -300
    assert client.v1.invoices.retrieve(invoice.id).amount_due == 200


def test_missing_api_key_is_401(emulator: StripeEmulator) -> None:
    status, headers, body = http(emulator, "GET", "/v1/customers/cus_x")
    assert status == 401
    assert body["error"]["type"] == "invalid_request_error"
    assert headers["Stripe-Should-Retry"] == "false"

    authed, _, _ = http(
        emulator, "GET", "/v1/customers/cus_x", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert authed == 404


def test_module_level_api_base(monkeypatch: pytest.MonkeyPatch, emulator: StripeEmulator) -> None:
    monkeypatch.setattr(stripe, "api_key", API_KEY)
    monkeypatch.setattr(stripe, "api_base", emulator.url)
    monkeypatch.setattr(stripe, "max_network_retries", 0)

    customer = stripe.Customer.create(name="Module Level", metadata={"k": "v"})
    assert stripe.Customer.retrieve(customer.id).name == "Module Level"
    assert [e["object_id"] for e in emulator.ledger()] == [customer.id]
