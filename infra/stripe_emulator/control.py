"""The control API over HTTP: ``/_emulator/...`` (JSON, no authentication).

This module owns the mapping from control paths to :class:`~.emulator.StripeEmulator`
methods, so that a process outside the tests (or ``curl``) can do what a test does in
Python.  A ``ValueError`` from a method is a 400, a ``LookupError`` (unknown id) a 404, and
an unknown path a 404.

Endpoints::

    GET    health | faults | ledger | requests          the views
    GET    invoiceitems?txn_id=&live=true                invoice items (live ones only)
    GET    invoices?customer=  credit_notes?invoice=  events?type=
    GET    webhook_endpoints  webhook_deliveries?event_id=
    POST   faults                     partial settings update (a JSON object)
    POST   reset                      forget everything, restore the start-up settings
    POST   webhook_endpoints          {"url": ..., "secret": ..., "events": [...]}
    DELETE webhook_endpoints/{id}     stop delivering there
    POST   webhooks/wait              {"timeout": 5} -> {"done": true|false}
    POST   events/{id}/resend         {"endpoint_id": ..., "t": ...} -> {"queued": n}
    POST   invoices/{id}/pay          the customer paid
    POST   invoices/{id}/fail_payment a payment attempt failed
    POST   customers/{id}/card_declined  {"declined": true|false}
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from .api import Reply
from .forms import dumps
from .server import CONTROL_PREFIX

if TYPE_CHECKING:
    from .emulator import StripeEmulator

__all__ = ["handle_control", "json_object"]

_ACTION_RE: Final = re.compile(r"(?P<kind>[a-z_]+)/(?P<id>[^/]+)(?:/(?P<action>[a-z_]+))?")


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
    except LookupError as exc:
        return Reply(404, dumps({"error": {"message": str(exc).strip("'\"")}}))
    if payload is None:
        message = f"unknown control endpoint {method} {path}"
        return Reply(404, dumps({"error": {"message": message}}))
    return Reply(200, dumps(payload))


def _control(
    emulator: StripeEmulator, method: str, name: str, params: dict[str, str], body: bytes
) -> object:
    if method == "GET":
        getter = _getters(emulator, params).get(name)
        return None if getter is None else getter()
    if method == "POST" and name == "faults":
        return emulator.set_faults(**json_object(body))
    if method == "POST" and name == "reset":
        emulator.reset()
        return {"ok": True, "faults": emulator.faults()}
    if method == "POST" and name == "webhook_endpoints":
        return _add_endpoint(emulator, json_object(body))
    if method == "POST" and name == "webhooks/wait":
        timeout = _number(json_object(body).get("timeout", 10.0), "timeout")
        return {"done": emulator.wait_for_webhooks(timeout)}
    match = _ACTION_RE.fullmatch(name)
    if match is None:
        return None
    return _object_action(
        emulator,
        method,
        kind=match["kind"],
        object_id=match["id"],
        action=match["action"],
        body=body,
    )


def _getters(emulator: StripeEmulator, params: dict[str, str]) -> dict[str, Callable[[], object]]:
    live = params.get("live") == "true"
    return {
        "health": emulator.health,
        "faults": emulator.faults,
        "ledger": emulator.ledger,
        "requests": emulator.requests,
        "invoiceitems": lambda: (emulator.live_invoice_items if live else emulator.invoice_items)(
            params.get("txn_id")
        ),
        "invoices": lambda: emulator.invoices(params.get("customer")),
        "credit_notes": lambda: emulator.credit_notes(params.get("invoice")),
        "events": lambda: emulator.events(params.get("type")),
        "webhook_endpoints": emulator.webhook_endpoints,
        "webhook_deliveries": lambda: emulator.webhook_deliveries(params.get("event_id")),
    }


def _object_action(
    emulator: StripeEmulator,
    method: str,
    *,
    kind: str,
    object_id: str,
    action: str | None,
    body: bytes,
) -> object:
    key = (method, kind, action)
    if key == ("DELETE", "webhook_endpoints", None):
        if not emulator.remove_webhook_endpoint(object_id):
            raise LookupError(f"no such webhook endpoint: {object_id!r}")
        return {"id": object_id, "deleted": True}
    if key == ("POST", "invoices", "pay"):
        return emulator.pay_invoice(object_id)
    if key == ("POST", "invoices", "fail_payment"):
        return emulator.fail_payment(object_id)
    if key == ("POST", "customers", "card_declined"):
        declined = json_object(body).get("declined", True)
        if not isinstance(declined, bool):
            raise ValueError(f"declined must be true or false, got {declined!r}")
        emulator.set_card_declined(object_id, declined)
        return {"customer": object_id, "card_declined": declined}
    if key == ("POST", "events", "resend"):
        options = json_object(body)
        endpoint_id = options.get("endpoint_id")
        t = options.get("t")
        if endpoint_id is not None and not isinstance(endpoint_id, str):
            raise ValueError(f"endpoint_id must be a string, got {endpoint_id!r}")
        if t is not None and (isinstance(t, bool) or not isinstance(t, int)):
            raise ValueError(f"t must be a Unix timestamp (integer), got {t!r}")
        return {"queued": emulator.resend_event(object_id, endpoint_id=endpoint_id, t=t)}
    return None


def _add_endpoint(emulator: StripeEmulator, options: dict[str, object]) -> object:
    url, secret = options.get("url"), options.get("secret")
    events = options.get("events", options.get("enabled_events"))
    if not isinstance(url, str):
        raise ValueError(f"url must be a string, got {url!r}")
    if secret is not None and not isinstance(secret, str):
        raise ValueError(f"secret must be a string, got {secret!r}")
    if events is not None and not (
        isinstance(events, list) and all(isinstance(e, str) for e in events)
    ):
        raise ValueError(f"events must be a list of event types, got {events!r}")
    return emulator.add_webhook_endpoint(url, secret, events)


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)
