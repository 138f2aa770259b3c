"""Stripe's objects as the domain reads them: a webhook's envelope (``stripe_event``)
and an invoice (from an API answer or a webhook's ``data.object``) as
``domain.invoice_states.StripeInvoiceView``.

Total: any input gives a value or raises ``ValueError`` with a reason (the webhook
handler answers an unreadable envelope 400, and records a readable event whose
invoice it cannot read as ``unreadable``, with the reason)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson

from domain.invoice_states import StripeInvoiceView

__all__ = ["StripeEvent", "deleted_view", "invoice_view", "stripe_event"]

STATUSES = frozenset({"draft", "open", "paid", "void", "uncollectible"})


@dataclass(frozen=True)
class StripeEvent:
    """A webhook's envelope: Stripe's event id, type, time and ``data.object``."""

    id: str
    type: str
    created: datetime | None
    obj: Mapping[str, Any]

    def metadata_uuid(self, name: str) -> UUID | None:
        """``data.object.metadata[name]`` as a UUID, or None (missing or not a UUID)."""
        metadata = self.obj.get("metadata")
        value = metadata.get(name) if isinstance(metadata, Mapping) else None
        if not isinstance(value, str) or len(value) > 64:
            return None
        try:
            return UUID(value)
        except ValueError:
            return None


MAX_EVENT_ID = 255


def stripe_event(body: bytes) -> StripeEvent:
    """The envelope of a webhook's body (``ValueError`` with the reason if unreadable)."""
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise ValueError("body is not a JSON object")
    event_id, type_ = event.get("id"), event.get("type")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= MAX_EVENT_ID:
        raise ValueError(f"event id {str(event_id)[:80]!r} is not a string of 1 to 255 chars")
    if not isinstance(type_, str) or not 0 < len(type_) <= 100:
        raise ValueError(f"event type {str(type_)[:80]!r} is not a string of 1 to 100 chars")
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        raise ValueError("event has no data.object")
    created = event.get("created")
    try:
        at = _when(created) if type(created) is int else None
    except ValueError:
        at = None
    return StripeEvent(event_id, type_, at, obj)


def invoice_view(obj: Mapping[str, Any], source: str) -> StripeInvoiceView:
    """The invoice ``obj`` as a view; ``source``: "finalize" or the event's id."""
    status = obj.get("status")
    if status not in STATUSES:
        raise ValueError(f"invoice status {status!r} is not one of {sorted(STATUSES)}")
    transitions = obj.get("status_transitions")
    if not isinstance(transitions, Mapping):
        transitions = {}
    moment = (
        {
            "paid": transitions.get("paid_at"),
            "void": transitions.get("voided_at"),
            "uncollectible": transitions.get("marked_uncollectible_at"),
        }.get(status)
        or transitions.get("finalized_at")
        or obj.get("created")
    )
    number = obj.get("number")
    return StripeInvoiceView(
        status=status,
        number=str(number) if number is not None else None,
        total=_int(obj, "total"),
        amount_paid=_int(obj, "amount_paid"),
        attempt_count=_int(obj, "attempt_count"),
        next_payment_attempt=_when(obj.get("next_payment_attempt")),
        at=_when(moment) or datetime.now(UTC),
        source=source,
    )


def deleted_view(source: str) -> StripeInvoiceView:
    """A draft invoice deleted (Stripe keeps nothing of it to read)."""
    return StripeInvoiceView("deleted", None, 0, 0, 0, None, datetime.now(UTC), source)


def _int(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name, 0)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ValueError(f"invoice {name} {value!r} is not a whole amount")
    return value


def _when(value: object) -> datetime | None:
    if value is None:
        return None
    if type(value) is not int:
        raise ValueError(f"timestamp {value!r} is not a whole number of seconds")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"timestamp {value!r} is out of range") from None
