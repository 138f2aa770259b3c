"""Verify the webhooks billing-ledger sends: one module, the standard library only.

A receiver copies this file (or installs billing-ledger) and checks each request before
trusting it::

    from billing_ledger_webhooks import SignatureError, verify

    try:
        event = verify(raw_body, headers["Billing-Ledger-Signature"], secret)
    except SignatureError:
        return 400  # not from billing-ledger, altered, or too old: drop it
    if already_seen(event["id"]):  # deliveries are at least once: deduplicate by id
        return 200
    handle(event)

The signature header is ``t=<unix seconds>,v1=<hex>``: ``v1`` is the HMAC-SHA256, keyed by
the endpoint's secret, of ``"{t}.{raw body}"`` (the exact bytes received, before any
JSON parsing). ``verify`` accepts any ``v1`` that matches (several during a rotation),
compares in constant time, and refuses a timestamp more than ``tolerance_s`` (300 s) from
now, so a captured request cannot be replayed later.

Exceptions: ``SignatureError`` (Raised when a request's signature does not prove it came
from billing-ledger unaltered and recently).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

__all__ = [
    "EVENT_ID_HEADER",
    "SIGNATURE_HEADER",
    "TOLERANCE_S",
    "SignatureError",
    "sign",
    "signature_header",
    "verify",
]

SIGNATURE_HEADER = "Billing-Ledger-Signature"
EVENT_ID_HEADER = "Billing-Ledger-Event-Id"
TOLERANCE_S = 300


class SignatureError(ValueError):
    """Raised when a request's signature does not prove it came from billing-ledger
    unaltered and recently."""


def sign(payload: bytes, secret: str, timestamp: int) -> str:
    """The hex HMAC-SHA256 of ``"{timestamp}.{payload}"`` keyed by ``secret``."""
    signed = f"{timestamp}.".encode() + payload
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(payload: bytes, secret: str, timestamp: int) -> str:
    """The ``Billing-Ledger-Signature`` header's value: ``t=...,v1=...``."""
    return f"t={timestamp},v1={sign(payload, secret, timestamp)}"


def verify(
    payload: bytes,
    header: str,
    secret: str,
    *,
    tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """The event ``payload`` holds, once ``header`` proves it (SignatureError if not)."""
    timestamp, candidates = _parse(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp {timestamp} is more than {tolerance_s} s from now")
    expected = sign(payload, secret, timestamp)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("no signature matches the payload and the secret")
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise SignatureError(f"the payload is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise SignatureError("the payload is not a JSON object")
    return event


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: {header[:200]!r}")
    return timestamp, candidates
