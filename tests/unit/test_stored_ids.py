"""Ids, canonical bodies and wire forms that are stored, pinned to known values.

Every id here names an aggregate in released histories, and a canonical body's SHA-256
is written into dead letters: the literals below were computed once from the code that
wrote those histories and must never change. A test failing here means a change would
orphan stored aggregates (or make a stored hash unmatchable), not that the literal is
out of date.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import ids
from domain.duplicates import Recorded, canonical_body
from domain.ids import (
    account_id,
    customer_link_id,
    invoice_id,
    line_id,
    line_push_id,
    transaction_id,
)
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.periods import Period
from domain.usage import UsageRecord

MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
MAY = datetime(2026, 5, 1, tzinfo=UTC)
MARCH_KEY = "2026-03-01T00:00:00Z"

# The stored ids of released histories: never change these literals.
LINE = UUID("f156f801-92c2-57a5-8174-7dd096944155")  # acme-42, EUR, api.calls:v2, March
LATE_LINE = UUID("822e4202-4201-59a8-a989-f3e9dba5be59")  # the same, on April, late of March
LINE_PUSH = UUID("3532233b-beec-5944-83de-46900d65389c")  # LINE's push record
INVOICE = UUID("bd84b3fa-2300-518c-a991-4ccde864f3a5")  # acme-42, EUR, March
TRANSACTION = UUID("3f8dd717-d58c-5826-870c-32bcb234a16b")  # acme-42, u-1
ACCOUNT = UUID("61e69f11-1938-57a3-906e-7c571741169b")  # acme-42, EUR
CUSTOMER_LINK = UUID("0864e601-666b-59a8-85a5-5f6a54bd0cff")  # acme-42


def test_a_line_id_is_the_stored_one() -> None:
    assert line_id("acme-42", "EUR", "api.calls:v2", MARCH_KEY) == LINE


def test_each_part_of_a_line_id_counts() -> None:
    ids = {
        line_id("acme-42", "EUR", "api.calls:v2", MARCH_KEY),
        line_id("acme-43", "EUR", "api.calls:v2", MARCH_KEY),
        line_id("acme-42", "USD", "api.calls:v2", MARCH_KEY),
        line_id("acme-42", "EUR", "api.calls:v3", MARCH_KEY),
        line_id("acme-42", "EUR", "api.calls:v2", "2026-04-01T00:00:00Z"),
    }
    assert len(ids) == 5


def test_an_invoice_id_is_the_stored_one() -> None:
    assert invoice_id("acme-42", "EUR", MARCH_KEY) == INVOICE
    assert invoice_id("acme-43", "EUR", MARCH_KEY) != INVOICE
    assert invoice_id("acme-42", "USD", MARCH_KEY) != INVOICE


def test_a_line_push_id_is_the_stored_one() -> None:
    assert line_push_id(LINE) == LINE_PUSH
    assert line_push_id(LATE_LINE) != LINE_PUSH


def test_the_other_ids_are_the_stored_ones() -> None:
    assert transaction_id("acme-42", "u-1") == TRANSACTION
    assert account_id("acme-42", "EUR") == ACCOUNT
    assert customer_link_id("acme-42") == CUSTOMER_LINK


def test_the_aggregates_are_created_under_the_stored_ids() -> None:
    march = Period(MARCH, APRIL)
    line = InvoiceLine.open("acme-42", "EUR", "api.calls:v2", march)
    assert line.id == LINE
    late = InvoiceLine.open("acme-42", "EUR", "api.calls:v2", Period(APRIL, MAY), late_of=march)
    assert late.id == LATE_LINE
    assert LinePush(line_id=LINE).id == LINE_PUSH
    assert Invoice.open("acme-42", "EUR", march, LINE).id == INVOICE


# The canonical form of a first record, and its SHA-256 as dead letters hold it.
RECORDED = Recorded(
    customer_id="acme-42",
    usage_id="req-8812",
    meter="gpt-4o.input_tokens",
    quantity=Decimal("1520.500"),
    occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
    currency="EUR",
)
CANONICAL = (
    b'{"currency":"EUR","customer_id":"acme-42","meter":"gpt-4o.input_tokens",'
    b'"occurred_at":"2026-12-02T10:15:00Z","quantity":"1520.5","usage_id":"req-8812"}'
)
CANONICAL_SHA256 = "d947e97e8fd4af5dd05d9076a90423e763c4d1fab8bef2117b3039fab22c83ad"


def test_the_canonical_body_and_its_hash_are_the_stored_ones() -> None:
    assert canonical_body(RECORDED) == CANONICAL
    assert RECORDED.body_sha256() == CANONICAL_SHA256


@pytest.fixture
def kolkata() -> Iterator[None]:
    """The process's local time zone set to UTC+05:30 (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "Asia/Kolkata")
        time.tzset()
        yield
    time.tzset()


@pytest.mark.usefixtures("kolkata")
def test_the_canonical_body_does_not_depend_on_the_machines_time_zone() -> None:
    assert time.localtime(0).tm_gmtoff == 19800  # the zone did change
    assert canonical_body(RECORDED) == CANONICAL


def test_a_records_wire_form_is_compact_json_in_field_order() -> None:
    record = UsageRecord(
        usage_id="req-8812",
        customer_id="acme-42",
        meter="gpt-4o.input_tokens",
        quantity=Decimal("1520.5"),
        occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
        currency="EUR",
    )
    assert record.to_json() == (
        b'{"usage_id":"req-8812","customer_id":"acme-42","meter":"gpt-4o.input_tokens",'
        b'"quantity":"1520.5","occurred_at":"2026-12-02T10:15:00Z","currency":"EUR"}'
    )


@given(namespace=st.uuids(), name=st.text())
def test_the_ids_uuid5_is_the_standard_librarys(namespace: UUID, name: str) -> None:
    """``domain.ids`` computes name-based ids itself, faster: any namespace and any name
    (NULs and astral characters included) give ``uuid.uuid5``'s id."""
    assert ids.uuid5(namespace, name) == uuid.uuid5(namespace, name)


@given(customer=st.text(), usage_id=st.text())
def test_a_transaction_id_is_the_uuid5_of_its_key(customer: str, usage_id: str) -> None:
    expected = uuid.uuid5(ids.NAMESPACE, f"{customer}:{usage_id}")
    assert transaction_id(customer, usage_id) == expected
    assert transaction_id(customer, usage_id).version == 5
