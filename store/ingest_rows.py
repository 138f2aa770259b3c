"""The ingest's fast path: a batch's new transactions as stored rows, straight from the
decision, with their hash-chain hashes.

Saving a batch the general way builds two event objects per record (``Metered``, then
``Reserved``), copies each one's ``vars()`` into a dict for the mapper, encodes it,
wraps it in a ``StoredEvent`` and chains it with the recorder's general ``_chain``:
about half of an ingest process's CPU. Every transaction of a batch is new, so its
rows are known from ``domain.metering_events.NewTransaction`` alone: this module writes
the very bytes the mapper and ``OrjsonTranscoder`` write for those events (the same
keys in the same order, each registered type as its transcoding writes it) and the
very hashes the recorder computes (``domain.chain``: version 1 links to ``GENESIS``,
version 2 to version 1). One timestamp serves the batch's transaction events, read
through the same ``create_timestamp`` the events would call.

It is only the common case. ``store.ledger.BillingLedger.record_usage`` takes it for
a batch's first attempt when the limit refused none of it; a refused record, a batch
retried after losing a race, and anything not this module's shape take the events.
A value the flat encoding cannot write (an integer beyond 64 bits) is encoded by the
transcoder itself, as the mapper would. ``tests/unit/test_ingest_rows.py`` and
``tests/integration/test_ingest_rows_stored.py`` prove the rows byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from eventsourcing.persistence import Transcoder
from eventsourcing.utils import get_topic

from domain.chain import GENESIS, link_hash, topic_header
from domain.metering_events import NewTransaction
from domain.transaction import BillingTransaction

__all__ = ["Row", "transaction_rows"]

Row = tuple[UUID, int, str, bytes, bytes, bytes]
"""A stored event as copied: id, version, topic, state, previous hash, hash."""

_TXN_TOPIC = get_topic(BillingTransaction)
_METERED = get_topic(BillingTransaction.Metered)
_RESERVED = get_topic(BillingTransaction.Reserved)
_METERED_HEADER = topic_header(_METERED)
_RESERVED_HEADER = topic_header(_RESERVED)
_METERED_VERSION = BillingTransaction.Metered.class_version
_RESERVED_VERSION = BillingTransaction.Reserved.class_version
_FIRST = BillingTransaction.INITIAL_VERSION
_V1 = _FIRST.to_bytes(8, "big")


def transaction_rows(transactions: Sequence[NewTransaction], transcoder: Transcoder) -> list[Row]:
    """Each transaction's Metered and Reserved rows, in batch order (see the module
    docstring). Raises ValueError for a transaction that is not reserved."""
    stamp = BillingTransaction.Metered.create_timestamp()
    timestamp = _typed("datetime_iso", stamp.isoformat())
    rows: list[Row] = []
    append = rows.append
    for txn in transactions:
        r = txn.reservation
        if r is None:
            raise ValueError(f"transaction {txn.id} is not reserved: it takes the events")
        f = txn.fields
        metered = {
            "timestamp": timestamp,
            "originator_topic": _TXN_TOPIC,
            "customer_id": f["customer_id"],
            "usage_id": f["usage_id"],
            "meter": f["meter"],
            "quantity": _typed("decimal_str", str(f["quantity"])),
            "unit_price": _typed("decimal_str", str(f["unit_price"])),
            "per": f["per"],
            "amount": _typed("decimal_str", str(f["amount"])),
            "currency": f["currency"],
            "occurred_at": _typed("datetime_iso", f["occurred_at"].isoformat()),
            "source": f["source"],
            "price_book_id": _typed("uuid_hex", f["price_book_id"].hex),
            "price_version": f["price_version"],
            "contract_version": f["contract_version"],
            "class_version": _METERED_VERSION,
        }
        reserved = {
            "timestamp": timestamp,
            "account_id": _typed("uuid_hex", r.account_id.hex),
            "line_id": _typed("uuid_hex", r.line_id.hex),
            "line_version": r.line_version,
            "class_version": _RESERVED_VERSION,
        }
        txn_id = txn.id
        id_bytes = txn_id.bytes
        state = _encode(metered, f, stamp, transcoder, _METERED_FIELDS)
        first = link_hash(GENESIS, id_bytes, _FIRST, _METERED_HEADER, state)
        append((txn_id, _FIRST, _METERED, state, GENESIS, first))
        then = _encode(reserved, vars(r), stamp, transcoder, _RESERVED_FIELDS)
        second = link_hash(first, id_bytes, _FIRST + 1, _RESERVED_HEADER, then)
        append((txn_id, _FIRST + 1, _RESERVED, then, first, second))
    return rows


_METERED_FIELDS = (
    "customer_id", "usage_id", "meter", "quantity", "unit_price", "per", "amount",
    "currency", "occurred_at", "source", "price_book_id", "price_version",
    "contract_version",
)  # fmt: skip
_RESERVED_FIELDS = ("account_id", "line_id", "line_version")


def _typed(name: str, data: str) -> dict[str, str]:
    return {"_type_": name, "_data_": data}


def _encode(
    flat: dict[str, Any],
    values: dict[str, Any],
    stamp: datetime,
    transcoder: Transcoder,
    names: tuple[str, ...],
) -> bytes:
    """``flat`` as orjson writes it, or else the event's state as the transcoder writes
    it (the mapper's bytes) when orjson cannot."""
    try:
        return orjson.dumps(flat)
    except TypeError:  # orjson.JSONEncodeError: e.g. an int beyond 64 bits
        pass
    state = {"timestamp": stamp, **({"originator_topic": _TXN_TOPIC} if "meter" in values else {})}
    state.update((n, values[n]) for n in names)
    state["class_version"] = flat["class_version"]
    return transcoder.encode(state)
