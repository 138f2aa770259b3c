"""Histories written before exact amounts, invoice lines, price books and credit lines
summed per usage line still load (``class_version``).

The stored JSON below is what the previous version of the ledger wrote (no
``class_version``: version 1): an integer amount rounded per record, a ``Reserved``
without a line, a ``Charged`` of the transaction's own invoice item, an account's
integer reservations.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from uuid import uuid4

import orjson
from eventsourcing.persistence import StoredEvent

from domain.account import CustomerAccount
from domain.audit_lines import LineAudit
from domain.credit_line import CreditLine
from domain.invoice import Invoice
from domain.periods import PeriodPolicy
from domain.price_book import INITIAL_VERSION, PRICE_BOOK_ID, PriceBook
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord
from tests.fast.fakes import memory_ledger

TXN = "domain.transaction:BillingTransaction."
ACCOUNT = "domain.account:CustomerAccount."
AT = {"_type_": "datetime_iso", "_data_": "2026-12-01T10:00:00+00:00"}
AT_DT = datetime(2026, 12, 1, 10, tzinfo=UTC)


def _stored(originator: object, version: int, topic: str, state: dict[str, object]) -> StoredEvent:
    return StoredEvent(originator, version, topic, orjson.dumps({"timestamp": AT, **state}))


V1_METERED = {
    "originator_topic": TXN.rstrip("."),
    "customer_id": "acme",
    "usage_id": "old-1",
    "meter": "api.requests",
    "quantity": {"_type_": "decimal_str", "_data_": "250"},
    "unit_price": {"_type_": "decimal_str", "_data_": "0.001"},
    "per": 1,
    "amount": 25,
    "currency": "USD",
    "occurred_at": AT,
    "source": "usage/0@1",
}


def _v1_transaction(txn_id: object, account: object) -> list[StoredEvent]:
    metered = V1_METERED
    return [
        _stored(txn_id, 1, TXN + "Metered", metered),
        _stored(
            txn_id,
            2,
            TXN + "Reserved",
            {"account_id": {"_type_": "uuid_hex", "_data_": account.hex}},
        ),  # type: ignore[attr-defined]
        _stored(txn_id, 3, TXN + "Charged", {"stripe_object_id": "ii_legacy"}),
    ]


def test_a_version_1_transaction_loads_with_an_exact_amount_and_no_line() -> None:
    ledger = memory_ledger()
    txn_id, account = uuid4(), uuid4()
    events = [ledger.mapper.to_domain_event(s) for s in _v1_transaction(txn_id, account)]
    metered, reserved, charged = events
    assert isinstance(metered, BillingTransaction.Metered)
    assert metered.amount == Decimal(25) and isinstance(metered.amount, Decimal)
    assert isinstance(reserved, BillingTransaction.Reserved)
    assert (reserved.account_id, reserved.line_id, reserved.line_version) == (account, None, None)
    assert isinstance(charged, BillingTransaction.Charged)
    assert (charged.stripe_object_id, charged.line_id, charged.sequence) == (
        "ii_legacy",
        None,
        None,
    )


def test_a_version_1_history_rebuilds_the_transaction_it_was() -> None:
    ledger = memory_ledger()
    txn_id, account = uuid4(), uuid4()
    ledger.recorder.insert_events(_v1_transaction(txn_id, account))
    txn = ledger.transaction(txn_id)
    assert (txn.state, txn.amount, txn.line_id, txn.stripe_object_id) == (
        TxnState.CHARGED,
        Decimal(25),
        None,
        "ii_legacy",
    )


def test_a_version_1_account_loads_its_integer_reservations_exactly() -> None:
    ledger = memory_ledger()
    account_id = CustomerAccount.create_id("acme", "USD")
    opened = {
        "originator_topic": ACCOUNT.rstrip("."),
        "customer_id": "acme",
        "currency": "USD",
        "spend_limit": 500,
    }
    ledger.recorder.insert_events(
        [
            _stored(account_id, 1, ACCOUNT + "Opened", opened),
            _stored(
                account_id,
                2,
                ACCOUNT + "AmountsReserved",
                {"transaction_ids": ["a", "b"], "amounts": [25, 100]},
            ),
            _stored(
                account_id,
                3,
                ACCOUNT + "ReservationReleased",
                {"transaction_id": "b", "amount": 100},
            ),
        ]
    )
    account = ledger.account("acme", "USD")
    assert account is not None
    assert (account.reserved, account.available) == (Decimal(25), Decimal(475))
    reserved = ledger.history(account_id)[1]
    assert isinstance(reserved, CustomerAccount.AmountsReserved)
    assert reserved.amounts == ["25", "100"]
    assert reserved.alert_period is None  # version 3's field: it moved no alerts' spend


def test_a_version_2_reservation_moves_no_alerts_spend() -> None:
    """Before version 3 a save recorded the alerts' period spend as ``AlertPeriodSpent``;
    its reservations load without an alerts' period and leave that spend alone."""
    ledger = memory_ledger()
    account_id = CustomerAccount.create_id("acme", "USD")
    opened = {"originator_topic": ACCOUNT.rstrip("."), "customer_id": "acme",
              "currency": "USD", "spend_limit": None}  # fmt: skip
    period = "2026-12-01T00:00:00Z"
    ledger.recorder.insert_events([
        _stored(account_id, 1, ACCOUNT + "Opened", opened),
        _stored(account_id, 2, ACCOUNT + "AlertsSet", {"thresholds": ["spend:1000"]}),
        _stored(account_id, 3, ACCOUNT + "AmountsReserved",
                {"transaction_ids": ["a"], "amounts": ["30"], "class_version": 2}),
        _stored(account_id, 4, ACCOUNT + "AlertPeriodSpent", {"period": period, "spend": "30"}),
    ])  # fmt: skip
    account = ledger.account("acme", "USD")
    assert account is not None
    assert (account.reserved, account.alert_period, account.alert_period_spend) == (
        Decimal(30), period, Decimal(30),
    )  # fmt: skip


def test_a_version_3_reservation_burnt_no_credit_and_its_consumption_counts_once() -> None:
    """Before version 4 a batch's credit was always its own ``CreditsConsumed``: a version 3
    reservation loads as having burnt nothing, so the grant's consumption counts once."""
    ledger = memory_ledger()
    account_id = CustomerAccount.create_id("acme", "USD")
    opened = {"originator_topic": ACCOUNT.rstrip("."), "customer_id": "acme",
              "currency": "USD", "spend_limit": None}  # fmt: skip
    granted = {"grant_id": "g", "amount": 100, "priority": 0, "effective_at": AT,
               "expires_at": None, "source": "manual", "reason": "r"}  # fmt: skip
    ledger.recorder.insert_events([
        _stored(account_id, 1, ACCOUNT + "Opened", opened),
        _stored(account_id, 2, ACCOUNT + "CreditGranted", granted),
        _stored(account_id, 3, ACCOUNT + "AmountsReserved",
                {"transaction_ids": ["a", "b"], "amounts": ["30", "2.5"],
                 "alert_period": None, "class_version": 3}),
        _stored(account_id, 4, ACCOUNT + "CreditsConsumed",
                {"transaction_ids": ["a", "b"], "grant_ids": ["g", "g"],
                 "amounts": ["30", "2.5"], "at": AT}),
    ])  # fmt: skip
    account = ledger.account("acme", "USD")
    assert account is not None
    assert (account.reserved, account.grants["g"].consumed) == (Decimal("32.5"), Decimal("32.5"))
    reserved = ledger.history(account_id)[2]
    assert isinstance(reserved, CustomerAccount.AmountsReserved)
    assert (reserved.burnt_from, reserved.burnt_at) == (None, None)


def _v2_metered(txn_id: object) -> StoredEvent:
    """A Metered event as the ledger stored it before price books (``class_version`` 2:
    an exact amount, no price version)."""
    exact = {"_type_": "decimal_str", "_data_": "25.0"}
    metered = {**V1_METERED, "usage_id": "v2-1", "amount": exact, "class_version": 2}
    return _stored(txn_id, 1, TXN + "Metered", metered)


def test_a_metered_event_from_before_price_books_loads_naming_the_initial_version() -> None:
    ledger = memory_ledger()
    txn_id = uuid4()
    metered = ledger.mapper.to_domain_event(_v2_metered(txn_id))
    assert isinstance(metered, BillingTransaction.Metered)
    assert (metered.price_book_id, metered.price_version) == (PRICE_BOOK_ID, 1)
    assert metered.amount == Decimal("25.0")
    ledger.recorder.insert_events([_v2_metered(txn_id)])
    txn = ledger.transaction(txn_id)
    assert (txn.price_book_id, txn.price_version) == (PRICE_BOOK_ID, INITIAL_VERSION)


def test_a_version_1_metered_event_names_the_initial_version_too() -> None:
    ledger = memory_ledger()
    txn_id, account = uuid4(), uuid4()
    metered = ledger.mapper.to_domain_event(_v1_transaction(txn_id, account)[0])
    assert isinstance(metered, BillingTransaction.Metered)
    assert (metered.price_book_id, metered.price_version, metered.amount) == (
        PRICE_BOOK_ID,
        1,
        Decimal(25),
    )


def test_a_metered_event_recorded_now_keeps_the_version_that_priced_it() -> None:
    ledger = memory_ledger()
    book = PriceBook.start(PriceList({"api.requests": Price(Decimal("0.001"), "USD")}))
    book.publish(
        PriceList({"api.requests": Price(Decimal("0.002"), "USD")}),
        datetime(2026, 11, 1, tzinfo=UTC),
    )
    record = UsageRecord.model_validate(
        {"customer_id": "acme", "usage_id": "now-1", "meter": "api.requests",
         "quantity": "250", "occurred_at": "2026-12-01T10:00:00Z"}
    )  # fmt: skip
    txn = BillingTransaction.from_usage(record, book.schedule, Source("usage", 0, 3))
    ledger.save(txn)
    stored = ledger.recorder.select_events(txn.id)[0]
    assert orjson.loads(stored.state)["class_version"] == 4
    assert orjson.loads(stored.state)["contract_version"] is None  # priced by the list
    loaded = ledger.transaction(txn.id)
    assert (loaded.price_book_id, loaded.price_version, loaded.amount) == (
        PRICE_BOOK_ID,
        2,
        Decimal("50.000"),
    )


def test_a_metered_event_from_before_contracts_loads_naming_no_contract_version() -> None:
    ledger = memory_ledger()
    txn_id = uuid4()
    exact = {"_type_": "decimal_str", "_data_": "25.0"}
    book = {"_type_": "uuid_hex", "_data_": PRICE_BOOK_ID.hex}
    v3 = {**V1_METERED, "usage_id": "v3-1", "amount": exact, "class_version": 3,
          "price_book_id": book, "price_version": 2}  # fmt: skip
    ledger.recorder.insert_events([_stored(txn_id, 1, TXN + "Metered", v3)])
    txn = ledger.transaction(txn_id)
    assert (txn.price_version, txn.contract_version) == (2, None)


LINE = "domain.invoice_line:InvoiceLine."


def test_a_line_from_before_quantities_loads_as_a_per_unit_line_that_counts_none() -> None:
    from domain.invoice_line import InvoiceLine
    from domain.periods import PeriodPolicy

    ledger = memory_ledger()
    period = PeriodPolicy().period_of(datetime(2026, 12, 1, tzinfo=UTC))
    line_id = InvoiceLine.create_id("acme", "USD", "api.requests", period.start)
    opened = {
        "originator_topic": LINE.rstrip("."), "customer_id": "acme", "currency": "USD",
        "meter": "api.requests",
        "period_start": {"_type_": "datetime_iso", "_data_": period.start.isoformat()},
        "period_end": {"_type_": "datetime_iso", "_data_": period.end.isoformat()},
        "late_of_start": None,
    }  # fmt: skip
    settled = {
        "transaction_ids": [str(uuid4())], "amounts": ["25"],
        "exact_total": {"_type_": "decimal_str", "_data_": "25"}, "billed": 25, "transactions": 1,
    }  # fmt: skip
    ledger.recorder.insert_events(
        [
            _stored(line_id, 1, LINE + "Opened", opened),
            _stored(line_id, 2, LINE + "Settled", settled),
        ]
    )
    line = ledger.line_by_id(line_id)
    assert (line.price_version, line.model, line.quantity, line.tier) == (None, None, None, None)
    assert (line.exact_total, line.billed, line.transactions) == (25, 25, 1)
    # It still takes per-unit usage, and still counts no quantity.
    line.settle([(uuid4(), Decimal(5))])
    assert (line.exact_total, line.quantity) == (30, None)
    [event] = line.collect_events()
    assert isinstance(event, InvoiceLine.Settled)
    assert (event.quantities, event.quantity, event.tier) == (None, None, None)


def test_a_version_1_credit_line_loads_summed_per_usage_line() -> None:
    """A credit line's ``CreditsApplied`` once listed every record (its transaction, its
    usage line, its credit); it loads as version 2, summed per usage line, to the line
    the same records make today, and the audit reads both forms alike."""
    ledger = memory_ledger()
    period = PeriodPolicy().period_of(datetime(2026, 12, 1, tzinfo=UTC))
    today = CreditLine.open_for("acme", "USD", period)
    a, b = uuid4(), uuid4()
    records = [
        (uuid4(), a, Decimal("0.25")),
        (uuid4(), b, Decimal("2")),
        (uuid4(), a, Decimal("0.3")),
    ]
    today.apply(records)
    opened, applied = today.collect_events()
    assert isinstance(applied, CreditLine.CreditsApplied)
    v1 = {
        "transaction_ids": [str(t) for t, _, _ in records],
        "line_ids": [str(line) for _, line, _ in records],
        "amounts": [f"{c:f}" for _, _, c in records],
        "exact_total": {"_type_": "decimal_str", "_data_": "-2.55"},
        "billed": -3,
        "transactions": 3,
    }
    stored = [
        ledger.mapper.to_stored_event(opened),
        _stored(today.id, 2, "domain.credit_line:CreditLine.CreditsApplied", v1),
    ]
    events = [ledger.mapper.to_domain_event(e) for e in stored]
    upcast = events[1]
    assert isinstance(upcast, CreditLine.CreditsApplied)
    assert (upcast.line_ids, upcast.amounts, upcast.counts) == (
        [str(a), str(b)], ["0.55", "2"], [2, 1],
    )  # fmt: skip
    assert not hasattr(upcast, "transaction_ids")
    loaded = None
    for event in events:
        loaded = event.mutate(loaded)
    assert isinstance(loaded, CreditLine)
    assert (loaded.per_line, loaded.billed, loaded.exact_total, loaded.transactions) == (
        today.per_line, today.billed, today.exact_total, today.transactions,
    )  # fmt: skip
    assert loaded.per_line == {str(a): Decimal("0.55"), str(b): Decimal(2)}
    # The audit folds the stored data as it is, version 1 or 2.
    folds = []
    for data in (v1, {k: v for k, v in vars(applied).items() if k in _V2_FIELDS}):
        audit = LineAudit("l", "acme", "USD", "credits", "p")
        audit.apply("CreditsApplied", {**data, "exact_total": "-2.55"}, 2)
        folds.append((audit.credit_of_line, audit.credited_on_line, audit.problems))
    assert folds[0] == folds[1] == ({str(a): Decimal("0.55"), str(b): Decimal(2)},
                                    {str(a): 2, str(b): 1}, [])  # fmt: skip


def test_a_version_1_failed_finalize_loads_as_a_finalize_that_may_have_landed() -> None:
    """Before v2 a ``FinalizeFailed`` did not say which call failed, nor whether Stripe
    could still execute it: it loads as a finalize in doubt, so the next finalize reads
    the invoice first, as every retry did then."""
    ledger = memory_ledger()
    invoice = Invoice.open("acme", "USD", PeriodPolicy().period_of(AT_DT), uuid4())
    invoice.close("period ended")
    invoice.start_finalizing([(invoice.lines[0], 1, 700)])
    stored = [ledger.mapper.to_stored_event(e) for e in invoice.collect_events()]
    v1 = {
        "attempt": 1,
        "error_class": "Timeout",
        "message": "slow",
        "next_attempt_at": AT,
    }
    stored.append(_stored(invoice.id, len(stored) + 1, "domain.invoice:Invoice.FinalizeFailed", v1))
    loaded = None
    for event in (ledger.mapper.to_domain_event(e) for e in stored):
        loaded = event.mutate(loaded)
    assert isinstance(loaded, Invoice)
    assert (loaded.finalize_attempts, loaded.last_error, loaded.finalize_in_doubt) == (
        1, "Timeout: slow", True,
    )  # fmt: skip


_V2_FIELDS = ("line_ids", "amounts", "counts", "billed", "transactions")
