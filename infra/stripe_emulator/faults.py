"""Fault injection: the live settings and the decisions taken from them.

This module owns :class:`Faults`: the current :class:`~.settings.EmulatorSettings` (with the
start-up values to restore on reset), the outage window, the seeded random source, the
sliding one-second windows of the rate limiters (global and per endpoint), and the counters
that settings such as ``drop_response_after_execute``, ``payment_failures`` and
``webhook_duplicate_next`` count down.

It is not thread-safe: its callers hold the emulator's lock.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any, Final

from .settings import EmulatorSettings, coerce_setting, flatten_outage

__all__ = ["Faults"]

AMOUNT_SETTING_ENDPOINTS: Final = frozenset(
    {
        "POST /v1/invoiceitems/{id}",
        "POST /v1/invoices/{id}/update_lines",
        "POST /v1/invoices/{id}/add_lines",
    }
)
"""The requests that set an amount on a draft: the ones ``late_execute_*`` holds."""


class Faults:
    """The settings in force and every fault decision derived from them."""

    def __init__(self, initial: Mapping[str, object]) -> None:
        self._initial = dict(initial)
        self.settings = EmulatorSettings()
        self._outage_until: float | None = None
        self._rng = random.Random()
        self._admitted: deque[float] = deque()
        self._per_endpoint: dict[str, deque[float]] = {}
        self.reset()  # validates the start-up values (ValueError)

    # settings -------------------------------------------------------------------------------

    def reset(self) -> None:
        """Restore the start-up settings and forget every window and counter."""
        self.settings = EmulatorSettings()
        self._outage_until = None
        self._admitted.clear()
        self._per_endpoint.clear()
        self.update(self._initial)
        self._rng = random.Random(self.settings.seed)

    def update(self, updates: Mapping[str, object]) -> None:
        """Apply a partial update; nothing changes if any value is invalid (ValueError)."""
        flat = flatten_outage(updates)
        changes = {name: coerce_setting(name, value) for name, value in flat.items()}
        new = replace(self.settings, **changes)  # type: ignore[arg-type]
        if changes.get("outage") is False:
            new = replace(new, outage=False, outage_seconds=None)
            self._outage_until = None
        elif (seconds := new.outage_seconds) is not None and "outage_seconds" in changes:
            new = replace(new, outage=True)
            self._outage_until = time.monotonic() + seconds  # a window
        elif changes.get("outage") is True or "outage_seconds" in changes:
            new = replace(new, outage_seconds=None)
            self._outage_until = None  # on (or left as it was) until switched off
        self.settings = new
        if "seed" in changes:
            self._rng = random.Random(new.seed)

    def view(self, now: float) -> dict[str, Any]:
        """The settings, with ``outage`` saying whether an outage is on right now."""
        active = self.outage_active(now)
        view = asdict(self.settings)
        view["outage"] = active
        view["outage_remaining_s"] = (
            round(self._outage_until - now, 3) if active and self._outage_until else None
        )
        return view

    # decisions ------------------------------------------------------------------------------

    def outage_active(self, now: float) -> bool:
        """Whether an outage is on; an expired window switches itself off here."""
        if not self.settings.outage:
            return False
        if self._outage_until is not None and now >= self._outage_until:
            self.settings = replace(self.settings, outage=False, outage_seconds=None)
            self._outage_until = None
            return False
        return True

    def rate_limited(self, now: float, endpoint: str) -> str | None:
        """Which limit refuses this request (``"global"`` or ``"endpoint"``), or None.

        ``endpoint`` is ``METHOD /path/{template}``.  An admitted request is counted in the
        global window and in its endpoint's (a refused one in neither), so endpoint calls
        also count against the global limit, as in Stripe.
        """
        settings = self.settings
        window = self._admitted
        _slide(window, now)
        if settings.rate_limit_per_s is not None and len(window) >= settings.rate_limit_per_s:
            return "global"
        per_endpoint = settings.endpoint_rate_limit_per_s
        mine = self._per_endpoint.get(endpoint)
        if mine is not None:
            _slide(mine, now)
        if per_endpoint is not None and mine is not None and len(mine) >= per_endpoint:
            return "endpoint"
        window.append(now)
        if per_endpoint is not None:
            self._per_endpoint.setdefault(endpoint, deque()).append(now)
        for name in [name for name, w in self._per_endpoint.items() if not w]:
            del self._per_endpoint[name]
        return None

    def inject_error(self) -> bool:
        rate = self.settings.error_rate
        return rate > 0 and self._rng.random() < rate

    def drop_next(self) -> bool:
        """Whether to drop the response of the POST/DELETE that just executed."""
        settings = self.settings
        if settings.drop_response_after_execute > 0:
            self.settings = replace(
                settings, drop_response_after_execute=settings.drop_response_after_execute - 1
            )
            return True
        probability = settings.drop_response_probability
        return probability > 0 and self._rng.random() < probability

    def execute_late(self, endpoint: str) -> float | None:
        """After how many seconds to execute this request unanswered, or None (now).
        Only the requests that set an amount on a draft are held: an invoice item's
        update and a draft's bulk update or creation of its lines."""
        if endpoint not in AMOUNT_SETTING_ENDPOINTS:
            return None
        settings = self.settings
        if settings.late_execute_next > 0:
            self.settings = replace(settings, late_execute_next=settings.late_execute_next - 1)
            return settings.late_execute_s
        probability = settings.late_execute_probability
        if probability > 0 and self._rng.random() < probability:
            return settings.late_execute_s
        return None

    def take_payment_failure(self) -> bool:
        """Whether this payment attempt is declined by ``payment_failures`` (counted down)."""
        if self.settings.payment_failures > 0:
            self.settings = replace(
                self.settings, payment_failures=self.settings.payment_failures - 1
            )
            return True
        return False

    def take_duplicate(self) -> bool:
        """Whether this new (event, endpoint) delivery is sent twice."""
        settings = self.settings
        if settings.webhook_duplicate_next > 0:
            self.settings = replace(
                settings, webhook_duplicate_next=settings.webhook_duplicate_next - 1
            )
            return True
        probability = settings.webhook_duplicate_probability
        return probability > 0 and self._rng.random() < probability


def _slide(window: deque[float], now: float) -> None:
    while window and now - window[0] >= 1.0:
        window.popleft()
