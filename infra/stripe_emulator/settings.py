"""The emulator's settings: :class:`EmulatorSettings` and how a raw value becomes a valid one.

This module owns the list of settings (every field is a constructor argument of
``StripeEmulator``, a key of ``POST /_emulator/faults`` and a CLI flag) and their validation.
It holds no state: the live settings are kept by :mod:`.faults`.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    drop_response_after_execute: int = 0
    """The next N POST/DELETE executions are saved, then the connection closes unanswered."""
    drop_response_probability: float = 0.0
    """Probability (0..1) that a POST/DELETE execution's response is dropped the same way."""
    key_ttl_s: float = DEFAULT_KEY_TTL_S
    """Idempotency keys older than this are forgotten (a reuse is a new request)."""
    seed: int | None = None
    """Seed of the random source behind ``error_rate`` and ``drop_response_probability``."""


SETTING_NAMES: Final = tuple(f.name for f in fields(EmulatorSettings))
INTEGER_SETTINGS: Final = frozenset({"rate_limit_per_s", "drop_response_after_execute", "seed"})
_PROBABILITIES: Final = frozenset({"error_rate", "drop_response_probability"})
_NON_NEGATIVE: Final = frozenset({"latency_ms"})
_POSITIVE: Final = frozenset({"key_ttl_s"})
_COUNTS: Final = frozenset({"drop_response_after_execute"})
_PER_SECOND: Final = frozenset({"rate_limit_per_s"})


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


def coerce_setting(name: str, value: object) -> object:
    """Validate one setting value; raise ``ValueError`` with a one-line reason."""
    result: object
    if name in _NON_NEGATIVE:
        result = _number(name, value, low=0.0)
    elif name in _PROBABILITIES:
        result = _number(name, value, low=0.0, high=1.0)
    elif name in _POSITIVE:
        result = _number(name, value, low=0.001)
    elif name == "outage":
        if not isinstance(value, bool):
            raise ValueError(f"outage must be true or false, got {value!r}")
        result = value
    elif name == "outage_mode":
        result = str(value) if _is_number(value) or isinstance(value, str) else value
        if result not in OUTAGE_MODES:
            raise ValueError(f"outage_mode must be one of {OUTAGE_MODES}, got {value!r}")
    elif name == "outage_seconds":
        result = None if value is None else _number(name, value, low=0.001)
    elif name in _PER_SECOND:
        result = None if value in (None, 0) else _integer(name, value, low=1)
    elif name in _COUNTS:
        result = _integer(name, value, low=0)
    elif name == "seed":
        result = None if value is None else _integer(name, value, low=-(2**63))
    else:
        raise ValueError(f"unknown setting {name!r}; known: {', '.join(SETTING_NAMES)}")
    return result


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
