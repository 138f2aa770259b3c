"""Fault injection: injected 500s, outages, rate limits (global and per endpoint), drops."""

from __future__ import annotations

import time

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import (
    attach,
    client_for,
    draft,
    err_header,
    executions,
    header,
    http,
    item_params,
    new_customer,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_injected_500_is_an_api_error_and_not_saved(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    params = item_params(customer.id, "txn-500")
    emulator.set_faults(error_rate=1.0)
    with pytest.raises(stripe.APIError) as info:
        client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-500"})
    assert info.value.http_status == 500
    assert err_header(info.value, "Stripe-Should-Retry") == "true"
    assert executions(emulator, "k-500") == []

    emulator.set_faults(error_rate=0.0)
    item = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-500"})
    assert header(item, "Idempotent-Replayed") is None  # the 500 was not saved
    assert [e["object_id"] for e in executions(emulator, "k-500")] == [item.id]


def test_error_rate_is_reproducible_with_a_seed() -> None:
    def statuses() -> list[int]:
        with StripeEmulator(seed=42, error_rate=0.5) as emu:
            sdk = client_for(emu)
            seen = []
            for _ in range(12):
                try:
                    sdk.v1.invoice_items.list()
                    seen.append(200)
                except stripe.APIError as exc:
                    seen.append(exc.http_status or 0)
            return seen

    first, second = statuses(), statuses()
    assert first == second
    assert set(first) == {200, 500}


def test_outage_503_then_recovery(emulator: StripeEmulator, client: stripe.StripeClient) -> None:
    emulator.set_faults(outage=True)
    with pytest.raises(stripe.APIError) as info:
        client.v1.customers.create(params={"name": "x"}, options={"idempotency_key": "k-503"})
    assert info.value.http_status == 503
    assert err_header(info.value, "Stripe-Should-Retry") == "true"

    emulator.set_faults(outage=False)
    customer = client.v1.customers.create(
        params={"name": "x"}, options={"idempotency_key": "k-503"}
    )
    assert header(customer, "Idempotent-Replayed") is None
    assert [e["object_id"] for e in emulator.ledger()] == [customer.id]


def test_outage_refuse_window_closes_connections_then_ends(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    status, _, faults = http(
        emulator, "POST", "/_emulator/faults", {"outage": {"mode": "refuse", "seconds": 0.5}}
    )
    assert (status, faults["outage"], faults["outage_mode"]) == (200, True, "refuse")

    with pytest.raises(stripe.APIConnectionError):
        client.v1.customers.create(params={"name": "x"})
    refused = emulator.requests()[-1]
    assert (refused["outcome"], refused["status"]) == ("refused", None)
    assert emulator.ledger() == []

    deadline = time.monotonic() + 5
    while http(emulator, "GET", "/_emulator/faults")[2]["outage"]:
        assert time.monotonic() < deadline, "the outage window never ended"
        time.sleep(0.02)
    assert client.v1.customers.create(params={"name": "x"}).id.startswith("cus_")


def test_rate_limit_answers_429_with_retry_after(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    emulator.set_faults(rate_limit_per_s=3)
    outcomes: list[int] = []
    limited: list[stripe.RateLimitError] = []
    started = time.monotonic()
    for _ in range(6):
        try:
            client.v1.customers.retrieve("cus_missing")  # a 404 still counts as a request
        except stripe.InvalidRequestError as exc:
            outcomes.append(exc.http_status or 0)
        except stripe.RateLimitError as exc:
            outcomes.append(exc.http_status or 0)
            limited.append(exc)
    assert time.monotonic() - started < 1.0, "too slow to exercise a 1 s window"
    assert outcomes == [404, 404, 404, 429, 429, 429]
    assert err_header(limited[0], "Retry-After") == "1"
    assert err_header(limited[0], "Stripe-Should-Retry") == "true"

    # The request log lets a test compute the observed rate: never more than 3 admitted per s.
    admitted = [r["at"] for r in emulator.requests() if r["status"] != 429]
    assert len(admitted) == 3
    assert all(sum(1 for u in admitted if 0 <= t - u < 1.0) <= 3 for t in admitted)

    # The 429 comes before the key is looked at, and is not saved under it.
    with pytest.raises(stripe.RateLimitError):
        client.v1.customers.create(params={"name": "y"}, options={"idempotency_key": "k-429"})
    emulator.set_faults(rate_limit_per_s=None)
    created = client.v1.customers.create(params={"name": "y"}, options={"idempotency_key": "k-429"})
    assert header(created, "Idempotent-Replayed") is None
    assert [e["object_id"] for e in executions(emulator, "k-429")] == [created.id]


def test_drop_after_execute_then_retry_returns_the_saved_object(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    params = item_params(customer.id, "txn-drop")
    emulator.set_faults(drop_response_after_execute=1)

    with pytest.raises(stripe.APIConnectionError):
        client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-drop"})
    executed = executions(emulator, "k-drop")
    assert len(executed) == 1  # it happened, the client just never heard

    retry = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-drop"})
    assert retry.id == executed[0]["object_id"]
    assert header(retry, "Idempotent-Replayed") == "true"
    assert len(executions(emulator, "k-drop")) == 1
    assert [i["id"] for i in emulator.live_invoice_items("txn-drop")] == [retry.id]
    assert [r["outcome"] for r in emulator.requests()[-2:]] == ["dropped", "replayed"]


def test_endpoint_rate_limit_counts_each_endpoint_on_its_own(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    items = [attach(client, invoice, 100) for _ in range(3)]
    emulator.set_faults(endpoint_rate_limit_per_s=2)
    started = time.monotonic()
    outcomes: list[int] = []
    limited: list[stripe.RateLimitError] = []
    for item in items:  # one endpoint, whatever the id: POST /v1/invoiceitems/{id}
        try:
            client.v1.invoice_items.update(item.id, params={"amount": 200})
            outcomes.append(200)
        except stripe.RateLimitError as exc:
            outcomes.append(exc.http_status or 0)
            limited.append(exc)
    assert outcomes == [200, 200, 429]
    assert "POST /v1/invoiceitems/{id}" in str(limited[0].user_message)
    assert err_header(limited[0], "Retry-After") == "1"
    assert err_header(limited[0], "Stripe-Should-Retry") == "true"
    # Other endpoints keep their own windows.
    assert client.v1.invoices.retrieve(invoice.id).total == 500
    assert client.v1.invoice_items.retrieve(items[2].id).amount == 100
    assert time.monotonic() - started < 1.0, "too slow to exercise a 1 s window"

    # The 429 comes before the key is looked at: once the window slides, the keyed request
    # executes as new.
    def update_with_key() -> bool:
        try:
            client.v1.invoice_items.update(
                items[2].id, params={"amount": 200}, options={"idempotency_key": "k-endpoint"}
            )
        except stripe.RateLimitError:
            return False
        return True

    wait_until(update_with_key, timeout=3, what="the endpoint window to admit again")
    assert len(executions(emulator, "k-endpoint")) == 1
    assert client.v1.invoice_items.retrieve(items[2].id).amount == 200


def test_per_endpoint_limit_is_off_by_default_and_validated(emulator: StripeEmulator) -> None:
    assert emulator.faults()["endpoint_rate_limit_per_s"] is None
    with pytest.raises(ValueError, match="endpoint_rate_limit_per_s"):
        emulator.set_faults(endpoint_rate_limit_per_s=-1)
    with pytest.raises(ValueError, match="webhook_max_attempts"):
        StripeEmulator(webhook_max_attempts=0)


def test_a_late_item_update_lands_after_a_newer_one_its_client_gave_up_on(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = new_customer(client)
    item = client.v1.invoice_items.create(params=item_params(customer.id, "txn-late", 100))
    emulator.set_faults(late_execute_next=1, late_execute_s=0.5)

    with pytest.raises(stripe.APIConnectionError):  # the client hears nothing
        client.v1.invoice_items.update(
            item.id, params={"amount": 200}, options={"idempotency_key": "k-late-2"}
        )
    with pytest.raises(stripe.APIError) as in_flight:  # its key is in flight meanwhile
        client.v1.invoice_items.update(
            item.id, params={"amount": 200}, options={"idempotency_key": "k-late-2"}
        )
    assert in_flight.value.http_status == 409
    newer = client.v1.invoice_items.update(
        item.id, params={"amount": 300}, options={"idempotency_key": "k-late-3"}
    )
    assert newer.amount == 300
    wait_until(lambda: bool(executions(emulator, "k-late-2")), what="the late update")
    # Stripe applied the older request last: it holds the stale amount
    assert client.v1.invoice_items.retrieve(item.id).amount == 200
    held = [r for r in emulator.requests() if r["idempotency_key"] == "k-late-2"]
    assert held[0]["outcome"] == "executed_late"
    assert emulator.faults()["late_execute_next"] == 0


def test_late_execution_holds_only_item_updates(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    emulator.set_faults(late_execute_probability=1.0, late_execute_s=0.1)
    customer = new_customer(client)  # a create: answered at once
    item = client.v1.invoice_items.create(params=item_params(customer.id, "txn-late-c"))
    assert item.amount == 1250
    with pytest.raises(stripe.APIConnectionError):
        client.v1.invoice_items.update(item.id, params={"amount": 5})
    wait_until(lambda: client.v1.invoice_items.retrieve(item.id).amount == 5, what="late update")
    with pytest.raises(ValueError, match="late_execute_probability"):
        emulator.set_faults(late_execute_probability=2)


def test_a_drafts_bulk_update_is_held_late_and_limited_like_an_item_update(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    item = attach(client, invoice, 100, sequence="1", line="cpu")
    [line] = client.v1.invoices.line_items.list(invoice.id).data
    emulator.set_faults(late_execute_next=1, late_execute_s=0.5)
    one = {"lines": [{"id": line.id, "amount": 200, "metadata": {"sequence": "2"}}]}
    with pytest.raises(stripe.APIConnectionError):  # the client hears nothing
        client.v1.invoices.update_lines(
            invoice.id,
            params=one,  # type: ignore[arg-type]
            options={"idempotency_key": "lines-late"},
        )
    wait_until(lambda: bool(executions(emulator, "lines-late")), what="the late bulk update")
    held = client.v1.invoice_items.retrieve(item.id)
    assert held.amount == 200 and held.metadata is not None
    assert held.metadata.to_dict() == {"sequence": "2", "line": "cpu"}  # merged
    emulator.set_faults(endpoint_rate_limit_per_s=1)
    client.v1.invoices.update_lines(invoice.id, params=one)  # type: ignore[arg-type]
    with pytest.raises(stripe.RateLimitError):  # counted under its own endpoint
        client.v1.invoices.update_lines(invoice.id, params=one)  # type: ignore[arg-type]
    emulator.set_faults(endpoint_rate_limit_per_s=None, error_rate=1.0)
    with pytest.raises(stripe.APIError):  # injected 500s reach it too
        client.v1.invoices.update_lines(invoice.id, params=one)  # type: ignore[arg-type]


def test_a_refused_bulk_update_is_saved_under_its_key_and_replayed(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = draft(client, new_customer(client).id)
    attach(client, invoice, 100)
    [line] = client.v1.invoices.line_items.list(invoice.id).data
    client.v1.invoices.finalize_invoice(invoice.id)
    one = {"lines": [{"id": line.id, "amount": 200}]}
    for _ in range(2):
        with pytest.raises(stripe.InvalidRequestError, match="no longer editable"):
            client.v1.invoices.update_lines(
                invoice.id,
                params=one,  # type: ignore[arg-type]
                options={"idempotency_key": "lines-final"},
            )
    assert [r["outcome"] for r in emulator.requests()][-2:] == ["executed", "replayed"]
    assert client.v1.invoices.retrieve(invoice.id).total == 100
