"""The Stripe emulator, driven over HTTP by the real ``stripe`` SDK (no mocks).

Every test starts its own emulator on an ephemeral port; the SDK never retries on its own
(``max_network_retries=0``) so each assertion is about exactly one request.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import stripe
from stripe.params import InvoiceItemCreateParams

from infra.stripe_emulator import StripeEmulator, main

pytestmark = pytest.mark.integration

API_KEY = "sk_test_emulator"


# ---------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    with StripeEmulator(seed=1) as emu:
        yield emu


@pytest.fixture
def client(emulator: StripeEmulator) -> stripe.StripeClient:
    return _client(emulator)


def _client(emulator: StripeEmulator) -> stripe.StripeClient:
    return stripe.StripeClient(API_KEY, base_addresses={"api": emulator.url}, max_network_retries=0)


def _http(
    emulator: StripeEmulator,
    method: str,
    path: str,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """A raw HTTP request (for the control API and for what the SDK cannot send)."""
    parts = urlsplit(emulator.url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def _customer(client: stripe.StripeClient, **metadata: str) -> stripe.Customer:
    return client.v1.customers.create(params={"email": "ops@example.com", "metadata": metadata})


def _item_params(customer_id: str, txn_id: str, amount: int = 1250) -> InvoiceItemCreateParams:
    return {
        "customer": customer_id,
        "amount": amount,
        "currency": "usd",
        "description": f"usage {txn_id}",
        "metadata": {"txn_id": txn_id},
    }


def _executions(emulator: StripeEmulator, key: str) -> list[dict[str, Any]]:
    return [entry for entry in emulator.ledger() if entry["idempotency_key"] == key]


def _header(obj: stripe.StripeObject, name: str) -> str | None:
    assert obj.last_response is not None
    value: str | None = obj.last_response.headers.get(name)
    return value


def _err_header(exc: stripe.StripeError, name: str) -> str | None:
    assert exc.headers is not None
    value: str | None = exc.headers.get(name)
    return value


# ---------------------------------------------------------------------------------------------
# resources


def test_customers_create_retrieve_and_search_by_metadata(client: stripe.StripeClient) -> None:
    alice = _customer(client, account_id="acct-1")
    _customer(client, account_id="acct-2")

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
    customer = _customer(client)
    other = _customer(client)
    created = [
        client.v1.invoice_items.create(params=_item_params(customer.id, f"txn-{n}", 100 + n))
        for n in range(3)
    ]
    client.v1.invoice_items.create(params=_item_params(other.id, "txn-other"))

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
    status, _, all_txn_1 = _http(emulator, "GET", "/_emulator/invoiceitems?txn_id=txn-1")
    assert status == 200
    assert [(i["id"], i["deleted"]) for i in all_txn_1] == [(created[1].id, True)]


def test_invoice_create_includes_pending_items(client: stripe.StripeClient) -> None:
    customer = _customer(client)
    item = client.v1.invoice_items.create(params=_item_params(customer.id, "txn-inv", 700))

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
        client.v1.invoice_items.create(params=_item_params("cus_nobody", "txn-x"))
    err = unknown.value
    assert (err.http_status, err.code, err.param) == (400, "resource_missing", "customer")
    assert err.error is not None and err.error.type == "invalid_request_error"
    assert _err_header(err, "Stripe-Should-Retry") == "false"

    customer = _customer(client)
    bad = cast(dict[str, Any], _item_params(customer.id, "txn-bad"))
    for amount in (-5, "12.5"):
        bad["amount"] = amount
        with pytest.raises(stripe.InvalidRequestError) as invalid:
            client.v1.invoice_items.create(
                params=cast(InvoiceItemCreateParams, bad), options={"idempotency_key": "bad-amount"}
            )
        assert (invalid.value.http_status, invalid.value.param) == (400, "amount")

    # A validation failure is not saved under the key: the corrected request executes.
    good = client.v1.invoice_items.create(
        params=_item_params(customer.id, "txn-bad"), options={"idempotency_key": "bad-amount"}
    )
    assert _header(good, "Idempotent-Replayed") is None
    assert len(_executions(emulator, "bad-amount")) == 1


def test_missing_api_key_is_401(emulator: StripeEmulator) -> None:
    status, headers, body = _http(emulator, "GET", "/v1/customers/cus_x")
    assert status == 401
    assert body["error"]["type"] == "invalid_request_error"
    assert headers["Stripe-Should-Retry"] == "false"

    authed, _, _ = _http(
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


# ---------------------------------------------------------------------------------------------
# idempotency


def test_same_key_same_params_replays_the_saved_response(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = _customer(client)
    params = _item_params(customer.id, "txn-replay")

    first = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-replay"})
    second = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-replay"})

    assert second.id == first.id
    assert _header(first, "Idempotent-Replayed") is None
    assert _header(second, "Idempotent-Replayed") == "true"
    assert len(_executions(emulator, "k-replay")) == 1
    assert len(emulator.live_invoice_items("txn-replay")) == 1

    # A saved error response is replayed too (status and body), marked as a replay.
    bad = _item_params("cus_nobody", "txn-err")
    errors = []
    for _ in range(2):
        with pytest.raises(stripe.InvalidRequestError) as info:
            client.v1.invoice_items.create(params=bad, options={"idempotency_key": "k-error"})
        errors.append(info.value)
    assert errors[0].json_body == errors[1].json_body
    assert _err_header(errors[0], "Idempotent-Replayed") is None
    assert _err_header(errors[1], "Idempotent-Replayed") == "true"


def test_same_key_different_params_is_an_idempotency_error(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = _customer(client)
    client.v1.invoice_items.create(
        params=_item_params(customer.id, "txn-a", 100), options={"idempotency_key": "k-diff"}
    )
    with pytest.raises(stripe.IdempotencyError) as info:
        client.v1.invoice_items.create(
            params=_item_params(customer.id, "txn-a", 999), options={"idempotency_key": "k-diff"}
        )
    assert info.value.http_status == 400
    assert info.value.error is not None and info.value.error.type == "idempotency_error"
    assert len(_executions(emulator, "k-diff")) == 1
    assert [i["amount"] for i in emulator.live_invoice_items("txn-a")] == [100]


def test_concurrent_use_of_a_key_gets_409(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = _customer(client)
    params = _item_params(customer.id, "txn-concurrent")
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
    assert _err_header(err, "Stripe-Should-Retry") == "true"
    assert "error" not in outcome, outcome.get("error")
    item = outcome["item"]
    assert len(_executions(emulator, "k-busy")) == 1

    again = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-busy"})
    assert again.id == item.id
    assert _header(again, "Idempotent-Replayed") == "true"


def test_keys_expire_after_the_ttl(emulator: StripeEmulator, client: stripe.StripeClient) -> None:
    emulator.set_faults(key_ttl_s=0.3)
    customer = _customer(client)
    params = _item_params(customer.id, "txn-ttl")

    first = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    replay = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    assert replay.id == first.id

    time.sleep(0.35)  # let the 0.3 s key lifetime pass (the behaviour under test is time)
    fresh = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-ttl"})
    assert fresh.id != first.id
    assert _header(fresh, "Idempotent-Replayed") is None
    assert len(_executions(emulator, "k-ttl")) == 2


# ---------------------------------------------------------------------------------------------
# fault injection


def test_injected_500_is_an_api_error_and_not_saved(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = _customer(client)
    params = _item_params(customer.id, "txn-500")
    emulator.set_faults(error_rate=1.0)
    with pytest.raises(stripe.APIError) as info:
        client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-500"})
    assert info.value.http_status == 500
    assert _err_header(info.value, "Stripe-Should-Retry") == "true"
    assert _executions(emulator, "k-500") == []

    emulator.set_faults(error_rate=0.0)
    item = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-500"})
    assert _header(item, "Idempotent-Replayed") is None  # the 500 was not saved
    assert [e["object_id"] for e in _executions(emulator, "k-500")] == [item.id]


def test_error_rate_is_reproducible_with_a_seed() -> None:
    def statuses() -> list[int]:
        with StripeEmulator(seed=42, error_rate=0.5) as emu:
            sdk = _client(emu)
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
    assert _err_header(info.value, "Stripe-Should-Retry") == "true"

    emulator.set_faults(outage=False)
    customer = client.v1.customers.create(
        params={"name": "x"}, options={"idempotency_key": "k-503"}
    )
    assert _header(customer, "Idempotent-Replayed") is None
    assert [e["object_id"] for e in emulator.ledger()] == [customer.id]


def test_outage_refuse_window_closes_connections_then_ends(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    status, _, faults = _http(
        emulator, "POST", "/_emulator/faults", {"outage": {"mode": "refuse", "seconds": 0.5}}
    )
    assert (status, faults["outage"], faults["outage_mode"]) == (200, True, "refuse")

    with pytest.raises(stripe.APIConnectionError):
        client.v1.customers.create(params={"name": "x"})
    refused = emulator.requests()[-1]
    assert (refused["outcome"], refused["status"]) == ("refused", None)
    assert emulator.ledger() == []

    deadline = time.monotonic() + 5
    while _http(emulator, "GET", "/_emulator/faults")[2]["outage"]:
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
    assert _err_header(limited[0], "Retry-After") == "1"
    assert _err_header(limited[0], "Stripe-Should-Retry") == "true"

    # The request log lets a test compute the observed rate: never more than 3 admitted per s.
    admitted = [r["at"] for r in emulator.requests() if r["status"] != 429]
    assert len(admitted) == 3
    assert all(sum(1 for u in admitted if 0 <= t - u < 1.0) <= 3 for t in admitted)

    # The 429 comes before the key is looked at, and is not saved under it.
    with pytest.raises(stripe.RateLimitError):
        client.v1.customers.create(params={"name": "y"}, options={"idempotency_key": "k-429"})
    emulator.set_faults(rate_limit_per_s=None)
    created = client.v1.customers.create(params={"name": "y"}, options={"idempotency_key": "k-429"})
    assert _header(created, "Idempotent-Replayed") is None
    assert [e["object_id"] for e in _executions(emulator, "k-429")] == [created.id]


def test_drop_after_execute_then_retry_returns_the_saved_object(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    customer = _customer(client)
    params = _item_params(customer.id, "txn-drop")
    emulator.set_faults(drop_response_after_execute=1)

    with pytest.raises(stripe.APIConnectionError):
        client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-drop"})
    executed = _executions(emulator, "k-drop")
    assert len(executed) == 1  # it happened, the client just never heard

    retry = client.v1.invoice_items.create(params=params, options={"idempotency_key": "k-drop"})
    assert retry.id == executed[0]["object_id"]
    assert _header(retry, "Idempotent-Replayed") == "true"
    assert len(_executions(emulator, "k-drop")) == 1
    assert [i["id"] for i in emulator.live_invoice_items("txn-drop")] == [retry.id]
    assert [r["outcome"] for r in emulator.requests()[-2:]] == ["dropped", "replayed"]


# ---------------------------------------------------------------------------------------------
# control API and CLI


def test_control_api_faults_reset_and_health(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    status, _, health = _http(emulator, "GET", "/_emulator/health")
    assert (status, health["ok"]) == (200, True)

    status, _, faults = _http(emulator, "POST", "/_emulator/faults", {"latency_ms": 5})
    assert (status, faults["latency_ms"], faults["error_rate"]) == (200, 5.0, 0.0)
    status, _, error = _http(emulator, "POST", "/_emulator/faults", {"error_rate": 2})
    assert status == 400 and "error_rate" in error["error"]["message"]
    status, _, error = _http(emulator, "POST", "/_emulator/faults", {"no_such_fault": 1})
    assert status == 400
    assert emulator.faults()["latency_ms"] == 5.0  # rejected updates change nothing

    customer = _customer(client)
    status, _, ledger = _http(emulator, "GET", "/_emulator/ledger")
    assert [(e["method"], e["path"], e["object_id"]) for e in ledger] == [
        ("POST", "/v1/customers", customer.id)
    ]
    status, _, requests = _http(emulator, "GET", "/_emulator/requests")
    assert [(r["path"], r["status"]) for r in requests] == [("/v1/customers", 200)]

    status, _, _ = _http(emulator, "POST", "/_emulator/reset")
    assert status == 200
    assert emulator.faults()["latency_ms"] == 0.0
    assert emulator.ledger() == [] and emulator.requests() == []
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.customers.retrieve(customer.id)


def test_cli_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--error-rate", "2"])
    assert info.value.code == 2
    assert "error_rate must be between 0 and 1" in capsys.readouterr().err


def test_cli_serves_until_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.stripe_emulator", "--port", "0", "--latency-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.strip().rsplit(" ", 1)[-1]
        sdk = stripe.StripeClient(API_KEY, base_addresses={"api": url}, max_network_retries=0)
        assert sdk.v1.customers.create(params={"name": "cli"}).id.startswith("cus_")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
