"""Stripe's request encoding and parameter rules.

This module owns how a request becomes parameters (form bodies with nested keys such as
``metadata[k]=v`` and ``expand[0]=x``, the query string of GET/DELETE, the API key of the
``Authorization`` header) and the checks every endpoint shares: unknown parameters, strings,
integers, booleans, metadata (create and update semantics), object ids and JSON encoding.
It holds no state.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import string
from collections.abc import Sequence
from typing import Final
from urllib.parse import parse_qsl

from .errors import JsonObject, invalid

__all__ = [
    "MAX_AMOUNT",
    "bearer_key",
    "check_params",
    "copy_json",
    "dumps",
    "merge_metadata",
    "metadata",
    "new_id",
    "opt_amount",
    "opt_str",
    "parse_bool",
    "parse_form",
    "parse_int",
    "request_pairs",
    "required_str",
]

MAX_AMOUNT: Final = 99_999_999
"""Stripe's largest amount in minor units (an eight-digit amount)."""

_METADATA_MAX_KEYS: Final = 50
_METADATA_MAX_KEY_LEN: Final = 40
_METADATA_MAX_VALUE_LEN: Final = 500
_ID_ALPHABET: Final = string.ascii_letters + string.digits
_KEY_RE: Final = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_KEY_PART_RE: Final = re.compile(r"\[([^\[\]]*)\]")


def new_id(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def dumps(payload: object) -> bytes:
    return json.dumps(payload, indent=2, sort_keys=False).encode("utf-8")


def copy_json(value: JsonObject) -> JsonObject:
    """A deep copy of a JSON object (what a caller may keep or change freely)."""
    copied: JsonObject = json.loads(json.dumps(value))
    return copied


def parse_form(pairs: Sequence[tuple[str, str]]) -> JsonObject:
    """Decode Stripe's form encoding (``a[b][c]=v``, ``expand[0]=x``) into nested dicts."""
    root: JsonObject = {}
    for raw_key, value in pairs:
        match = _KEY_RE.match(raw_key)
        if match is None:
            raise invalid(f"Invalid parameter name: {raw_key}", raw_key)
        parts = [match.group(1), *_KEY_PART_RE.findall(match.group(2))]
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise invalid(f"Invalid hash for parameter {raw_key}", parts[0])
            node = child
        last = parts[-1] or str(len(node))  # "expand[]=x" appends
        if isinstance(node.get(last), dict):
            raise invalid(f"Invalid string for parameter {raw_key}", parts[0])
        node[last] = value
    return root


def request_pairs(method: str, query: str, body: bytes) -> list[tuple[str, str]]:
    """The parameters of a request: query string for GET/DELETE plus the form body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid("Request body is not valid UTF-8.") from exc
    pairs = parse_qsl(text, keep_blank_values=True)
    if method in ("GET", "DELETE"):
        pairs = parse_qsl(query, keep_blank_values=True) + pairs
    return pairs


def bearer_key(authorization: str | None) -> str | None:
    """The API key from ``Bearer <key>`` or HTTP basic auth (``curl -u sk_test_x:``)."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer" and credentials:
        return credentials
    if scheme.lower() == "basic" and credentials:
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[0] or None
    return None


def check_params(params: JsonObject, allowed: frozenset[str]) -> None:
    for name in params:
        if name not in allowed:
            raise invalid(f"Received unknown parameter: {name}", name)


def opt_str(params: JsonObject, name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid(f"Invalid string: {value!r}", name)
    return value


def required_str(params: JsonObject, name: str) -> str:
    value = opt_str(params, name)
    if value is None:
        raise invalid(f"Missing required param: {name}.", name, code="parameter_missing")
    return value


def parse_int(value: object, name: str, *, low: int, high: int) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"-?\d+", value.strip()):
        raise invalid(f"Invalid integer: {value}", name)
    number = int(value)
    if number < low:
        raise invalid(f"This value must be greater than or equal to {low}.", name)
    if number > high:
        raise invalid(f"This value must be less than or equal to {high}.", name)
    return number


def opt_amount(params: JsonObject, name: str, *, low: int = 0) -> int | None:
    """An optional amount in minor units, ``low..MAX_AMOUNT``."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    return parse_int(raw, name, low=low, high=MAX_AMOUNT)


def parse_bool(value: object, name: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise invalid(f"Invalid boolean: {value}", name)


def _metadata_changes(params: JsonObject) -> dict[str, str] | None:
    """The ``metadata`` hash as sent (empty values kept); None when absent or unset-all."""
    raw = params.get("metadata")
    if raw is None or raw == "":
        return None
    if not isinstance(raw, dict):
        raise invalid("Invalid hash", "metadata")
    out: dict[str, str] = {}
    for key, value in raw.items():
        param = f"metadata[{key}]"
        if not isinstance(value, str):
            raise invalid(f"Invalid string: {value!r}", param)
        if len(key) > _METADATA_MAX_KEY_LEN:
            raise invalid(f"Metadata keys can have up to {_METADATA_MAX_KEY_LEN} characters", param)
        if len(value) > _METADATA_MAX_VALUE_LEN:
            raise invalid(
                f"Metadata values can have up to {_METADATA_MAX_VALUE_LEN} characters", param
            )
        out[key] = value
    return out


def _check_key_count(result: dict[str, str]) -> dict[str, str]:
    if len(result) > _METADATA_MAX_KEYS:
        raise invalid(f"Metadata can have up to {_METADATA_MAX_KEYS} keys", "metadata")
    return result


def metadata(params: JsonObject) -> dict[str, str]:
    """The metadata of a new object (an empty value sets nothing)."""
    changes = _metadata_changes(params) or {}
    return _check_key_count({k: v for k, v in changes.items() if v != ""})


def merge_metadata(current: dict[str, str], params: JsonObject) -> dict[str, str]:
    """An update's metadata, as Stripe merges it.

    Keys sent are set, a key sent with an empty value is removed, keys not sent are kept,
    and ``metadata=`` (empty) removes every key.
    """
    if "metadata" not in params:
        return dict(current)
    if params["metadata"] == "":
        return {}
    merged = dict(current)
    for key, value in (_metadata_changes(params) or {}).items():
        if value == "":
            merged.pop(key, None)
        else:
            merged[key] = value
    return _check_key_count(merged)
