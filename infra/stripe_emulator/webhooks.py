"""Webhook endpoints and the delivery queue (no I/O: :mod:`.webhook_sender` sends).

This module owns the registered endpoints (``we_...``: url, signing secret ``whsec_...``,
the event types they want), Stripe's signature (``Stripe-Signature: t=<unix>,v1=<hex
HMAC-SHA256(secret, "{t}.{body}")>``), and the queue of deliveries with its faults:

* each new event is queued once per endpoint that wants its type (``pending_webhooks``);
* a delivery answered with a non-2xx status or a connection error is retried after
  ``webhook_retry_base_s * 2**(attempt - 1)`` seconds, up to ``webhook_max_attempts``;
* ``webhook_delay_s`` postpones first attempts; ``webhook_duplicate_probability`` and
  ``webhook_duplicate_next`` send an event twice; ``webhook_reorder`` holds an endpoint's
  deliveries until a window is full (or ``webhook_reorder_hold_s`` passed) and releases them
  newest first;
* every attempt is logged (event, endpoint, attempt, HTTP status or error, time);
* a resend (:meth:`WebhookHub.resend`) is one attempt, optionally signed with a given ``t``.

It is not thread-safe: its callers hold the emulator's lock.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from .errors import JsonObject
from .events import type_matches
from .faults import Faults
from .forms import new_id

__all__ = ["Delivery", "Endpoint", "WebhookHub", "sign"]

_ALL: Final = ("*",)


def sign(secret: str, t: int, body: bytes) -> str:
    """The ``Stripe-Signature`` header of ``body`` signed at ``t``, as Stripe computes it."""
    mac = hmac.new(secret.encode("utf-8"), f"{t}.".encode() + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


@dataclass(frozen=True)
class Endpoint:
    id: str
    url: str
    secret: str
    events: tuple[str, ...]
    created: int

    def wants(self, type_: str) -> bool:
        return any(type_matches(pattern, type_) for pattern in self.events)

    def view(self) -> JsonObject:
        return {
            "id": self.id,
            "object": "webhook_endpoint",
            "url": self.url,
            "secret": self.secret,
            "enabled_events": list(self.events),
            "created": self.created,
            "status": "enabled",
        }


@dataclass(order=True)
class Delivery:
    """One (event, endpoint) delivery; its attempts share the id."""

    due: float
    order: int
    id: str = field(compare=False)
    event_id: str = field(compare=False)
    endpoint_id: str = field(compare=False)
    attempt: int = field(default=1, compare=False)
    max_attempts: int = field(default=1, compare=False)
    duplicate: bool = field(default=False, compare=False)
    resend: bool = field(default=False, compare=False)
    t: int | None = field(default=None, compare=False)
    held_at: float = field(default=0.0, compare=False)


class WebhookHub:
    """Endpoints, queued and held deliveries, and the log of attempts."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults
        self.endpoints: dict[str, Endpoint] = {}
        self.log: list[JsonObject] = []
        self._queue: list[Delivery] = []
        self._held: dict[str, list[Delivery]] = {}
        self.in_flight = 0
        self.generation = 0
        self._order = 0

    def clear(self) -> None:
        """Forget endpoints, deliveries and the log (a send in progress is then ignored)."""
        self.endpoints.clear()
        self.log.clear()
        self._queue.clear()
        self._held.clear()
        self.in_flight = 0
        self.generation += 1

    # endpoints ----------------------------------------------------------------------------

    def add_endpoint(self, url: str, secret: str | None, events: Sequence[str] | None) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook url must be http(s)://host[:port]/path, got {url!r}")
        if secret is not None and not secret:
            raise ValueError("webhook secret must not be empty")
        wanted = _ALL if not events else tuple(events)
        if any(not isinstance(e, str) or not e for e in wanted):
            raise ValueError(f"events must be a list of event types, got {events!r}")
        endpoint = Endpoint(
            new_id("we_", 24), url, secret or new_id("whsec_", 32), wanted, int(time.time())
        )
        self.endpoints[endpoint.id] = endpoint
        return endpoint

    def remove_endpoint(self, endpoint_id: str) -> bool:
        return self.endpoints.pop(endpoint_id, None) is not None

    # queueing -----------------------------------------------------------------------------

    def enqueue_event(self, event: JsonObject, now: float) -> int:
        """Queue ``event`` for every endpoint that wants it; return how many endpoints."""
        settings = self._faults.settings
        count = 0
        for endpoint in self.endpoints.values():
            if not endpoint.wants(str(event["type"])):
                continue
            count += 1
            copies = 2 if self._faults.take_duplicate() else 1
            for copy in range(copies):
                delivery = self._new(
                    event["id"], endpoint.id, now + settings.webhook_delay_s, duplicate=copy > 0
                )
                delivery.max_attempts = settings.webhook_max_attempts
                self._hold_or_push(delivery, now)
        return count

    def resend(self, event_id: str, endpoint_ids: Sequence[str], now: float, t: int | None) -> int:
        """Send ``event_id`` once more to each endpoint (one attempt, no retries)."""
        for endpoint_id in endpoint_ids:
            delivery = self._new(event_id, endpoint_id, now, resend=True)
            delivery.t = t
            heapq.heappush(self._queue, delivery)
        return len(endpoint_ids)

    def _new(
        self,
        event_id: str,
        endpoint_id: str,
        due: float,
        *,
        duplicate: bool = False,
        resend: bool = False,
    ) -> Delivery:
        self._order += 1
        return Delivery(
            due,
            self._order,
            new_id("whdel_", 20),
            event_id,
            endpoint_id,
            duplicate=duplicate,
            resend=resend,
        )

    def _hold_or_push(self, delivery: Delivery, now: float) -> None:
        window = self._faults.settings.webhook_reorder
        if window < 2:
            heapq.heappush(self._queue, delivery)
            return
        delivery.held_at = now
        held = self._held.setdefault(delivery.endpoint_id, [])
        held.append(delivery)
        if len(held) >= window:
            self._release(delivery.endpoint_id, now)

    def _release(self, endpoint_id: str, now: float) -> None:
        """Queue an endpoint's held deliveries newest first."""
        for delivery in reversed(self._held.pop(endpoint_id, [])):
            self._order += 1
            delivery.due = max(delivery.due, now)
            delivery.order = self._order
            heapq.heappush(self._queue, delivery)

    def release_expired(self, now: float) -> None:
        """Release held windows that are no longer wanted or have waited long enough."""
        settings = self._faults.settings
        for endpoint_id, held in list(self._held.items()):
            oldest = held[0].held_at
            if settings.webhook_reorder < 2 or now - oldest >= settings.webhook_reorder_hold_s:
                self._release(endpoint_id, now)

    # the sender's side --------------------------------------------------------------------

    def pop_due(self, now: float) -> Delivery | None:
        if self._queue and self._queue[0].due <= now:
            return heapq.heappop(self._queue)
        return None

    def wait_seconds(self, now: float) -> float | None:
        """How long the sender may sleep before something is due (None: until notified)."""
        times = [d.due for d in self._queue[:1]]
        hold = self._faults.settings.webhook_reorder_hold_s
        times += [held[0].held_at + hold for held in self._held.values() if held]
        return None if not times else max(min(times) - now, 0.0)

    def record(
        self,
        delivery: Delivery,
        endpoint: Endpoint,
        event_type: str,
        outcome: tuple[int | None, str | None, int, float],
        now: float,
    ) -> bool:
        """Log one attempt and schedule its retry; True if it was delivered (2xx)."""
        status, error, t, duration_s = outcome
        ok = status is not None and 200 <= status < 300
        retry_in: float | None = None
        if not ok and delivery.attempt < delivery.max_attempts:
            retry_in = self._faults.settings.webhook_retry_base_s * 2 ** (delivery.attempt - 1)
        self.log.append(
            {
                "delivery_id": delivery.id,
                "event_id": delivery.event_id,
                "event_type": event_type,
                "endpoint_id": endpoint.id,
                "url": endpoint.url,
                "attempt": delivery.attempt,
                "status": status,
                "error": error,
                "ok": ok,
                "duplicate": delivery.duplicate,
                "resend": delivery.resend,
                "signature_t": t,
                "at": time.time(),
                "duration_ms": round(duration_s * 1000, 3),
                "retry_in_s": retry_in,
                "gave_up": not ok and retry_in is None,
            }
        )
        if retry_in is not None:
            delivery.attempt += 1
            delivery.due = now + retry_in
            heapq.heappush(self._queue, delivery)
        return ok

    def idle(self) -> bool:
        """Nothing queued, held or being sent."""
        return not self._queue and not any(self._held.values()) and self.in_flight == 0

    def pending(self) -> int:
        return len(self._queue) + sum(len(h) for h in self._held.values()) + self.in_flight
