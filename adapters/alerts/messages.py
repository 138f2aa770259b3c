"""The alert document: what ``billing.alerts`` carries and what a webhook's body is.

The relay turns each stored ``CustomerAccount.AlertCrossed`` event into one document
(``alert_document``), keyed by customer id on the ``billing.alerts`` topic; the alert
webhooks send the same bytes. The format (docs/reference/alerts.md):

```json
{"id": "5f0c...", "type": "alert.crossed", "created_at": "2026-12-05T07:30:00.123456+00:00",
 "customer_id": "acme", "currency": "USD",
 "threshold": {"kind": "percent_of_limit", "value": 80}, "period": "2026-12-01T00:00:00Z",
 "usage_id": "u-1042", "transaction_id": "9b1e...", "value": "8000.5",
 "spend_limit": 10000, "grant_id": null, "notification_id": 4711}
```

``id`` is the crossing's id (the same account, threshold and period, or grant, the same
id: a receiver deduplicates by it); ``grant_id`` the grant a ``percent_of_grant``
threshold watched (null for the other kinds); ``value`` the measure that reached the
threshold, exact minor units as decimal text; ``notification_id`` the event's position
in the store.
Decoding is total: a stored state that is not such an event gives None (logged by the
caller), never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eventsourcing.utils import get_topic

from domain.account import CustomerAccount

__all__ = ["ALERT_CROSSED", "ALERT_EVENT_TOPIC", "EVENT_TYPES", "Alert", "alert_document"]

ALERT_CROSSED = "alert.crossed"
EVENT_TYPES = (ALERT_CROSSED,)  # what an endpoint may subscribe to
ALERT_EVENT_TOPIC = get_topic(CustomerAccount.AlertCrossed)

_TEXT_FIELDS = ("alert_id", "customer_id", "currency", "threshold", "period", "usage_id")


@dataclass(frozen=True)
class Alert:
    """One alert document: its id, type, customer and exact bytes."""

    id: str
    type: str
    customer_id: str
    body: bytes


def alert_document(state: Any, notification_id: int) -> Alert | None:
    """The document for a stored AlertCrossed event's state (its JSON, decoded), or None
    when the state is not one."""
    if not isinstance(state, dict):
        return None
    if not all(isinstance(state.get(k), str) for k in (*_TEXT_FIELDS, "transaction_id")):
        return None
    kind, _, value = state["threshold"].partition(":")
    # ASCII digits only (str.isdigit() also takes "²", which int() refuses), and no more
    # of them than int() reads (sys.get_int_max_str_digits): else no document, no stop.
    if not (value.isascii() and value.isdigit()) or not isinstance(state.get("value"), str):
        return None
    try:
        threshold = int(value)
    except ValueError:
        return None
    limit = state.get("spend_limit")
    grant = state.get("grant_id")
    stamp = state.get("timestamp")
    created = stamp.get("_data_") if isinstance(stamp, dict) else None
    document = {
        "id": state["alert_id"],
        "type": ALERT_CROSSED,
        "created_at": created if isinstance(created, str) else None,
        "customer_id": state["customer_id"],
        "currency": state["currency"],
        "threshold": {"kind": kind, "value": threshold},
        "period": state["period"],
        "usage_id": state["usage_id"],
        "transaction_id": state["transaction_id"],
        "value": state["value"],
        "spend_limit": limit if isinstance(limit, int) else None,
        "grant_id": grant if isinstance(grant, str) else None,
        "notification_id": notification_id,
    }
    try:  # a lone surrogate (JSON's "\\ud800" escape) has no UTF-8: not a document either
        body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return None
    return Alert(state["alert_id"], ALERT_CROSSED, state["customer_id"], body)
