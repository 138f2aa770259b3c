"""A Stripe API emulator: the slice of Stripe's v1 REST API that the billing client uses.

This module owns a standard-library HTTP server (``ThreadingHTTPServer``) that the real
``stripe`` Python SDK can be pointed at (``StripeClient(key, base_addresses={"api": url})`` or
``stripe.api_base = url``).  It speaks Stripe's wire format: form-encoded request bodies with
nested keys (``metadata[k]=v``), JSON responses, the ``{"error": {...}}`` error shape, and
Stripe's v1 idempotency semantics (``Idempotency-Key`` replay, parameter mismatch, concurrent
use, key expiry).

It owns, in memory and behind one lock:

* customers, invoice items (live and deleted) and draft invoices;
* the idempotency-key store (scoped per API key);
* a ledger of every executed mutation and a log of every API request received;
* fault injection: latency, random 500s, outages (503 or refused connection), a sliding-window
  rate limiter (429), and "drop the response after executing" (the ambiguous timeout).

Endpoints served (all need ``Authorization: Bearer <key>``)::

    POST   /v1/customers                 GET /v1/customers/{id}     GET /v1/customers/search
    POST   /v1/invoiceitems              GET /v1/invoiceitems       GET /v1/invoiceitems/{id}
    DELETE /v1/invoiceitems/{id}         GET /v1/invoiceitems/search  (not in real Stripe)
    POST   /v1/invoices                  GET /v1/invoices/{id}

Control API (JSON, no auth) under ``/_emulator/``: ``health``, ``faults`` (GET/POST, partial
updates), ``reset``, ``ledger``, ``requests``, ``invoiceitems``.  The same operations exist as
methods of :class:`StripeEmulator`.  ``python -m infra.stripe_emulator --help`` runs it alone.

It is a test double: it does not persist anything, does not emulate search's eventual
consistency, and does not validate API keys beyond requiring one.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import random
import re
import secrets
import signal
import string
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Final, Self, cast
from urllib.parse import parse_qs, parse_qsl, urlsplit

__all__ = ["DEFAULT_KEY_TTL_S", "DEFAULT_PORT", "EmulatorSettings", "StripeEmulator", "main"]

DEFAULT_KEY_TTL_S: Final = 86400.0
DEFAULT_PORT: Final = 12111  # the port stripe-mock uses; only the CLI default

_CONTROL_PREFIX: Final = "/_emulator"
_MUTATING_METHODS: Final = frozenset({"POST", "DELETE"})
_MAX_IDEMPOTENCY_KEY_LEN: Final = 255
_MAX_AMOUNT: Final = 99_999_999
_METADATA_MAX_KEYS: Final = 50
_METADATA_MAX_KEY_LEN: Final = 40
_METADATA_MAX_VALUE_LEN: Final = 500
_OUTAGE_MODES: Final = ("503", "refuse")
_ID_ALPHABET: Final = string.ascii_letters + string.digits
_DOC_URL: Final = "https://stripe.com/docs/error-codes/"

JsonObject = dict[str, Any]


# --------------------------------------------------------------------------------------------
# settings


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


_SETTING_NAMES: Final = tuple(f.name for f in fields(EmulatorSettings))


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


def _coerce_setting(name: str, value: object) -> object:
    """Validate one setting value; raise ``ValueError`` with a one-line reason."""
    result: object
    if name == "latency_ms":
        result = _number(name, value, low=0.0)
    elif name in ("error_rate", "drop_response_probability"):
        result = _number(name, value, low=0.0, high=1.0)
    elif name == "key_ttl_s":
        result = _number(name, value, low=0.001)
    elif name == "outage":
        if not isinstance(value, bool):
            raise ValueError(f"outage must be true or false, got {value!r}")
        result = value
    elif name == "outage_mode":
        result = str(value) if _is_number(value) or isinstance(value, str) else value
        if result not in _OUTAGE_MODES:
            raise ValueError(f"outage_mode must be one of {_OUTAGE_MODES}, got {value!r}")
    elif name == "outage_seconds":
        result = None if value is None else _number(name, value, low=0.001)
    elif name == "rate_limit_per_s":
        result = None if value in (None, 0) else _integer(name, value, low=1)
    elif name == "drop_response_after_execute":
        result = _integer(name, value, low=0)
    elif name == "seed":
        result = None if value is None else _integer(name, value, low=-(2**63))
    else:
        raise ValueError(f"unknown setting {name!r}; known: {', '.join(_SETTING_NAMES)}")
    return result


def _flatten_outage(updates: Mapping[str, object]) -> dict[str, object]:
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


# --------------------------------------------------------------------------------------------
# small value types


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class _ApiError(Exception):
    """A Stripe error response.  ``saved`` is False for validation failures (not replayed)."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        saved: bool = True,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.code = code
        self.param = param
        self.saved = saved
        self.headers = headers

    def payload(self, request_id: str) -> JsonObject:
        error: JsonObject = {"type": self.type, "message": self.message}
        if self.code is not None:
            error["code"] = self.code
            error["doc_url"] = _DOC_URL + self.code.replace("_", "-")
        if self.param is not None:
            error["param"] = self.param
        error["request_log_url"] = f"https://dashboard.stripe.com/test/logs/{request_id}"
        return {"error": error}


def _invalid(message: str, param: str | None = None, *, code: str | None = None) -> _ApiError:
    """A parameter validation failure: 400, not saved under the idempotency key."""
    return _ApiError(400, "invalid_request_error", message, param=param, code=code, saved=False)


def _missing(kind: str, object_id: str, param: str, status: int = 404) -> _ApiError:
    return _ApiError(
        status,
        "invalid_request_error",
        f"No such {kind}: '{object_id}'",
        code="resource_missing",
        param=param,
    )


@dataclass
class _KeyEntry:
    fingerprint: tuple[str, str, tuple[tuple[str, str], ...]]
    created: float  # monotonic
    request_id: str
    in_flight: bool = True
    status: int = 0
    body: bytes = b""


@dataclass
class _ItemRecord:
    obj: JsonObject
    seq: int
    deleted: bool = False
    deleted_at: float | None = None


@dataclass(frozen=True)
class _Call:
    params: JsonObject
    path_id: str | None
    now: int


@dataclass(frozen=True)
class _Result:
    payload: JsonObject
    object_id: str | None = None
    mutated: bool = False
    status: int = 200


@dataclass
class _Job:
    handler: Callable[[_Store, _Call], _Result]
    method: str
    path: str
    params: JsonObject
    path_id: str | None
    request_id: str
    idempotency_key: str | None
    entry: _KeyEntry | None
    scope: tuple[str, str] | None


@dataclass(frozen=True)
class _Admission:
    reply: _Reply | None = None
    job: _Job | None = None
    refuse: bool = False


def _new_id(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def _dumps(payload: object) -> bytes:
    return json.dumps(payload, indent=2, sort_keys=False).encode("utf-8")


# --------------------------------------------------------------------------------------------
# request parsing

_KEY_RE: Final = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_KEY_PART_RE: Final = re.compile(r"\[([^\[\]]*)\]")


def _parse_form(pairs: Sequence[tuple[str, str]]) -> JsonObject:
    """Decode Stripe's form encoding (``a[b][c]=v``, ``expand[0]=x``) into nested dicts."""
    root: JsonObject = {}
    for raw_key, value in pairs:
        match = _KEY_RE.match(raw_key)
        if match is None:
            raise _invalid(f"Invalid parameter name: {raw_key}", raw_key)
        parts = [match.group(1), *_KEY_PART_RE.findall(match.group(2))]
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _invalid(f"Invalid hash for parameter {raw_key}", parts[0])
            node = child
        last = parts[-1] or str(len(node))  # "expand[]=x" appends
        if isinstance(node.get(last), dict):
            raise _invalid(f"Invalid string for parameter {raw_key}", parts[0])
        node[last] = value
    return root


def _request_pairs(method: str, query: str, body: bytes) -> list[tuple[str, str]]:
    """The parameters of a request: query string for GET/DELETE plus the form body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid("Request body is not valid UTF-8.") from exc
    pairs = parse_qsl(text, keep_blank_values=True)
    if method in ("GET", "DELETE"):
        pairs = parse_qsl(query, keep_blank_values=True) + pairs
    return pairs


def _bearer_key(authorization: str | None) -> str | None:
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


# --------------------------------------------------------------------------------------------
# parameter helpers


def _check_params(params: JsonObject, allowed: frozenset[str]) -> None:
    for name in params:
        if name not in allowed:
            raise _invalid(f"Received unknown parameter: {name}", name)


def _opt_str(params: JsonObject, name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _invalid(f"Invalid string: {value!r}", name)
    return value


def _required_str(params: JsonObject, name: str) -> str:
    value = _opt_str(params, name)
    if value is None:
        raise _invalid(f"Missing required param: {name}.", name, code="parameter_missing")
    return value


def _parse_int(value: object, name: str, *, low: int, high: int) -> int:
    if not isinstance(value, str) or not re.fullmatch(r"-?\d+", value.strip()):
        raise _invalid(f"Invalid integer: {value}", name)
    number = int(value)
    if number < low:
        raise _invalid(f"This value must be greater than or equal to {low}.", name)
    if number > high:
        raise _invalid(f"This value must be less than or equal to {high}.", name)
    return number


def _parse_bool(value: object, name: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise _invalid(f"Invalid boolean: {value}", name)


def _metadata(params: JsonObject) -> dict[str, str]:
    raw = params.get("metadata")
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, dict):
        raise _invalid("Invalid hash", "metadata")
    out: dict[str, str] = {}
    for key, value in raw.items():
        param = f"metadata[{key}]"
        if not isinstance(value, str):
            raise _invalid(f"Invalid string: {value!r}", param)
        if len(key) > _METADATA_MAX_KEY_LEN:
            raise _invalid(
                f"Metadata keys can have up to {_METADATA_MAX_KEY_LEN} characters", param
            )
        if len(value) > _METADATA_MAX_VALUE_LEN:
            raise _invalid(
                f"Metadata values can have up to {_METADATA_MAX_VALUE_LEN} characters", param
            )
        if value != "":  # an empty value unsets the key
            out[key] = value
    if len(out) > _METADATA_MAX_KEYS:
        raise _invalid(f"Metadata can have up to {_METADATA_MAX_KEYS} keys", "metadata")
    return out


def _limit(params: JsonObject) -> int:
    raw = params.get("limit")
    return 10 if raw is None else _parse_int(raw, "limit", low=1, high=100)


_CLAUSE_RE: Final = re.compile(
    r"""\s*metadata\[(?P<kq>['"])(?P<key>(?:\\.|(?!(?P=kq)).)*)(?P=kq)\]"""
    r"""\s*:\s*(?P<vq>['"])(?P<value>(?:\\.|(?!(?P=vq)).)*)(?P=vq)\s*"""
)
_AND_RE: Final = re.compile(r"AND(?=\s)")
_ESCAPE_RE: Final = re.compile(r"\\(.)")


def _parse_metadata_query(query: str) -> list[tuple[str, str]]:
    """Parse ``metadata['k']:'v'`` clauses joined by ``AND`` (the only form supported)."""
    clauses: list[tuple[str, str]] = []
    pos = 0
    while True:
        match = _CLAUSE_RE.match(query, pos)
        if match is None:
            raise _invalid(
                "The emulator only supports queries of the form metadata['key']:'value' "
                f"joined by AND; got: {query}",
                "query",
            )
        clauses.append((_ESCAPE_RE.sub(r"\1", match["key"]), _ESCAPE_RE.sub(r"\1", match["value"])))
        pos = match.end()
        if pos == len(query):
            return clauses
        joiner = _AND_RE.match(query, pos)
        if joiner is None:
            raise _invalid(f"Unsupported search query: {query}", "query")
        pos = joiner.end()


def _search_page(objects: list[JsonObject], params: JsonObject, url: str) -> JsonObject:
    """A ``search_result`` page over ``objects`` (already newest first)."""
    limit = _limit(params)
    offset = 0
    page = params.get("page")
    if page not in (None, ""):
        match = re.fullmatch(r"page_(\d+)", str(page))
        if match is None:
            raise _invalid(f"Invalid page: {page}", "page")
        offset = int(match.group(1))
    chunk = objects[offset : offset + limit]
    has_more = offset + limit < len(objects)
    return {
        "object": "search_result",
        "data": chunk,
        "has_more": has_more,
        "next_page": f"page_{offset + limit}" if has_more else None,
        "url": url,
    }


# --------------------------------------------------------------------------------------------
# the object store and endpoint handlers (always called with the emulator lock held)

_CUSTOMER_CREATE: Final = frozenset({"email", "name", "description", "phone", "metadata", "expand"})
_ITEM_CREATE: Final = frozenset(
    {"customer", "amount", "currency", "description", "metadata", "expand"}
)
_ITEM_LIST: Final = frozenset(
    {"customer", "limit", "starting_after", "ending_before", "pending", "invoice", "expand"}
)
_INVOICE_CREATE: Final = frozenset(
    {
        "customer",
        "metadata",
        "description",
        "auto_advance",
        "collection_method",
        "days_until_due",
        "currency",
        "pending_invoice_items_behavior",
        "expand",
    }
)
_RETRIEVE: Final = frozenset({"expand"})
_SEARCH: Final = frozenset({"query", "limit", "page", "expand"})


class _Store:
    """Customers, invoice items and invoices, in memory."""

    def __init__(self) -> None:
        self.customers: dict[str, JsonObject] = {}
        self.items: dict[str, _ItemRecord] = {}
        self.invoices: dict[str, JsonObject] = {}
        self._seq = 0

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # customers ----------------------------------------------------------------------------

    def create_customer(self, call: _Call) -> _Result:
        params = call.params
        _check_params(params, _CUSTOMER_CREATE)
        email = _opt_str(params, "email")
        if email is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+", email):
            raise _invalid(f"Invalid email address: {email}", "email", code="email_invalid")
        customer_id = _new_id("cus_", 14)
        customer: JsonObject = {
            "id": customer_id,
            "object": "customer",
            "address": None,
            "balance": 0,
            "created": call.now,
            "currency": None,
            "default_source": None,
            "delinquent": False,
            "description": _opt_str(params, "description"),
            "discount": None,
            "email": email,
            "invoice_prefix": secrets.token_hex(4).upper(),
            "invoice_settings": {
                "custom_fields": None,
                "default_payment_method": None,
                "footer": None,
                "rendering_options": None,
            },
            "livemode": False,
            "metadata": _metadata(params),
            "name": _opt_str(params, "name"),
            "next_invoice_sequence": 1,
            "phone": _opt_str(params, "phone"),
            "preferred_locales": [],
            "shipping": None,
            "tax_exempt": "none",
            "test_clock": None,
        }
        self.customers[customer_id] = customer
        return _Result(customer, customer_id, mutated=True)

    def get_customer(self, call: _Call) -> _Result:
        _check_params(call.params, _RETRIEVE)
        customer_id = call.path_id or ""
        customer = self.customers.get(customer_id)
        if customer is None:
            raise _missing("customer", customer_id, "id")
        return _Result(customer, customer_id)

    def search_customers(self, call: _Call) -> _Result:
        _check_params(call.params, _SEARCH)
        clauses = _parse_metadata_query(_required_str(call.params, "query"))
        found = [
            c
            for c in reversed(self.customers.values())
            if all(c["metadata"].get(k) == v for k, v in clauses)
        ]
        return _Result(_search_page(found, call.params, "/v1/customers/search"))

    # invoice items ------------------------------------------------------------------------

    def create_invoice_item(self, call: _Call) -> _Result:
        params = call.params
        _check_params(params, _ITEM_CREATE)
        customer_id = _required_str(params, "customer")
        raw_amount = params.get("amount")
        if raw_amount in (None, ""):
            raise _invalid("Missing required param: amount.", "amount", code="parameter_missing")
        amount = _parse_int(raw_amount, "amount", low=0, high=_MAX_AMOUNT)
        currency = (_opt_str(params, "currency") or "usd").lower()
        if not re.fullmatch(r"[a-z]{3}", currency):
            raise _invalid(f"Invalid currency: {currency}", "currency")
        description = _opt_str(params, "description")
        metadata = _metadata(params)
        # Execution begins here: from now on errors are saved under the idempotency key.
        if customer_id not in self.customers:
            raise _missing("customer", customer_id, "customer", status=400)
        item_id = _new_id("ii_", 24)
        item: JsonObject = {
            "id": item_id,
            "object": "invoiceitem",
            "amount": amount,
            "currency": currency,
            "customer": customer_id,
            "date": call.now,
            "description": description,
            "discountable": True,
            "discounts": [],
            "invoice": None,
            "livemode": False,
            "metadata": metadata,
            "net_amount": amount,
            "parent": None,
            "period": {"end": call.now, "start": call.now},
            "proration": False,
            "quantity": 1,
            "tax_rates": [],
            "test_clock": None,
        }
        self.items[item_id] = _ItemRecord(item, self._next_seq())
        return _Result(item, item_id, mutated=True)

    def _live_item(self, item_id: str) -> _ItemRecord:
        record = self.items.get(item_id)
        if record is None or record.deleted:
            raise _missing("invoiceitem", item_id, "id")
        return record

    def get_invoice_item(self, call: _Call) -> _Result:
        _check_params(call.params, _RETRIEVE)
        record = self._live_item(call.path_id or "")
        return _Result(record.obj, record.obj["id"])

    def delete_invoice_item(self, call: _Call) -> _Result:
        _check_params(call.params, frozenset())
        record = self._live_item(call.path_id or "")
        record.deleted = True
        record.deleted_at = time.time()
        item_id: str = record.obj["id"]
        deleted = {"id": item_id, "object": "invoiceitem", "deleted": True}
        return _Result(deleted, item_id, mutated=True)

    def list_invoice_items(self, call: _Call) -> _Result:
        params = call.params
        _check_params(params, _ITEM_LIST)
        limit = _limit(params)
        customer = _opt_str(params, "customer")
        invoice = _opt_str(params, "invoice")
        pending = (
            None if params.get("pending") is None else _parse_bool(params["pending"], "pending")
        )
        records = [
            r
            for r in reversed(self.items.values())
            if not r.deleted
            and (customer is None or r.obj["customer"] == customer)
            and (invoice is None or r.obj["invoice"] == invoice)
            and (pending is None or (r.obj["invoice"] is None) == pending)
        ]
        after = _opt_str(params, "starting_after")
        before = _opt_str(params, "ending_before")
        if after is not None and before is not None:
            raise _invalid(
                "You may only specify one of these parameters: ending_before, starting_after.",
                "ending_before",
            )
        if after is not None:
            cursor = self._cursor(after, "starting_after")
            rest = [r for r in records if r.seq < cursor]
            page, has_more = rest[:limit], len(rest) > limit
        elif before is not None:
            cursor = self._cursor(before, "ending_before")
            rest = [r for r in records if r.seq > cursor]
            page, has_more = rest[-limit:], len(rest) > limit
        else:
            page, has_more = records[:limit], len(records) > limit
        return _Result(
            {
                "object": "list",
                "data": [r.obj for r in page],
                "has_more": has_more,
                "url": "/v1/invoiceitems",
            }
        )

    def _cursor(self, item_id: str, param: str) -> int:
        record = self.items.get(item_id)
        if record is None:
            raise _invalid(f"No such invoiceitem: '{item_id}'", param, code="resource_missing")
        return record.seq

    def search_invoice_items(self, call: _Call) -> _Result:
        _check_params(call.params, _SEARCH)
        clauses = _parse_metadata_query(_required_str(call.params, "query"))
        found = [
            r.obj
            for r in reversed(self.items.values())
            if not r.deleted and all(r.obj["metadata"].get(k) == v for k, v in clauses)
        ]
        return _Result(_search_page(found, call.params, "/v1/invoiceitems/search"))

    # invoices -----------------------------------------------------------------------------

    def create_invoice(self, call: _Call) -> _Result:
        params = call.params
        _check_params(params, _INVOICE_CREATE)
        customer_id = _required_str(params, "customer")
        behavior = _opt_str(params, "pending_invoice_items_behavior") or "exclude"
        if behavior not in ("include", "exclude"):
            raise _invalid(
                f"Invalid pending_invoice_items_behavior: {behavior}",
                "pending_invoice_items_behavior",
            )
        collection = _opt_str(params, "collection_method") or "charge_automatically"
        if collection not in ("charge_automatically", "send_invoice"):
            raise _invalid(f"Invalid collection_method: {collection}", "collection_method")
        auto_advance = params.get("auto_advance")
        auto = False if auto_advance is None else _parse_bool(auto_advance, "auto_advance")
        metadata = _metadata(params)
        if customer_id not in self.customers:
            raise _missing("customer", customer_id, "customer", status=400)
        invoice_id = _new_id("in_", 24)
        pending = [
            r
            for r in self.items.values()
            if not r.deleted and r.obj["customer"] == customer_id and r.obj["invoice"] is None
        ]
        currency = (
            _opt_str(params, "currency") or (pending[0].obj["currency"] if pending else "usd")
        ).lower()
        if behavior == "include":
            for record in pending:
                if record.obj["currency"] == currency:
                    record.obj["invoice"] = invoice_id
        self.invoices[invoice_id] = {
            "id": invoice_id,
            "object": "invoice",
            "auto_advance": auto,
            "collection_method": collection,
            "created": call.now,
            "currency": currency,
            "customer": customer_id,
            "description": _opt_str(params, "description"),
            "livemode": False,
            "metadata": metadata,
            "number": None,
            "status": "draft",
        }
        return _Result(self._render_invoice(invoice_id), invoice_id, mutated=True)

    def get_invoice(self, call: _Call) -> _Result:
        _check_params(call.params, _RETRIEVE)
        invoice_id = call.path_id or ""
        if invoice_id not in self.invoices:
            raise _missing("invoice", invoice_id, "id")
        return _Result(self._render_invoice(invoice_id), invoice_id)

    def _render_invoice(self, invoice_id: str) -> JsonObject:
        base = self.invoices[invoice_id]
        lines = [
            {
                "id": "il_" + r.obj["id"].removeprefix("ii_"),
                "object": "line_item",
                "amount": r.obj["amount"],
                "currency": r.obj["currency"],
                "description": r.obj["description"],
                "invoice": invoice_id,
                "invoice_item": r.obj["id"],
                "livemode": False,
                "metadata": r.obj["metadata"],
                "period": r.obj["period"],
                "quantity": 1,
            }
            for r in self.items.values()
            if not r.deleted and r.obj["invoice"] == invoice_id
        ]
        total = sum(int(line["amount"]) for line in lines)
        return {
            **base,
            "amount_due": total,
            "amount_paid": 0,
            "amount_remaining": total,
            "lines": {
                "object": "list",
                "data": lines,
                "has_more": False,
                "total_count": len(lines),
                "url": f"/v1/invoices/{invoice_id}/lines",
            },
            "subtotal": total,
            "total": total,
        }


_Handler = Callable[[_Store, _Call], _Result]
_ROUTES: Final[tuple[tuple[str, re.Pattern[str], _Handler], ...]] = (
    ("POST", re.compile(r"/v1/customers"), _Store.create_customer),
    ("GET", re.compile(r"/v1/customers/search"), _Store.search_customers),
    ("GET", re.compile(r"/v1/customers/(?P<id>[^/]+)"), _Store.get_customer),
    ("POST", re.compile(r"/v1/invoiceitems"), _Store.create_invoice_item),
    ("GET", re.compile(r"/v1/invoiceitems"), _Store.list_invoice_items),
    ("GET", re.compile(r"/v1/invoiceitems/search"), _Store.search_invoice_items),
    ("GET", re.compile(r"/v1/invoiceitems/(?P<id>[^/]+)"), _Store.get_invoice_item),
    ("DELETE", re.compile(r"/v1/invoiceitems/(?P<id>[^/]+)"), _Store.delete_invoice_item),
    ("POST", re.compile(r"/v1/invoices"), _Store.create_invoice),
    ("GET", re.compile(r"/v1/invoices/(?P<id>[^/]+)"), _Store.get_invoice),
)


def _resolve(method: str, path: str) -> tuple[_Handler, str | None] | None:
    for route_method, pattern, handler in _ROUTES:
        match = pattern.fullmatch(path)
        if match is not None and route_method == method:
            return handler, match.groupdict().get("id")
    return None


# --------------------------------------------------------------------------------------------
# HTTP plumbing


def _should_retry(status: int) -> str | None:
    if status in (409, 429) or status >= 500:
        return "true"
    if 400 <= status < 500:
        return "false"
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], emulator: StripeEmulator) -> None:
        self.emulator = emulator
        super().__init__(address, _RequestHandler)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stripe-emulator/1.0"

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        emulator = cast(_Server, self.server).emulator
        if emulator.log_requests:
            sys.stderr.write(f"stripe-emulator {self.address_string()} {format % args}\n")

    def _dispatch(self) -> None:
        self.close_connection = True  # one request per connection: no stale keep-alive sockets
        emulator = cast(_Server, self.server).emulator
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0:
            self._write(_Reply(400, _dumps({"error": {"message": "bad Content-Length"}})))
            return
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        if split.path == _CONTROL_PREFIX or split.path.startswith(_CONTROL_PREFIX + "/"):
            reply: _Reply | None = emulator._handle_control(
                self.command, split.path, split.query, body
            )
        else:
            reply = emulator._handle_api(
                self.command,
                split.path,
                split.query,
                body,
                authorization=self.headers.get("Authorization"),
                idempotency_key=self.headers.get("Idempotency-Key"),
                stripe_version=self.headers.get("Stripe-Version"),
            )
        if reply is None:
            return  # close the connection without a response
        self._write(reply)

    def _write(self, reply: _Reply) -> None:
        try:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up; nothing to tell it


# --------------------------------------------------------------------------------------------
# the emulator


class StripeEmulator:
    """The emulator, a context manager that serves on ``url`` while entered.

    ``with StripeEmulator() as emu: StripeClient(key, base_addresses={"api": emu.url})``.

    All state is guarded by one lock (``threading.Condition`` over it, so tests can await
    conditions such as "this idempotency key is in flight").
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        key_ttl_s: float = DEFAULT_KEY_TTL_S,
        latency_ms: float = 0.0,
        error_rate: float = 0.0,
        outage: bool = False,
        outage_mode: str = "503",
        outage_seconds: float | None = None,
        rate_limit_per_s: int | None = None,
        drop_response_after_execute: int = 0,
        drop_response_probability: float = 0.0,
        seed: int | None = None,
        log_requests: bool = False,
    ) -> None:
        self._host = host
        self._port = port
        self.log_requests = log_requests
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._started_at = time.monotonic()
        self._initial: dict[str, object] = {
            "key_ttl_s": key_ttl_s,
            "latency_ms": latency_ms,
            "error_rate": error_rate,
            "outage": outage or outage_seconds is not None,  # a window implies an outage
            "outage_mode": outage_mode,
            "outage_seconds": outage_seconds,
            "rate_limit_per_s": rate_limit_per_s,
            "drop_response_after_execute": drop_response_after_execute,
            "drop_response_probability": drop_response_probability,
            "seed": seed,
        }
        self._settings = EmulatorSettings()
        self._outage_until: float | None = None
        self._rng = random.Random(seed)
        self._store = _Store()
        self._keys: dict[tuple[str, str], _KeyEntry] = {}
        self._last_sweep = 0.0
        self._ledger: list[JsonObject] = []
        self._requests: list[JsonObject] = []
        self._admitted: deque[float] = deque()
        with self._cond:
            self._reset_locked()  # validates the arguments (ValueError)

    # lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and serve in a daemon thread.  Idempotent."""
        if self._server is None:
            self._server = _Server((self._host, self._port), self)
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"stripe-emulator:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket.  Idempotent."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the requested one until :meth:`start`)."""
        if self._server is None:
            return self._port
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port``; only valid once started."""
        if self._server is None:
            raise RuntimeError("StripeEmulator is not started")
        return f"http://{self._host}:{self.port}"

    # control API (Python) -----------------------------------------------------------------

    def set_faults(self, **settings: object) -> dict[str, Any]:
        """Change any :class:`EmulatorSettings` field (partial update); return all settings."""
        with self._cond:
            self._update_settings_locked(settings)
            return self._settings_view_locked()

    def faults(self) -> dict[str, Any]:
        """The current settings, with ``outage`` reflecting whether an outage is on right now."""
        with self._cond:
            return self._settings_view_locked()

    def reset(self) -> None:
        """Forget all objects, keys, ledger and request log; restore the start-up settings."""
        with self._cond:
            self._reset_locked()
            self._cond.notify_all()

    def ledger(self) -> list[dict[str, Any]]:
        """Every executed mutation, oldest first (see module docs for the fields)."""
        with self._cond:
            return json.loads(json.dumps(self._ledger))  # type: ignore[no-any-return]

    def requests(self) -> list[dict[str, Any]]:
        """Every API request received, oldest first, with the status it got (None if none)."""
        with self._cond:
            return json.loads(json.dumps(self._requests))  # type: ignore[no-any-return]

    def invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """All invoice items ever created (live and deleted), each with ``deleted``."""
        with self._cond:
            return self._invoice_items_locked(txn_id, live_only=False)

    def live_invoice_items(self, txn_id: str | None = None) -> list[dict[str, Any]]:
        """Live (not deleted) invoice items, optionally only those with ``metadata.txn_id``."""
        with self._cond:
            return self._invoice_items_locked(txn_id, live_only=True)

    def health(self) -> dict[str, Any]:
        with self._cond:
            return {
                "ok": True,
                "uptime_s": round(time.monotonic() - self._started_at, 3),
                "faults": self._settings_view_locked(),
            }

    def wait_for_in_flight(self, idempotency_key: str, timeout: float = 5.0) -> bool:
        """Block until a request holding ``idempotency_key`` is executing; False on timeout."""

        def in_flight() -> bool:
            return any(
                scope[1] == idempotency_key and entry.in_flight
                for scope, entry in self._keys.items()
            )

        with self._cond:
            return self._cond.wait_for(in_flight, timeout=timeout)

    # internals: settings ------------------------------------------------------------------

    def _reset_locked(self) -> None:
        self._store = _Store()
        self._keys.clear()
        self._ledger.clear()
        self._requests.clear()
        self._admitted.clear()
        self._settings = EmulatorSettings()
        self._outage_until = None
        self._update_settings_locked(self._initial)
        self._rng = random.Random(self._settings.seed)

    def _update_settings_locked(self, updates: Mapping[str, object]) -> None:
        flat = _flatten_outage(updates)
        changes = {name: _coerce_setting(name, value) for name, value in flat.items()}
        new = replace(self._settings, **changes)  # type: ignore[arg-type]
        now = time.monotonic()
        if changes.get("outage") is False:
            new = replace(new, outage=False, outage_seconds=None)
            self._outage_until = None
        elif (seconds := new.outage_seconds) is not None and "outage_seconds" in changes:
            new = replace(new, outage=True)
            self._outage_until = now + seconds  # a window
        elif changes.get("outage") is True or "outage_seconds" in changes:
            new = replace(new, outage_seconds=None)
            self._outage_until = None  # on (or left as it was) until switched off
        self._settings = new
        if "seed" in changes:
            self._rng = random.Random(new.seed)

    def _outage_active_locked(self, now: float) -> bool:
        if not self._settings.outage:
            return False
        if self._outage_until is not None and now >= self._outage_until:
            self._settings = replace(self._settings, outage=False, outage_seconds=None)
            self._outage_until = None
            return False
        return True

    def _settings_view_locked(self) -> dict[str, Any]:
        now = time.monotonic()
        active = self._outage_active_locked(now)
        view = asdict(self._settings)
        view["outage"] = active
        view["outage_remaining_s"] = (
            round(self._outage_until - now, 3) if active and self._outage_until else None
        )
        return view

    def _invoice_items_locked(self, txn_id: str | None, *, live_only: bool) -> list[JsonObject]:
        out: list[JsonObject] = []
        for record in self._store.items.values():
            if live_only and record.deleted:
                continue
            if txn_id is not None and record.obj["metadata"].get("txn_id") != txn_id:
                continue
            entry = {**record.obj, "deleted": record.deleted, "deleted_at": record.deleted_at}
            out.append(json.loads(json.dumps(entry)))
        return out

    # internals: the API pipeline ----------------------------------------------------------

    def _handle_api(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        *,
        authorization: str | None,
        idempotency_key: str | None,
        stripe_version: str | None,
    ) -> _Reply | None:
        """Answer one API request; ``None`` means: close the connection without a response."""
        request_id = _new_id("req_", 14)
        record: JsonObject = {
            "request_id": request_id,
            "method": method,
            "path": path,
            "idempotency_key": idempotency_key,
            "status": None,
            "outcome": "pending",
            "at": time.time(),
        }
        headers = [("Request-Id", request_id), ("Stripe-Version", stripe_version or "emulator")]
        if idempotency_key is not None:
            headers.append(("Idempotency-Key", idempotency_key))
        with self._cond:
            self._requests.append(record)
            admission = self._admit_locked(
                record,
                method=method,
                path=path,
                query=query,
                body=body,
                api_key=_bearer_key(authorization),
                idempotency_key=idempotency_key,
            )
            latency_s = self._settings.latency_ms / 1000.0
            if admission.reply is not None:
                record["status"] = admission.reply.status
            self._cond.notify_all()
        if admission.refuse:
            return None
        if latency_s > 0:
            time.sleep(latency_s)  # with the key (if any) held in flight
        if admission.job is not None:
            return self._run(admission.job, record, headers)
        assert admission.reply is not None
        reply = admission.reply
        return _Reply(reply.status, reply.body, (*headers, *reply.headers))

    def _reject_locked(self, record: JsonObject, error: _ApiError, outcome: str) -> _Admission:
        record["outcome"] = outcome
        body = _dumps(error.payload(str(record["request_id"])))
        return _Admission(reply=_Reply(error.status, body, _error_headers(error)))

    def _admit_locked(
        self,
        record: JsonObject,
        *,
        method: str,
        path: str,
        query: str,
        body: bytes,
        api_key: str | None,
        idempotency_key: str | None,
    ) -> _Admission:
        """Everything decided before execution: outage, auth, 429, injected 500, key lookup."""
        request_id = str(record["request_id"])
        now = time.monotonic()
        if self._outage_active_locked(now):
            if self._settings.outage_mode == "refuse":
                record["outcome"] = "refused"
                return _Admission(refuse=True)
            return self._reject_locked(record, _outage_error(), "outage")
        if api_key is None:
            return self._reject_locked(record, _auth_error(), "unauthenticated")
        if self._rate_limited_locked(now):
            return self._reject_locked(record, _rate_limit_error(), "rate_limited")
        if self._settings.error_rate > 0 and self._rng.random() < self._settings.error_rate:
            return self._reject_locked(record, _injected_error(), "injected_error")
        route = _resolve(method, path)
        if route is None:
            error = _ApiError(
                404, "invalid_request_error", f"Unrecognized request URL ({method}: {path})."
            )
            return self._reject_locked(record, error, "rejected")
        try:
            pairs = _request_pairs(method, query, body)
            params = _parse_form(pairs)
        except _ApiError as exc:
            return self._reject_locked(record, exc, "rejected")
        handler, path_id = route
        job = _Job(handler, method, path, params, path_id, request_id, idempotency_key, None, None)
        if idempotency_key is None or method not in _MUTATING_METHODS:
            return _Admission(job=job)
        return self._claim_key_locked(job, api_key, pairs, record, now)

    def _claim_key_locked(
        self,
        job: _Job,
        api_key: str,
        pairs: list[tuple[str, str]],
        record: JsonObject,
        now: float,
    ) -> _Admission:
        key = job.idempotency_key or ""
        if len(key) > _MAX_IDEMPOTENCY_KEY_LEN:
            error = _invalid(
                f"Idempotency keys can be at most {_MAX_IDEMPOTENCY_KEY_LEN} characters long."
            )
            return self._reject_locked(record, error, "rejected")
        self._sweep_keys_locked(now)
        scope = (api_key, key)
        fingerprint = (job.method, job.path, tuple(sorted(pairs)))
        entry = self._keys.get(scope)
        if entry is not None and not entry.in_flight and now - entry.created >= self._ttl():
            del self._keys[scope]  # expired: the key is new again
            entry = None
        if entry is None:
            entry = _KeyEntry(fingerprint, now, job.request_id)
            self._keys[scope] = entry
            job.entry, job.scope = entry, scope
            return _Admission(job=job)
        if entry.fingerprint != fingerprint:
            return self._reject_locked(record, _idempotency_mismatch(key), "idempotency_mismatch")
        if entry.in_flight:
            return self._reject_locked(record, _idempotency_in_use(key), "idempotency_in_use")
        record["outcome"] = "replayed"
        replay_headers = [("Idempotent-Replayed", "true"), ("Original-Request", entry.request_id)]
        retry = _should_retry(entry.status)
        if retry is not None:
            replay_headers.append(("Stripe-Should-Retry", retry))
        return _Admission(reply=_Reply(entry.status, entry.body, tuple(replay_headers)))

    def _ttl(self) -> float:
        return self._settings.key_ttl_s

    def _sweep_keys_locked(self, now: float) -> None:
        if now - self._last_sweep < 1.0:
            return
        self._last_sweep = now
        ttl = self._ttl()
        for scope in [
            s for s, e in self._keys.items() if not e.in_flight and now - e.created >= ttl
        ]:
            del self._keys[scope]

    def _rate_limited_locked(self, now: float) -> bool:
        limit = self._settings.rate_limit_per_s
        window = self._admitted
        while window and now - window[0] >= 1.0:
            window.popleft()
        if limit is not None and len(window) >= limit:
            return True
        window.append(now)
        return False

    def _run(self, job: _Job, record: JsonObject, headers: list[tuple[str, str]]) -> _Reply | None:
        """Execute an admitted request under the lock, save it under its key, maybe drop it."""
        with self._cond:
            status, body, extra, executed = self._execute_locked(job)
            drop = executed and job.method in _MUTATING_METHODS and self._drop_next_locked()
            record["status"] = status
            record["outcome"] = "dropped" if drop else "executed"
            self._cond.notify_all()
        if drop:
            return None
        return _Reply(status, body, (*headers, *extra))

    def _execute_locked(self, job: _Job) -> tuple[int, bytes, tuple[tuple[str, str], ...], bool]:
        """Run the handler; returns status, body, extra headers and whether it executed.

        "Executed" means the endpoint ran (a success, or an error raised after execution began,
        e.g. an unknown customer); such results are saved under the idempotency key.  Parameter
        validation failures and emulator bugs are not saved, so a retry with the key runs anew.
        """
        call = _Call(job.params, job.path_id, int(time.time()))
        saved = True
        extra: tuple[tuple[str, str], ...] = ()
        result: _Result | None
        try:
            result = job.handler(self._store, call)
            status, body = result.status, _dumps(result.payload)
        except _ApiError as exc:
            result = None
            saved = exc.saved
            status, body, extra = (
                exc.status,
                _dumps(exc.payload(job.request_id)),
                _error_headers(exc),
            )
        except Exception:  # a bug in the emulator: report it like Stripe would, do not save it
            traceback.print_exc(file=sys.stderr)
            result, saved = None, False
            error = _ApiError(500, "api_error", "The Stripe emulator failed unexpectedly.")
            status, body, extra = 500, _dumps(error.payload(job.request_id)), _error_headers(error)
        if job.entry is not None and job.scope is not None:
            if saved:
                job.entry.in_flight, job.entry.status, job.entry.body = False, status, body
            elif self._keys.get(job.scope) is job.entry:
                del self._keys[job.scope]
        if result is not None and result.mutated:
            self._ledger.append(
                {
                    "request_id": job.request_id,
                    "method": job.method,
                    "path": job.path,
                    "idempotency_key": job.idempotency_key,
                    "object_id": result.object_id,
                    "params": job.params,
                    "at": time.time(),
                }
            )
        return status, body, extra, saved

    def _drop_next_locked(self) -> bool:
        settings = self._settings
        if settings.drop_response_after_execute > 0:
            self._settings = replace(
                settings, drop_response_after_execute=settings.drop_response_after_execute - 1
            )
            return True
        probability = settings.drop_response_probability
        return probability > 0 and self._rng.random() < probability

    # internals: the control API over HTTP -------------------------------------------------

    def _handle_control(self, method: str, path: str, query: str, body: bytes) -> _Reply:
        name = path[len(_CONTROL_PREFIX) :].strip("/")
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        try:
            payload = self._control(method, name, params, body)
        except ValueError as exc:
            return _Reply(400, _dumps({"error": {"message": str(exc)}}))
        if payload is None:
            message = f"unknown control endpoint {method} {path}"
            return _Reply(404, _dumps({"error": {"message": message}}))
        return _Reply(200, _dumps(payload))

    def _control(self, method: str, name: str, params: dict[str, str], body: bytes) -> object:
        live = params.get("live") == "true"
        getters: dict[str, Callable[[], object]] = {
            "health": self.health,
            "faults": self.faults,
            "ledger": self.ledger,
            "requests": self.requests,
            "invoiceitems": lambda: (self.live_invoice_items if live else self.invoice_items)(
                params.get("txn_id")
            ),
        }
        if method == "GET" and name in getters:
            return getters[name]()
        if method == "POST" and name == "faults":
            updates = _json_object(body)
            return self.set_faults(**updates)
        if method == "POST" and name == "reset":
            self.reset()
            return {"ok": True, "faults": self.faults()}
        return None


def _json_object(body: bytes) -> dict[str, object]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError("body must be a JSON object")
    return value


def _error_headers(error: _ApiError) -> tuple[tuple[str, str], ...]:
    retry = _should_retry(error.status)
    base = error.headers
    return base if retry is None else (*base, ("Stripe-Should-Retry", retry))


def _outage_error() -> _ApiError:
    return _ApiError(503, "api_error", "Stripe is temporarily unavailable (emulated outage).")


def _auth_error() -> _ApiError:
    return _ApiError(
        401,
        "invalid_request_error",
        "You did not provide an API key. You need to provide your API key in the "
        "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
    )


def _rate_limit_error() -> _ApiError:
    return _ApiError(
        429,
        "rate_limit_error",
        "Request rate limit exceeded. Learn more about rate limits here "
        "https://stripe.com/docs/rate-limits.",
        code="rate_limit",
        headers=(("Retry-After", "1"),),
    )


def _injected_error() -> _ApiError:
    return _ApiError(500, "api_error", "An unknown error occurred (injected by the emulator).")


def _idempotency_mismatch(key: str) -> _ApiError:
    return _ApiError(
        400,
        "idempotency_error",
        "Keys for idempotent requests can only be used with the same parameters they were first "
        f"used with. Try using a key other than '{key}' if you meant to execute a different "
        "request.",
        code="idempotency_key_mismatch",
    )


def _idempotency_in_use(key: str) -> _ApiError:
    return _ApiError(
        409,
        "idempotency_error",
        f"There is currently another in-progress request using this idempotent key ('{key}'). "
        "That probably means you submitted twice, and the other request is still going "
        "through. Please try again later.",
        code="idempotency_key_in_use",
    )


# --------------------------------------------------------------------------------------------
# CLI


def _arg_type(name: str) -> Callable[[str], object]:
    """An argparse ``type`` that parses a number and validates it like the control API."""

    def parse(text: str) -> object:
        try:
            value: object = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if name in ("drop_response_after_execute", "rate_limit_per_s", "seed") and not isinstance(
            value, int
        ):
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
        try:
            return _coerce_setting(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in its messages
    return parse


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.stripe_emulator",
        description="Serve an emulation of Stripe's v1 API (customers, invoice items, invoices) "
        "with fault injection. Control API under /_emulator/.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)"
    )
    numeric = {
        "key_ttl_s": f"idempotency key lifetime in seconds (default {DEFAULT_KEY_TTL_S:g})",
        "latency_ms": "latency added to every API request, in ms",
        "error_rate": "probability (0..1) of an injected 500",
        "outage_seconds": "start with an outage that ends after this many seconds",
        "rate_limit_per_s": "admit at most this many API requests per sliding second (429 above)",
        "drop_response_after_execute": "drop the response of the next N POST/DELETE executions",
        "drop_response_probability": "probability (0..1) of dropping a POST/DELETE response",
        "seed": "random seed for injected errors and drops",
    }
    for name, help_text in numeric.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=_arg_type(name), default=None, help=help_text)
    parser.add_argument("--outage", action="store_true", help="start with an outage on")
    parser.add_argument(
        "--outage-mode", choices=_OUTAGE_MODES, default="503", help="outage behaviour"
    )
    parser.add_argument("--log-requests", action="store_true", help="log each request to stderr")
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {port}")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator in the foreground until SIGINT or SIGTERM."""
    args = _build_parser().parse_args(argv)
    options: dict[str, Any] = {
        name: getattr(args, name)
        for name in _SETTING_NAMES
        if name not in ("outage", "outage_mode") and getattr(args, name) is not None
    }
    emulator = StripeEmulator(
        host=args.host,
        port=args.port,
        outage=args.outage,
        outage_mode=args.outage_mode,
        log_requests=args.log_requests,
        **options,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    try:
        emulator.start()
    except OSError as exc:
        print(f"stripe emulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"stripe emulator listening on {emulator.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        emulator.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
