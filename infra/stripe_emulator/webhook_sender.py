"""The webhook sender: a background thread that POSTs queued deliveries to their endpoints.

This module owns the delivery thread (started by ``StripeEmulator.start``, stopped by
``stop``) and the HTTP POST itself: the event's JSON with ``Content-Type: application/json;
charset=utf-8`` and ``Stripe-Signature``.  It takes the emulator's lock only to pick the next
due delivery and to record its outcome; it never holds it while connecting or waiting for a
receiver.  A reset while a delivery is being sent makes its outcome ignored.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from .state import EmulatorState
from .webhooks import Delivery, Endpoint, sign

__all__ = ["WebhookSender", "post"]


def post(url: str, body: bytes, signature: str, timeout: float) -> tuple[int | None, str | None]:
    """POST ``body`` to ``url``; the HTTP status, or None and the error."""
    parts = urlsplit(url)
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Stripe-Signature": signature,
        "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        "Accept": "*/*; q=0.5, application/xml",
        "Cache-Control": "no-cache",
    }
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, None
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


class WebhookSender:
    """Sends due deliveries one at a time, in due order, from a daemon thread."""

    def __init__(self, state: EmulatorState) -> None:
        self._state = state
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, name: str) -> None:
        """Start the thread.  Idempotent."""
        if self._thread is not None:
            return
        self._stop = threading.Event()  # its own: a late old thread still sees its stop
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name=name)
        self._thread.daemon = True
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the thread (a delivery in progress finishes first).  Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with self._state.cond:
            self._stop.set()
            self._state.cond.notify_all()
        thread.join(timeout=timeout)

    def _next(
        self, stop: threading.Event
    ) -> tuple[Delivery, Endpoint, str, bytes, int, float] | None:
        """Wait (lock held) for a due delivery; None when stopping."""
        state = self._state
        while True:
            if stop.is_set():
                return None
            hub = state.webhooks
            now = time.monotonic()
            hub.release_expired(now)
            delivery = hub.pop_due(now)
            if delivery is None:
                state.cond.wait(timeout=hub.wait_seconds(now))
                continue
            endpoint = hub.endpoints.get(delivery.endpoint_id)
            record = state.store.events.get(delivery.event_id)
            if endpoint is None or record is None:
                continue  # the endpoint was removed: nothing to send
            hub.in_flight += 1
            body = json.dumps(record.obj, indent=2).encode("utf-8")
            timeout = state.faults.settings.webhook_timeout_s
            return delivery, endpoint, str(record.obj["type"]), body, hub.generation, timeout

    def _run(self, stop: threading.Event) -> None:
        state = self._state
        while True:
            with state.cond:
                job = self._next(stop)
            if job is None:
                return
            delivery, endpoint, event_type, body, generation, timeout = job
            t = delivery.t if delivery.t is not None else int(time.time())
            started = time.monotonic()
            status, error = post(endpoint.url, body, sign(endpoint.secret, t, body), timeout)
            duration = time.monotonic() - started
            with state.cond:
                hub = state.webhooks
                if hub.generation == generation:
                    hub.in_flight -= 1
                    outcome = (status, error, t, duration)
                    ok = hub.record(delivery, endpoint, event_type, outcome, time.monotonic())
                    record = state.store.events.get(delivery.event_id)
                    if ok and record is not None and not (delivery.duplicate or delivery.resend):
                        record.obj["pending_webhooks"] = max(0, record.obj["pending_webhooks"] - 1)
                state.cond.notify_all()
