"""Everything the emulator holds, behind its one lock.

This module owns :class:`EmulatorState`: the lock (a ``threading.Condition`` over it, so
callers can await conditions such as "this idempotency key is in flight"), the object store,
the idempotency keys, the fault settings, the webhook endpoints and deliveries, and the
logs of executed mutations (the ledger) and of API requests.  Every attribute is read and
written with ``cond`` held, and nothing sleeps or does I/O while holding it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from .errors import JsonObject
from .faults import Faults
from .idempotency import KeyStore
from .store import Store
from .webhooks import WebhookHub

__all__ = ["EmulatorState"]


class EmulatorState:
    """The emulator's state; hold ``cond`` to touch any of it."""

    def __init__(self, initial: Mapping[str, object]) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.started_at = time.monotonic()
        self.faults = Faults(initial)  # validates the start-up settings (ValueError)
        self.webhooks = WebhookHub(self.faults)
        self.store = self._new_store()
        self.keys = KeyStore()
        self.ledger: list[JsonObject] = []
        self.requests: list[JsonObject] = []

    def reset_locked(self) -> None:
        """Forget every object, key, endpoint, delivery and log entry; restore the start-up
        settings."""
        self.store = self._new_store()
        self.keys.clear()
        self.ledger.clear()
        self.requests.clear()
        self.faults.reset()
        self.webhooks.clear()

    def _new_store(self) -> Store:
        store = Store()
        store.on_event = self._queue_webhooks
        store.take_payment_failure = self.faults.take_payment_failure
        return store

    def _queue_webhooks(self, event: JsonObject) -> int:
        return self.webhooks.enqueue_event(event, time.monotonic())
