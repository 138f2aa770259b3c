"""Stripe's v1 idempotency keys: the key store and the claim/replay rules.

This module owns :class:`KeyStore`, the keys seen per API key, and the rules applied when a
POST or DELETE presents an ``Idempotency-Key``:

* a new key is claimed (held "in flight") while the request executes, then saved with the
  response, even an error one; a validation failure is not saved (a retry runs anew);
* the same key with the same method, path and parameters replays the saved response, marked
  ``Idempotent-Replayed: true`` and ``Original-Request: <request id>``;
* the same key with other parameters is a 400 ``idempotency_error``;
* a key still in flight is a 409 ``idempotency_error``;
* a key older than the TTL is forgotten (a reuse is a new request).

The store is not thread-safe: its callers hold the emulator's lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import ApiError, idempotency_in_use, idempotency_mismatch, invalid, should_retry

__all__ = ["MAX_KEY_LEN", "Claim", "Fingerprint", "KeyEntry", "KeyStore", "Scope"]

MAX_KEY_LEN: Final = 255
_SWEEP_EVERY_S: Final = 1.0

Fingerprint = tuple[str, str, tuple[tuple[str, str], ...]]
"""Method, path and the sorted form parameters: what "the same request" means."""
Scope = tuple[str, str]
"""(API key, idempotency key): keys are scoped per API key, as in Stripe."""


@dataclass
class KeyEntry:
    fingerprint: Fingerprint
    created: float  # monotonic
    request_id: str
    in_flight: bool = True
    status: int = 0
    body: bytes = b""

    def replay_headers(self) -> tuple[tuple[str, str], ...]:
        headers = [("Idempotent-Replayed", "true"), ("Original-Request", self.request_id)]
        retry = should_retry(self.status)
        if retry is not None:
            headers.append(("Stripe-Should-Retry", retry))
        return tuple(headers)


@dataclass(frozen=True)
class Claim:
    """What presenting a key decided: execute (``entry``), replay, or refuse (``error``)."""

    outcome: str
    """``claimed``, ``replayed``, ``rejected``, ``idempotency_mismatch``, ``idempotency_in_use``."""
    entry: KeyEntry | None = None
    scope: Scope | None = None
    error: ApiError | None = None


class KeyStore:
    """Idempotency keys per API key, with their saved responses."""

    def __init__(self) -> None:
        self._keys: dict[Scope, KeyEntry] = {}
        self._last_sweep = 0.0

    def clear(self) -> None:
        self._keys.clear()

    def claim(
        self,
        api_key: str,
        key: str,
        fingerprint: Fingerprint,
        request_id: str,
        *,
        now: float,
        ttl: float,
    ) -> Claim:
        """Present ``key``; a ``claimed`` result must be followed by :meth:`finish`."""
        if len(key) > MAX_KEY_LEN:
            error = invalid(f"Idempotency keys can be at most {MAX_KEY_LEN} characters long.")
            return Claim("rejected", error=error)
        self._sweep(now, ttl)
        scope = (api_key, key)
        entry = self._keys.get(scope)
        if entry is not None and not entry.in_flight and now - entry.created >= ttl:
            del self._keys[scope]  # expired: the key is new again
            entry = None
        if entry is None:
            entry = KeyEntry(fingerprint, now, request_id)
            self._keys[scope] = entry
            return Claim("claimed", entry=entry, scope=scope)
        if entry.fingerprint != fingerprint:
            return Claim("idempotency_mismatch", error=idempotency_mismatch(key))
        if entry.in_flight:
            return Claim("idempotency_in_use", error=idempotency_in_use(key))
        return Claim("replayed", entry=entry, scope=scope)

    def finish(
        self, scope: Scope, entry: KeyEntry, status: int, body: bytes, *, saved: bool
    ) -> None:
        """Save the response of a claimed key, or release the key when it is not saved."""
        if saved:
            entry.in_flight, entry.status, entry.body = False, status, body
        elif self._keys.get(scope) is entry:
            del self._keys[scope]

    def in_flight(self, key: str) -> bool:
        """Whether a request presenting ``key`` (under any API key) is executing."""
        return any(scope[1] == key and entry.in_flight for scope, entry in self._keys.items())

    def _sweep(self, now: float, ttl: float) -> None:
        if now - self._last_sweep < _SWEEP_EVERY_S:
            return
        self._last_sweep = now
        for scope in [
            s for s, e in self._keys.items() if not e.in_flight and now - e.created >= ttl
        ]:
            del self._keys[scope]
