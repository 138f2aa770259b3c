"""The control API over HTTP: ``/_emulator/...`` (JSON, no authentication).

This module owns the mapping from control paths to :class:`~.emulator.StripeEmulator`
methods, so that a process outside the tests (or ``curl``) can do what a test does in
Python.  A ``ValueError`` from a method is a 400; an unknown path is a 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from .api import Reply
from .forms import dumps
from .server import CONTROL_PREFIX

if TYPE_CHECKING:
    from .emulator import StripeEmulator

__all__ = ["handle_control", "json_object"]


def json_object(body: bytes) -> dict[str, object]:
    """The JSON object of a control request body (empty body: ``{}``)."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError("body must be a JSON object")
    return value


def handle_control(
    emulator: StripeEmulator, method: str, path: str, query: str, body: bytes
) -> Reply:
    name = path[len(CONTROL_PREFIX) :].strip("/")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    try:
        payload = _control(emulator, method, name, params, body)
    except ValueError as exc:
        return Reply(400, dumps({"error": {"message": str(exc)}}))
    if payload is None:
        message = f"unknown control endpoint {method} {path}"
        return Reply(404, dumps({"error": {"message": message}}))
    return Reply(200, dumps(payload))


def _control(
    emulator: StripeEmulator, method: str, name: str, params: dict[str, str], body: bytes
) -> object:
    live = params.get("live") == "true"
    getters: dict[str, Callable[[], object]] = {
        "health": emulator.health,
        "faults": emulator.faults,
        "ledger": emulator.ledger,
        "requests": emulator.requests,
        "invoiceitems": lambda: (emulator.live_invoice_items if live else emulator.invoice_items)(
            params.get("txn_id")
        ),
    }
    if method == "GET" and name in getters:
        return getters[name]()
    if method == "POST" and name == "faults":
        return emulator.set_faults(**json_object(body))
    if method == "POST" and name == "reset":
        emulator.reset()
        return {"ok": True, "faults": emulator.faults()}
    return None
