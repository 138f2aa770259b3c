"""The :class:`StripeEmulator` facade: lifecycle, settings and the control API in Python.

This module owns the emulator object tests and tools use: it binds and serves
(:meth:`StripeEmulator.start`/:meth:`~StripeEmulator.stop`, or ``with``; the webhook sender
thread lives as long as the server), exposes the settings (:meth:`~StripeEmulator.set_faults`),
the views a test asserts on (ledger, requests, invoice items, invoices, credit notes, events,
webhook deliveries), the test helpers (pay or fail an invoice's payment, decline a customer's
card, register webhook endpoints, await or resend deliveries), and hands HTTP requests to the
API pipeline and the control API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from .api import Reply, handle_api
from .control import handle_control
from .errors import JsonObject
from .events import type_matches
from .invoice_actions import decline, settle
from .invoices import render_invoice
from .server import HttpServer
from .settings import DEFAULT_KEY_TTL_S
from .state import EmulatorState
from .store import Call
from .webhook_sender import WebhookSender

__all__ = ["StripeEmulator"]


def _copy(value: object) -> Any:
    return json.loads(json.dumps(value))


def _helper_call(invoice_id: str) -> Call:
    """The call of a control helper: no API request caused it (events say ``request.id``
    None, as Stripe's automatic changes do)."""
    return Call({}, invoice_id, int(time.time()))


class StripeEmulator:
    """The emulator, a context manager that serves on ``url`` while entered.

    ``with StripeEmulator() as emu: StripeClient(key, base_addresses={"api": emu.url})``.

    All state is guarded by one lock (``threading.Condition`` over it, so tests can await
    conditions such as "this idempotency key is in flight").
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        key_ttl_s: float = DEFAULT_KEY_TTL_S,
        latency_ms: float = 0.0,
        error_rate: float = 0.0,
        outage: bool = False,
        outage_mode: str = "503",
        outage_seconds: float | None = None,
        rate_limit_per_s: int | None = None,
        endpoint_rate_limit_per_s: int | None = None,
        drop_response_after_execute: int = 0,
        drop_response_probability: float = 0.0,
        late_execute_next: int = 0,
        late_execute_probability: float = 0.0,
        late_execute_s: float = 2.0,
        payment_failures: int = 0,
        webhook_retry_base_s: float = 1.0,
        webhook_max_attempts: int = 8,
        webhook_timeout_s: float = 10.0,
        webhook_delay_s: float = 0.0,
        webhook_duplicate_probability: float = 0.0,
        webhook_duplicate_next: int = 0,
        webhook_reorder: int = 0,
        webhook_reorder_hold_s: float = 2.0,
        seed: int | None = None,
        log_requests: bool = False,
    ) -> None:
        self._host = host
        self._port = port
        self.log_requests = log_requests
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None
        initial: dict[str, object] = {
            "key_ttl_s": key_ttl_s,
            "latency_ms": latency_ms,
            "error_rate": error_rate,
            "outage": outage or outage_seconds is not None,  # a window implies an outage
            "outage_mode": outage_mode,
            "outage_seconds": outage_seconds,
            "rate_limit_per_s": rate_limit_per_s,
            "endpoint_rate_limit_per_s": endpoint_rate_limit_per_s,
            "drop_response_after_execute": drop_response_after_execute,
            "drop_response_probability": drop_response_probability,
            "late_execute_next": late_execute_next,
            "late_execute_probability": late_execute_probability,
            "late_execute_s": late_execute_s,
            "payment_failures": payment_failures,
            "webhook_retry_base_s": webhook_retry_base_s,
            "webhook_max_attempts": webhook_max_attempts,
            "webhook_timeout_s": webhook_timeout_s,
            "webhook_delay_s": webhook_delay_s,
            "webhook_duplicate_probability": webhook_duplicate_probability,
            "webhook_duplicate_next": webhook_duplicate_next,
            "webhook_reorder": webhook_reorder,
            "webhook_reorder_hold_s": webhook_reorder_hold_s,
            "seed": seed,
        }
        self._state = EmulatorState(initial)  # validates the arguments (ValueError)
        self._sender = WebhookSender(self._state)

    # lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and serve in a daemon thread, and start the webhook sender.  Idempotent."""
        if self._server is None:
            self._server = HttpServer(
                (self._host, self._port),
                self._handle_api,
                self._handle_control,
                lambda: self.log_requests,
            )
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"stripe-emulator:{self.port}",
                daemon=True,
            )
            self._thread.start()
            self._sender.start(name=f"stripe-emulator-webhooks:{self.port}")
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket, stop the webhook sender.  Idempotent."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        self._sender.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the requested one until :meth:`start`)."""
        if self._server is None:
            return self._port
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port``; only valid once started."""
        if self._server is None:
            raise RuntimeError("StripeEmulator is not started")
        return f"http://{self._host}:{self.port}"

    # settings -----------------------------------------------------------------------------

    def set_faults(self, **settings: object) -> dict[str, Any]:
        """Change any :class:`EmulatorSettings` field (partial update); return all settings."""
        with self._state.cond:
            self._state.faults.update(settings)
            self._state.cond.notify_all()
            return self._state.faults.view(time.monotonic())

    def faults(self) -> dict[str, Any]:
        """The current settings, with ``outage`` reflecting whether an outage is on right now."""
        with self._state.cond:
            return self._state.faults.view(time.monotonic())

    def reset(self) -> None:
        """Forget all objects, events, keys, webhook endpoints and deliveries, ledger and
        request log; restore the start-up settings."""
        with self._state.cond:
            self._state.reset_locked()
            self._state.cond.notify_all()

    # views --------------------------------------------------------------------------------

    def ledger(self) -> list[dict[str, Any]]:
        """Every executed mutation, oldest first: request id, method, path, key, object id,
        params and time."""
        with self._state.cond:
            return _copy(self._state.ledger)  # type: ignore[no-any-return]

    def requests(self) -> list[dict[str, Any]]:
        """Every API request received, oldest first, with the status it got (None if none)."""
        with self._state.cond:
            return _copy(self._state.requests)  # type: ignore[no-any-return]

    def invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """All invoice items ever created (live and deleted), each with ``deleted``."""
        with self._state.cond:
            return self._invoice_items_locked(txn_id, live_only=False)

    def live_invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """Live (not deleted) invoice items, optionally only those with ``metadata.txn_id``."""
        with self._state.cond:
            return self._invoice_items_locked(txn_id, live_only=True)

    def health(self) -> dict[str, Any]:
        with self._state.cond:
            return {
                "ok": True,
                "uptime_s": round(time.monotonic() - self._state.started_at, 3),
                "faults": self._state.faults.view(time.monotonic()),
            }

    def wait_for_in_flight(self, idempotency_key: str, timeout: float = 5.0) -> bool:
        """Block until a request holding ``idempotency_key`` is executing; False on timeout."""
        with self._state.cond:
            return self._state.cond.wait_for(
                lambda: self._state.keys.in_flight(idempotency_key), timeout=timeout
            )

    def invoices(self, customer: str | None = None) -> list[dict[str, Any]]:
        """Every invoice as the API renders it, oldest first, optionally of one customer."""
        with self._state.cond:
            store = self._state.store
            return [
                _copy(render_invoice(store, invoice_id))
                for invoice_id, record in store.invoices.items()
                if customer is None or record.obj["customer"] == customer
            ]

    def credit_notes(self, invoice: str | None = None) -> list[dict[str, Any]]:
        """Every credit note, oldest first, optionally of one invoice."""
        with self._state.cond:
            notes = self._state.store.credit_notes.values()
            return [_copy(r.obj) for r in notes if invoice is None or r.obj["invoice"] == invoice]

    def events(self, event_type: str | None = None) -> list[dict[str, Any]]:
        """Every event, oldest first, optionally of one type (``invoice.*`` wildcards too)."""
        with self._state.cond:
            events = self._state.store.events.values()
            return [
                _copy(r.obj)
                for r in events
                if event_type is None or type_matches(event_type, r.obj["type"])
            ]

    # test helpers -------------------------------------------------------------------------

    def pay_invoice(self, invoice_id: str) -> dict[str, Any]:
        """The customer paid an open or uncollectible invoice: it becomes ``paid`` (whatever
        the payment faults), with ``invoice.paid`` and ``invoice.payment_succeeded``.

        LookupError for an unknown invoice, ValueError for one in another status."""
        with self._state.cond:
            invoice = settle(self._state.store, invoice_id, _helper_call(invoice_id))
            self._state.cond.notify_all()
            return _copy(invoice)  # type: ignore[no-any-return]

    def fail_payment(self, invoice_id: str) -> dict[str, Any]:
        """A payment attempt on an open or uncollectible invoice failed: ``attempt_count``
        += 1, ``next_payment_attempt`` set, ``invoice.payment_failed``; it stays as it was."""
        with self._state.cond:
            invoice = decline(self._state.store, invoice_id, _helper_call(invoice_id))
            self._state.cond.notify_all()
            return _copy(invoice)  # type: ignore[no-any-return]

    def set_card_declined(self, customer_id: str, declined: bool = True) -> None:
        """Make every payment attempt of ``customer_id`` fail with 402 ``card_declined`` (or
        succeed again); LookupError for an unknown customer."""
        with self._state.cond:
            store = self._state.store
            if customer_id not in store.customers:
                raise LookupError(f"no such customer: {customer_id!r}")
            if declined:
                store.declined_customers.add(customer_id)
            else:
                store.declined_customers.discard(customer_id)

    def add_webhook_endpoint(
        self, url: str, secret: str | None = None, events: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Deliver events (all, or the types in ``events``; ``invoice.*`` works) to ``url``,
        signed with ``secret`` (one like ``whsec_...`` is made when None).  Returns the
        endpoint: ``id``, ``url``, ``secret``, ``enabled_events``."""
        with self._state.cond:
            endpoint = self._state.webhooks.add_endpoint(url, secret, events)
            return endpoint.view()

    def remove_webhook_endpoint(self, endpoint_id: str) -> bool:
        """Stop delivering to an endpoint (its queued deliveries are dropped)."""
        with self._state.cond:
            return self._state.webhooks.remove_endpoint(endpoint_id)

    def webhook_endpoints(self) -> list[dict[str, Any]]:
        with self._state.cond:
            return [e.view() for e in self._state.webhooks.endpoints.values()]

    def webhook_deliveries(self, event_id: str | None = None) -> list[dict[str, Any]]:
        """Every delivery attempt, oldest first: ``delivery_id``, ``event_id``,
        ``event_type``, ``endpoint_id``, ``url``, ``attempt``, ``status`` (HTTP status or
        None), ``error``, ``ok``, ``duplicate``, ``resend``, ``signature_t``, ``at``,
        ``duration_ms``, ``retry_in_s``, ``gave_up``."""
        with self._state.cond:
            log = self._state.webhooks.log
            return [_copy(d) for d in log if event_id is None or d["event_id"] == event_id]

    def wait_for_webhooks(self, timeout: float = 10.0) -> bool:
        """Block until no delivery is queued, held, retrying or being sent; False on timeout."""
        with self._state.cond:
            return self._state.cond.wait_for(self._state.webhooks.idle, timeout=timeout)

    def resend_event(
        self, event_id: str, *, endpoint_id: str | None = None, t: int | None = None
    ) -> int:
        """Send an event again (one attempt, no retries) to ``endpoint_id`` or to every
        endpoint that wants it, signed at ``t`` (Unix seconds; now when None, so an old ``t``
        makes an expired signature).  Returns how many deliveries were queued."""
        with self._state.cond:
            state = self._state
            record = state.store.events.get(event_id)
            if record is None:
                raise LookupError(f"no such event: {event_id!r}")
            endpoints = state.webhooks.endpoints
            if endpoint_id is not None and endpoint_id not in endpoints:
                raise LookupError(f"no such webhook endpoint: {endpoint_id!r}")
            targets = (
                [endpoint_id]
                if endpoint_id is not None
                else [e.id for e in endpoints.values() if e.wants(record.obj["type"])]
            )
            queued = state.webhooks.resend(event_id, targets, time.monotonic(), t)
            state.cond.notify_all()
            return queued

    # internals ----------------------------------------------------------------------------

    def _invoice_items_locked(self, txn_id: str | None, *, live_only: bool) -> list[JsonObject]:
        out: list[JsonObject] = []
        for record in self._state.store.items.values():
            if live_only and record.deleted:
                continue
            if txn_id is not None and record.obj["metadata"].get("txn_id") != txn_id:
                continue
            out.append(
                _copy({**record.obj, "deleted": record.deleted, "deleted_at": record.deleted_at})
            )
        return out

    def _handle_api(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        *,
        authorization: str | None,
        idempotency_key: str | None,
        stripe_version: str | None,
    ) -> Reply | None:
        return handle_api(
            self._state,
            method,
            path,
            query,
            body,
            authorization=authorization,
            idempotency_key=idempotency_key,
            stripe_version=stripe_version,
        )

    def _handle_control(self, method: str, path: str, query: str, body: bytes) -> Reply:
        return handle_control(self, method, path, query, body)
