"""The ``billing.events`` message: what the relay publishes and its consumers read.

One JSON object per Kafka message, keyed by customer id::

    {"notification_id": 42, "originator_id": "285ad872-9dad-5d87-9f2b-3fbdc040090b",
     "originator_version": 2, "topic": "domain.transaction:BillingTransaction.Reserved",
     "event": "Reserved"}

``decode_event`` is total: for any bytes it returns an ``EventMessage`` or raises
``MalformedEvent`` with a one-line reason, nothing else. Anyone who can produce to the
topic can put anything on it, and a consumer that stops on one message stops charging
for every customer behind it on that partition. What each bad message gets:

==========================================  ==========================================
message                                     reason (code)
==========================================  ==========================================
no value                                    ``empty message (no value)`` (``empty``)
over ``MAX_EVENT_BYTES``                    ``message of N bytes exceeds ...``
                                            (``oversized``)
not UTF-8 or not JSON, a number that is     ``not valid JSON: ...`` (``not_json``)
not a short integer, nested too deeply
not an object (``[]``, ``"x"``)             ``expected a JSON object, got list``
                                            (``not_object``)
a field missing                             ``originator_id: missing`` (``invalid``)
a field of the wrong type                   ``originator_version: expected an integer,
                                            got str`` (``invalid``)
an originator id that is not a UUID         ``originator_id: not a UUID: ...``
                                            (``invalid``)
an event the ledger does not have           ``unknown event ...`` (``unknown_event``)
==========================================  ==========================================

The process manager sets such a message aside (``billing.dead_letters``, a metric, a
log line with its partition and offset) and moves on; see
``adapters.charging.process_manager``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.domain import DomainEvent

__all__ = [
    "EVENT_REASON_CODES",
    "MAX_EVENT_BYTES",
    "EventMessage",
    "MalformedEvent",
    "decode_event",
    "event_error_code",
    "known_event_topics",
]

MAX_EVENT_BYTES = 64 * 1024  # a real message is about 200 bytes
_MAX_INT_CHARS = 20  # a bigint has at most 19 digits and a sign


class MalformedEvent(ValueError):
    """Raised when a ``billing.events`` message cannot be read; the message is the reason."""


@dataclass(frozen=True)
class EventMessage:
    """One stored event, as published on ``billing.events``."""

    notification_id: int
    originator_id: UUID
    originator_version: int
    topic: str
    event: str

    def to_json(self) -> bytes:
        """The wire form (``decode_event`` reads it back)."""
        return json.dumps(
            {
                "notification_id": self.notification_id,
                "originator_id": str(self.originator_id),
                "originator_version": self.originator_version,
                "topic": self.topic,
                "event": self.event,
            }
        ).encode()


def decode_event(value: bytes | None) -> EventMessage:
    """Read one message; raise ``MalformedEvent`` with a one-line reason, nothing else."""
    if value is None:
        raise MalformedEvent("empty message (no value)")
    if len(value) > MAX_EVENT_BYTES:
        raise MalformedEvent(
            f"message of {len(value)} bytes exceeds the {MAX_EVENT_BYTES}-byte limit"
        )
    body = _parse(value)
    if not isinstance(body, dict):
        raise MalformedEvent(f"expected a JSON object, got {type(body).__name__}")
    message = EventMessage(
        notification_id=_int(body, "notification_id"),
        originator_id=_uuid(body, "originator_id"),
        originator_version=_int(body, "originator_version"),
        topic=_str(body, "topic"),
        event=_str(body, "event"),
    )
    if message.topic not in known_event_topics() and message.topic not in _refresh_known():
        raise MalformedEvent(f"unknown event {_shown(message.topic)}")
    if message.topic.rsplit(".", 1)[-1] != message.event:
        raise MalformedEvent(
            f"unknown event {_shown(message.event)} (its topic says {_shown(message.topic)})"
        )
    return message


def event_error_code(reason: str) -> str:
    """A set-aside message's reason as a short code for logs and metrics."""
    codes = EVENT_REASON_CODES
    return next((code for prefix, code in codes if reason.startswith(prefix)), "invalid")


EVENT_REASON_CODES = (
    ("empty message", "empty"),
    ("message of", "oversized"),
    ("not valid JSON", "not_json"),
    ("expected a JSON object", "not_object"),
    ("unknown event", "unknown_event"),
    ("unknown transaction", "unknown_transaction"),
    ("internal: ", "internal"),
)

_known: frozenset[str] = frozenset()


def known_event_topics() -> frozenset[str]:
    """The topic of every event class of the domain (``domain.*`` modules), so an
    aggregate added later is known without a list to keep in step here."""
    return _known or _refresh_known()


def _refresh_known() -> frozenset[str]:
    """Walk the event classes again (a domain module may have been imported since)."""
    global _known  # noqa: PLW0603 (a cache of what the imported classes say)
    _known = frozenset(
        f"{cls.__module__}:{cls.__qualname__}"
        for cls in _subclasses(DomainEvent)
        if cls.__module__.startswith("domain.")
    )
    return _known


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _parse(value: bytes) -> object:
    try:
        return json.loads(value, parse_int=_short_int, parse_float=_no_float,
                          parse_constant=_no_float)  # fmt: skip
    except MalformedEvent:
        raise
    except RecursionError:
        raise MalformedEvent("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedEvent(f"not valid JSON: {_one_line(str(exc))}") from None


def _short_int(text: str) -> int:
    if len(text) > _MAX_INT_CHARS:
        raise MalformedEvent(f"not valid JSON: an integer of {len(text)} characters")
    return int(text)


def _no_float(text: str) -> Any:
    raise MalformedEvent(f"not valid JSON: {_shown(text)} is not an integer")


def _field(body: dict[str, Any], name: str) -> Any:
    if name not in body or body[name] is None:
        raise MalformedEvent(f"{name}: missing")
    return body[name]


def _int(body: dict[str, Any], name: str) -> int:
    value = _field(body, name)
    if type(value) is not int:  # bool is an int subclass, and not a number here
        raise MalformedEvent(f"{name}: expected an integer, got {type(value).__name__}")
    return value


def _str(body: dict[str, Any], name: str) -> str:
    value = _field(body, name)
    if not isinstance(value, str):
        raise MalformedEvent(f"{name}: expected a string, got {type(value).__name__}")
    return value


def _uuid(body: dict[str, Any], name: str) -> UUID:
    text = _str(body, name)
    try:
        return UUID(text)
    except ValueError:
        raise MalformedEvent(f"{name}: not a UUID: {_shown(text)}") from None


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a reason: escaped (repr), so one line of printable ASCII."""
    shown = ascii(text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _one_line(text: str) -> str:
    return " ".join(text.replace("\x00", " ").split())
