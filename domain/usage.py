"""The usage record: what producers send, and how raw bytes become one or a reason.

Wire format (one JSON object per Kafka message, key = customer id)::

    {"usage_id": "req-8812", "customer_id": "acme", "meter": "gpt-4o.input_tokens",
     "quantity": 1520, "occurred_at": "2026-12-02T10:15:00Z", "currency": "USD"}

``currency`` is optional; when given it must equal the meter's price currency.
Numbers are parsed as ``Decimal`` straight from the JSON text, never as floats.

``decode_usage`` is total: for any bytes it returns a record or raises ``InvalidUsage``
with a one-line reason, and nothing else, because one record a worker cannot survive
would stop billing for everyone behind it. What each bad input gets:

=========================================  ============================================
input                                      reason (its prefix is the log's error code)
=========================================  ============================================
no value (a tombstone)                     ``empty message (no value)``
more than ``max_bytes`` bytes              ``payload of N bytes exceeds the M-byte limit``
not UTF-8, not JSON, nested deeper than    ``not valid JSON: ...``
``MAX_NESTING`` (500) levels
a JSON number of more than                 ``number too long: ...``
``MAX_NUMBER_CHARS`` characters, in any
field (also one nobody reads)
a JSON number whose exponent is beyond     ``number out of range: ...``
``MAX_EXPONENT`` either way, in any field
JSON that is not an object                 ``expected a JSON object, got list``
a field missing or failing its rule        ``quantity: input should be ...`` (each field,
                                           ``; ``-separated)
an unknown currency code                   ``unknown currency 'XYZ'``
=========================================  ============================================

**When the usage occurred** is bounded too, against the ledger's clock when the record
is read (``UsageWindow``): at most ``DEFAULT_MAX_AGE`` (400 days: a year of re-sends
and a monthly period) in the past, reason ``occurred_at too old: ...``, and at most
``DEFAULT_MAX_AHEAD`` (1 hour: producers' clock skew) in the future, reason
``occurred_at too far ahead: ...``. Usage older than its period is still owed and is
billed late (``domain.metering``); the window only refuses moments no producer means
(year 9999, year 1), which no billing period can hold. Both bounds are settings; a
letter set aside by them is re-driven after raising the bound.

Numbers are bounded *before* they are converted: Python's ``int`` refuses literals of
more than 4,300 digits with a ``ValueError`` and ``Decimal`` refuses huge exponents
with ``InvalidOperation``, neither of which is a JSON error. Pricing adds
``unknown meter ...`` and ``currency ... does not match ...`` (``domain.pricing``,
``domain.transaction``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from domain.errors import InvalidUsage
from domain.money import check_currency

__all__ = [
    "CUSTOMER_ID_MAX_LENGTH",
    "CUSTOMER_ID_PATTERN",
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_AHEAD",
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_EXPONENT",
    "MAX_NESTING",
    "MAX_NUMBER_CHARS",
    "UsageRecord",
    "UsageWindow",
    "check_size",
    "decode_usage",
    "usage_from_json",
    "usage_id_of",
]

DEFAULT_MAX_RECORD_BYTES = 16 * 1024
DEFAULT_MAX_AGE = timedelta(days=400)
DEFAULT_MAX_AHEAD = timedelta(hours=1)
# Bounds on every JSON number of a record, checked on its text before conversion. A
# valid quantity has at most 30 digits, so these refuse nothing a record may hold.
MAX_NUMBER_CHARS = 100
MAX_EXPONENT = 1000
# Arrays and objects nested deeper than this are refused, whatever the stack (see
# ``_check_nesting``); a record is flat, so this refuses nothing a record may hold.
MAX_NESTING = 500
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")

UsageId = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@/+=-]+$")
]
# No ':' in a customer id: it separates the customer from the usage id in the
# transaction's key (domain.ids), so "acme:eu"/"x" and "acme"/"eu:x" cannot collide.
CUSTOMER_ID_PATTERN = r"^[A-Za-z0-9_.@/+=-]+$"
CUSTOMER_ID_MAX_LENGTH = 200
CustomerId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=CUSTOMER_ID_MAX_LENGTH, pattern=CUSTOMER_ID_PATTERN),
]


class UsageRecord(BaseModel):
    """One metered use of an AI product by a customer."""

    model_config = ConfigDict(frozen=True, extra="ignore", str_strip_whitespace=True)

    usage_id: UsageId
    customer_id: CustomerId
    meter: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    quantity: Annotated[Decimal, Field(ge=0, allow_inf_nan=False, max_digits=30)]
    occurred_at: AwareDatetime
    currency: Annotated[str, StringConstraints(min_length=3, max_length=3)] | None = None

    def to_json(self) -> bytes:
        """The wire form of this record."""
        body: dict[str, object] = {
            "usage_id": self.usage_id,
            "customer_id": self.customer_id,
            "meter": self.meter,
            "quantity": str(self.quantity),
            "occurred_at": _iso(self.occurred_at),
        }
        if self.currency is not None:
            body["currency"] = self.currency
        return json.dumps(body, separators=(",", ":")).encode()


def decode_usage(raw: bytes | None, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> UsageRecord:
    """Parse and validate one record; raise InvalidUsage with a one-line reason, and
    nothing else, whatever the bytes (see the module docstring)."""
    return usage_from_json(_parse(check_size(raw, max_bytes)))


@dataclass(frozen=True)
class UsageWindow:
    """How far from the ledger's clock a record's ``occurred_at`` may be (see the module
    docstring): ``check`` gives the record back or raises ``InvalidUsage`` with the reason."""

    max_age: timedelta = DEFAULT_MAX_AGE
    max_ahead: timedelta = DEFAULT_MAX_AHEAD

    def __post_init__(self) -> None:
        if self.max_age <= timedelta(0) or self.max_ahead < timedelta(0):
            raise ValueError("a usage window's age must be above 0 and its lead not below 0")

    def check(self, record: UsageRecord, now: datetime) -> UsageRecord:
        """``record`` when it occurred within the window around ``now``; else the reason."""
        at = record.occurred_at
        # Compared as offsets from ``now``, never by adding to it: year 9999 plus an hour
        # overflows, and so does a far moment converted to UTC (9999-12-31T23:00-05:00).
        ahead = _seconds_between(now, at)
        if ahead > self.max_ahead.total_seconds():
            raise InvalidUsage(
                f"occurred_at too far ahead: {_iso(at)} is more than {_span(self.max_ahead)}"
                f" after the ledger's clock ({_iso(now.replace(microsecond=0))})"
            )
        if -ahead > self.max_age.total_seconds():
            raise InvalidUsage(
                f"occurred_at too old: {_iso(at)} is more than {_span(self.max_age)}"
                f" before the ledger's clock ({_iso(now.replace(microsecond=0))})"
            )
        return record


def _seconds_between(start: datetime, end: datetime) -> float:
    """``end - start`` in seconds, for any two aware moments: the naive wall times are
    subtracted, then ``end``'s offset, so no moment is ever moved past year 9999."""
    offset = end.utcoffset() or timedelta(0)
    start_utc = start.astimezone(UTC).replace(tzinfo=None)
    return ((end.replace(tzinfo=None) - start_utc) - offset).total_seconds()


def _span(span: timedelta) -> str:
    """``400 days``, ``1 hour``, ``90 seconds``: a bound as a reader says it."""
    seconds = int(span.total_seconds())
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def check_size(raw: bytes | None, max_bytes: int) -> bytes:
    """``raw`` if it is a value within ``max_bytes``; else the reason, raised."""
    if raw is None:
        raise InvalidUsage("empty message (no value)")
    if len(raw) > max_bytes:
        raise InvalidUsage(f"payload of {len(raw)} bytes exceeds the {max_bytes}-byte limit")
    return raw


def usage_from_json(data: object) -> UsageRecord:
    """The record a parsed JSON value holds (numbers as int or Decimal, never float);
    raise InvalidUsage with the reason. ``decode_usage`` after parsing, shared with any
    faster parser that hands it the very same value."""
    if not isinstance(data, dict):
        raise InvalidUsage(f"expected a JSON object, got {type(data).__name__}")
    try:
        record = UsageRecord.model_validate(data)
    except ValidationError as exc:
        raise InvalidUsage(_describe(exc)) from None
    if record.currency is not None:
        record = record.model_copy(update={"currency": check_currency(record.currency)})
    return record


class _NumberOutOfBounds(Exception):
    """Raised by the JSON number hooks; its message is the reason."""


def _parse(raw: bytes) -> object:
    """The JSON value of ``raw``, numbers as int or Decimal; every failure a reason."""
    _check_nesting(raw)
    try:
        return json.loads(raw, parse_int=_bounded_int, parse_float=_bounded_decimal)
    except _NumberOutOfBounds as exc:
        raise InvalidUsage(str(exc)) from None
    except RecursionError:
        raise InvalidUsage("not valid JSON: nested too deeply") from None
    except (UnicodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidUsage(f"not valid JSON: {_one_line(str(exc))}") from None
    except ArithmeticError as exc:  # a number the bounds let through still failed
        raise InvalidUsage(f"number out of range: {type(exc).__name__}") from None


def _check_nesting(raw: bytes) -> None:
    """Refuse JSON nested deeper than ``MAX_NESTING`` before parsing it, so the verdict
    never depends on how deep the caller's stack is (the parser's ``RecursionError``
    comes at the interpreter's limit minus the frames already in use). Strings are
    taken out first, so brackets inside them do not count."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub(b'""', raw)):
        depth += 1 if bracket.group() in b"[{" else -1
        if depth > MAX_NESTING:
            raise InvalidUsage("not valid JSON: nested too deeply")


def _bounded_int(text: str) -> int:
    _check_length(text)
    return int(text)


def _bounded_decimal(text: str) -> Decimal:
    _check_length(text)
    _, e, exponent = text.lower().partition("e")
    if e and abs(int(exponent)) > MAX_EXPONENT:
        raise _NumberOutOfBounds(
            f"number out of range: exponent {int(exponent)} is beyond +/-{MAX_EXPONENT}"
        )
    return Decimal(text)


def _check_length(text: str) -> None:
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberOutOfBounds(
            f"number too long: a JSON number of {len(text)} characters (at most {MAX_NUMBER_CHARS})"
        )


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in error["loc"]) or "record"
        msg = error["msg"]
        parts.append(f"{where}: {msg[:1].lower()}{msg[1:]}")
    return _one_line("; ".join(parts)) or "record: invalid"


def _one_line(text: str) -> str:
    """A reason goes into a log line, a header and a table: one line, no NUL."""
    return " ".join(text.replace("\x00", " ").split())


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def usage_id_of(raw: bytes | None) -> str | None:
    """The usage id a record's bytes name, when they can be read as far as that (a dead
    letter's log line and ``dead-letters`` show it); None otherwise. Never raises."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    usage_id = data.get("usage_id") if isinstance(data, dict) else None
    return usage_id if isinstance(usage_id, str) else None
