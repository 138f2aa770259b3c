"""Events: recording them, and the ``/v1/events`` endpoints.

This module owns the event object (``evt_...``, the object as it was at the change, the
request that caused it, ``pending_webhooks``) and :func:`record_event`, which every state
change calls.  Recording an event hands it to the store's ``on_event`` hook, which queues
its webhook deliveries.  ``GET /v1/events`` lists them newest first, filtered by ``type``
(``invoice.*`` wildcards too), ``types[]`` and ``created``.
"""

from __future__ import annotations

from typing import Final

from .errors import JsonObject, invalid, missing
from .forms import check_params, copy_json, new_id, opt_str
from .listing import LIST_PARAMS, created_filter, list_page
from .store import Call, Record, Result, Store, cursor_of

__all__ = [
    "DEFAULT_API_VERSION",
    "get_event",
    "list_events",
    "previous_attributes",
    "record_event",
    "type_matches",
]

DEFAULT_API_VERSION: Final = "emulator"
"""The ``api_version`` of events caused without a ``Stripe-Version`` header."""

_LIST: Final = LIST_PARAMS | {"type", "types", "created"}
_RETRIEVE: Final = frozenset({"expand"})


def record_event(
    store: Store, type_: str, obj: JsonObject, call: Call, previous: JsonObject | None = None
) -> JsonObject:
    """Record a ``type_`` event about ``obj`` (copied as it is now) and queue its webhooks."""
    data: JsonObject = {"object": copy_json(obj)}
    if previous:
        data["previous_attributes"] = copy_json(previous)
    event_id = new_id("evt_", 24)
    event: JsonObject = {
        "id": event_id,
        "object": "event",
        "api_version": call.api_version or DEFAULT_API_VERSION,
        "created": call.now,
        "data": data,
        "livemode": False,
        "pending_webhooks": 0,
        "request": {"id": call.request_id, "idempotency_key": call.idempotency_key},
        "type": type_,
    }
    store.events[event_id] = Record(event, store.next_seq())
    event["pending_webhooks"] = store.on_event(event)
    return event


def previous_attributes(before: JsonObject, after: JsonObject) -> JsonObject:
    """An update event's ``previous_attributes``: the top-level values that changed (``lines``
    left out); for ``metadata`` only the keys that changed (None for a key that was added)."""
    previous: JsonObject = {}
    for key, old in before.items():
        new = after.get(key)
        if key == "lines" or new == old:
            continue
        if key == "metadata" and isinstance(old, dict) and isinstance(new, dict):
            changed: JsonObject = {k: v for k, v in old.items() if new.get(k) != v}
            changed.update({k: None for k in new if k not in old})
            previous[key] = changed
        else:
            previous[key] = old
    return previous


def type_matches(pattern: str, type_: str) -> bool:
    """Stripe's event type filter: exact, ``*`` for all, or ``prefix.*``."""
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return type_.startswith(pattern[:-1])
    return pattern == type_


def list_events(store: Store, call: Call) -> Result:
    params = call.params
    check_params(params, _LIST)
    single = opt_str(params, "type")
    raw_types = params.get("types")
    if raw_types is not None and not isinstance(raw_types, dict):
        raise invalid("Invalid array", "types")
    patterns = [single] if single is not None else []
    if raw_types:
        if single is not None:
            raise invalid("You may only specify one of these parameters: type, types.", "types")
        patterns = [str(v) for v in raw_types.values()]
    in_range = created_filter(params)
    records = [
        (r.seq, r.obj)
        for r in reversed(store.events.values())
        if in_range(int(r.obj["created"]))
        and (not patterns or any(type_matches(p, r.obj["type"]) for p in patterns))
    ]
    return Result(list_page(records, params, "/v1/events", cursor_of(store.events, "event")))


def get_event(store: Store, call: Call) -> Result:
    check_params(call.params, _RETRIEVE)
    event_id = call.path_id or ""
    record = store.events.get(event_id)
    if record is None:
        raise missing("event", event_id, "id")
    return Result(record.obj, event_id)
