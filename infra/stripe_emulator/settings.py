"""The emulator's settings: :class:`EmulatorSettings` and how a raw value becomes a valid one.

This module owns the list of settings (every field is a constructor argument of
``StripeEmulator``, a key of ``POST /_emulator/faults`` and a CLI flag) and their validation.
It holds no state: the live settings are kept by :mod:`.faults`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Final, cast

__all__ = [
    "DEFAULT_KEY_TTL_S",
    "DEFAULT_PORT",
    "INTEGER_SETTINGS",
    "OUTAGE_MODES",
    "SETTING_NAMES",
    "EmulatorSettings",
    "coerce_setting",
    "flatten_outage",
]

DEFAULT_KEY_TTL_S: Final = 86400.0
DEFAULT_PORT: Final = 12111  # the port stripe-mock uses; only the CLI default
OUTAGE_MODES: Final = ("503", "refuse")


@dataclass(frozen=True)
class EmulatorSettings:
    """Fault and behaviour settings; every field is also a constructor argument and CLI flag."""

    latency_ms: float = 0.0
    """Added to every API request that gets a response (while its key is held in flight)."""
    error_rate: float = 0.0
    """Probability (0..1) of an injected 500 ``api_error``, decided before execution."""
    outage: bool = False
    """When on, every API request gets a 503 or a closed connection (see ``outage_mode``)."""
    outage_mode: str = "503"
    """``"503"`` (answer 503 ``api_error``) or ``"refuse"`` (close the socket, no response)."""
    outage_seconds: float | None = None
    """Setting it starts an outage that switches itself off this many seconds later."""
    rate_limit_per_s: int | None = None
    """Admit at most this many API requests per sliding second; the rest get 429."""
    endpoint_rate_limit_per_s: int | None = None
    """Admit at most this many requests per sliding second per endpoint (method + path
    template, e.g. ``POST /v1/invoiceitems/{id}``); the rest get 429 (Stripe: 25/s)."""
    drop_response_after_execute: int = 0
    """The next N POST/DELETE executions are saved, then the connection closes unanswered."""
    drop_response_probability: float = 0.0
    """Probability (0..1) that a POST/DELETE execution's response is dropped the same way."""
    late_execute_next: int = 0
    """The next N requests that set an amount (an invoice item's update, ``POST
    /v1/invoiceitems/{id}``, or a draft's bulk update or creation of lines, ``POST
    /v1/invoices/{id}/update_lines`` and ``.../add_lines``) are received and left
    unanswered (the connection closes), then executed ``late_execute_s`` later, their
    key in flight meanwhile: a request Stripe applies after its client gave up,
    possibly after a newer one."""
    late_execute_probability: float = 0.0
    """Probability (0..1) that a request setting an amount is executed late the same way."""
    late_execute_s: float = 2.0
    """How long after it arrived a late request is executed."""
    key_ttl_s: float = DEFAULT_KEY_TTL_S
    """Idempotency keys older than this are forgotten (a reuse is a new request)."""
    payment_failures: int = 0
    """The next N payment attempts (``POST /v1/invoices/{id}/pay``) are declined (402)."""
    webhook_retry_base_s: float = 1.0
    """A failed webhook delivery is retried after ``base * 2**(attempt - 1)`` seconds."""
    webhook_max_attempts: int = 8
    """Attempts per event and endpoint before a delivery is given up (recorded as failed)."""
    webhook_timeout_s: float = 10.0
    """How long one delivery waits for the receiver's answer."""
    webhook_delay_s: float = 0.0
    """Every new event's first delivery waits this long."""
    webhook_duplicate_probability: float = 0.0
    """Probability (0..1) that a new event is delivered twice to an endpoint."""
    webhook_duplicate_next: int = 0
    """The next N (event, endpoint) deliveries are sent twice."""
    webhook_reorder: int = 0
    """When >= 2: hold each endpoint's new deliveries until this many are held, then send
    them newest first (reverse order); a partial window is released the same way after
    ``webhook_reorder_hold_s``."""
    webhook_reorder_hold_s: float = 2.0
    """The longest a delivery is held back by ``webhook_reorder``."""
    seed: int | None = None
    """Seed of the random source behind ``error_rate``, ``drop_response_probability`` and
    ``webhook_duplicate_probability``."""


SETTING_NAMES: Final = tuple(f.name for f in fields(EmulatorSettings))
INTEGER_SETTINGS: Final = frozenset(
    {
        "rate_limit_per_s",
        "endpoint_rate_limit_per_s",
        "drop_response_after_execute",
        "late_execute_next",
        "payment_failures",
        "webhook_max_attempts",
        "webhook_duplicate_next",
        "webhook_reorder",
        "seed",
    }
)
_PROBABILITIES: Final = frozenset(
    {
        "error_rate",
        "drop_response_probability",
        "late_execute_probability",
        "webhook_duplicate_probability",
    }
)
_NON_NEGATIVE: Final = frozenset(
    {"latency_ms", "webhook_retry_base_s", "webhook_delay_s", "late_execute_s"}
)
_POSITIVE: Final = frozenset({"key_ttl_s", "webhook_timeout_s", "webhook_reorder_hold_s"})
_COUNTS: Final = frozenset(
    {
        "drop_response_after_execute",
        "late_execute_next",
        "payment_failures",
        "webhook_duplicate_next",
        "webhook_reorder",
    }
)
_PER_SECOND: Final = frozenset({"rate_limit_per_s", "endpoint_rate_limit_per_s"})


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(name: str, value: object, *, low: float, high: float | None = None) -> float:
    if not _is_number(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(cast(float, value))
    if number < low or (high is not None and number > high):
        bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return number


def _integer(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    return value


def _outage(name: str, value: object) -> object:
    if not isinstance(value, bool):
        raise ValueError(f"outage must be true or false, got {value!r}")
    return value


def _outage_mode(name: str, value: object) -> object:
    result = str(value) if _is_number(value) or isinstance(value, str) else value
    if result not in OUTAGE_MODES:
        raise ValueError(f"outage_mode must be one of {OUTAGE_MODES}, got {value!r}")
    return result


def _coercer(name: str) -> Callable[[str, object], object] | None:
    """How a setting's value is checked, by kind of setting."""
    kinds: tuple[tuple[frozenset[str], Callable[[str, object], object]], ...] = (
        (_NON_NEGATIVE, lambda n, v: _number(n, v, low=0.0)),
        (_PROBABILITIES, lambda n, v: _number(n, v, low=0.0, high=1.0)),
        (_POSITIVE, lambda n, v: _number(n, v, low=0.001)),
        (_PER_SECOND, lambda n, v: None if v in (None, 0) else _integer(n, v, low=1)),
        (_COUNTS, lambda n, v: _integer(n, v, low=0)),
        (frozenset({"webhook_max_attempts"}), lambda n, v: _integer(n, v, low=1)),
        (frozenset({"outage"}), _outage),
        (frozenset({"outage_mode"}), _outage_mode),
        (
            frozenset({"outage_seconds"}),
            lambda n, v: None if v is None else _number(n, v, low=0.001),
        ),
        (frozenset({"seed"}), lambda n, v: None if v is None else _integer(n, v, low=-(2**63))),
    )
    for names, coerce in kinds:
        if name in names:
            return coerce
    return None


def coerce_setting(name: str, value: object) -> object:
    """Validate one setting value; raise ``ValueError`` with a one-line reason."""
    coerce = _coercer(name)
    if coerce is None:
        raise ValueError(f"unknown setting {name!r}; known: {', '.join(SETTING_NAMES)}")
    return coerce(name, value)


def flatten_outage(updates: Mapping[str, object]) -> dict[str, object]:
    """Accept ``{"outage": {"mode": "refuse", "seconds": 2, "on": true}}`` as well as flat keys."""
    flat = dict(updates)
    outage = flat.get("outage")
    if isinstance(outage, Mapping):
        extra = set(outage) - {"on", "mode", "seconds"}
        if extra:
            raise ValueError(f"unknown outage field(s): {', '.join(sorted(map(str, extra)))}")
        flat["outage"] = outage.get("on", True)
        if "mode" in outage:
            flat["outage_mode"] = outage["mode"]
        if "seconds" in outage:
            flat["outage_seconds"] = outage["seconds"]
    return flat
