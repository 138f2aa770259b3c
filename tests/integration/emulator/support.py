"""Helpers of the emulator tests: the SDK client, raw HTTP, objects, and a webhook receiver.

Every test drives the emulator over real HTTP with the real ``stripe`` SDK, which never
retries on its own here (``max_network_retries=0``), so each assertion is about one request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import urlsplit

import stripe
from stripe.params import InvoiceItemCreateParams

from infra.stripe_emulator import StripeEmulator

API_KEY = "sk_test_emulator"


def client_for(emulator: StripeEmulator) -> stripe.StripeClient:
    return stripe.StripeClient(API_KEY, base_addresses={"api": emulator.url}, max_network_retries=0)


def http(
    emulator: StripeEmulator,
    method: str,
    path: str,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """A raw HTTP request (for the control API and for what the SDK cannot send)."""
    parts = urlsplit(emulator.url)
    conn = HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def api(
    emulator: StripeEmulator, method: str, path: str, form: str = "", key: str | None = None
) -> tuple[int, dict[str, str], Any]:
    """A raw, authenticated API request with a form body (and an idempotency key)."""
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    if key is not None:
        headers["Idempotency-Key"] = key
    parts = urlsplit(emulator.url)
    conn = HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request(method, path, body=form, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def new_customer(client: stripe.StripeClient, **metadata: str) -> stripe.Customer:
    return client.v1.customers.create(params={"email": "ops@example.com", "metadata": metadata})


def item_params(customer_id: str, txn_id: str, amount: int = 1250) -> InvoiceItemCreateParams:
    return {
        "customer": customer_id,
        "amount": amount,
        "currency": "usd",
        "description": f"usage {txn_id}",
        "metadata": {"txn_id": txn_id},
    }


def draft(
    client: stripe.StripeClient, customer_id: str, currency: str = "usd", **metadata: str
) -> stripe.Invoice:
    """A draft invoice the way the billing client makes one."""
    return client.v1.invoices.create(
        params={
            "customer": customer_id,
            "currency": currency,
            "auto_advance": False,
            "collection_method": "charge_automatically",
            "pending_invoice_items_behavior": "exclude",
            "metadata": metadata,
        }
    )


def attach(
    client: stripe.StripeClient, invoice: stripe.Invoice, amount: int, **metadata: str
) -> stripe.InvoiceItem:
    customer_id = cast(str, invoice.customer)
    return client.v1.invoice_items.create(
        params={
            "customer": customer_id,
            "invoice": invoice.id,
            "amount": amount,
            "metadata": metadata,
        }
    )


def open_invoice(client: stripe.StripeClient, *amounts: int) -> stripe.Invoice:
    """A finalized (open) invoice of a new customer with one item per amount."""
    invoice = draft(client, new_customer(client).id)
    for amount in amounts:
        attach(client, invoice, amount)
    return client.v1.invoices.finalize_invoice(invoice.id)


def executions(emulator: StripeEmulator, key: str) -> list[dict[str, Any]]:
    return [entry for entry in emulator.ledger() if entry["idempotency_key"] == key]


def header(obj: stripe.StripeObject, name: str) -> str | None:
    assert obj.last_response is not None
    value: str | None = obj.last_response.headers.get(name)
    return value


def err_header(exc: stripe.StripeError, name: str) -> str | None:
    assert exc.headers is not None
    value: str | None = exc.headers.get(name)
    return value


def event_types(emulator: StripeEmulator, object_id: str) -> list[str]:
    """The types of the events about ``object_id``, oldest first."""
    return [e["type"] for e in emulator.events() if e["data"]["object"]["id"] == object_id]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.01)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class Receiver:
    """A webhook receiver: records every POST and answers the next scripted status (200 when
    the script is used up)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.statuses: list[int] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or "0"))
                with receiver._cond:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.received.append(
                        Received(self.path, dict(self.headers), body, time.monotonic())
                    )
                    receiver._cond.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/stripe/webhooks"

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        with self._cond:
            done = self._cond.wait_for(lambda: len(self.received) >= count, timeout=timeout)
            assert done, f"got {len(self.received)} deliveries, expected {count}"
            return list(self.received)

    def types(self) -> list[str]:
        with self._cond:
            return [r.event["type"] for r in self.received]

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
