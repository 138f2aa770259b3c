"""The usage record: what producers send, and how raw bytes become one or a reason.

Wire format (one JSON object per Kafka message, key = customer id)::

    {"usage_id": "req-8812", "customer_id": "acme", "meter": "gpt-4o.input_tokens",
     "quantity": 1520, "occurred_at": "2026-12-02T10:15:00Z", "currency": "USD"}

``currency`` is optional; when given it must equal the meter's price currency.
Numbers are parsed as ``Decimal`` straight from the JSON text, never as floats.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from domain.errors import InvalidUsage
from domain.money import check_currency

__all__ = [
    "CUSTOMER_ID_MAX_LENGTH",
    "CUSTOMER_ID_PATTERN",
    "DEFAULT_MAX_RECORD_BYTES",
    "UsageRecord",
    "decode_usage",
]

DEFAULT_MAX_RECORD_BYTES = 16 * 1024

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
    """Parse and validate one record; raise InvalidUsage with a one-line reason."""
    if raw is None:
        raise InvalidUsage("empty message (no value)")
    if len(raw) > max_bytes:
        raise InvalidUsage(f"payload of {len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        data = json.loads(raw, parse_float=Decimal)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidUsage(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidUsage("not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidUsage(f"expected a JSON object, got {type(data).__name__}")
    try:
        record = UsageRecord.model_validate(data)
    except ValidationError as exc:
        raise InvalidUsage(_describe(exc)) from None
    if record.currency is not None:
        record = record.model_copy(update={"currency": check_currency(record.currency)})
    return record


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in error["loc"]) or "record"
        msg = error["msg"]
        parts.append(f"{where}: {msg[:1].lower()}{msg[1:]}")
    return "; ".join(parts)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
