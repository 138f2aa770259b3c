"""The ingest's fast store path on a real PostgreSQL: COPY appends, same history as before."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import uuid4

import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from adapters.bootstrap import migrate, open_ledger
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.ids import account_id, transaction_id
from domain.metering import Metering
from domain.price_book import PRICE_BOOK_ID
from domain.transaction import BillingTransaction, Source, TxnState
from store.ledger import BillingLedger
from store.recorder import LedgerRecorder
from tests.integration.support import count_events, usage

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(settings: Settings) -> Iterator[BillingLedger]:
    migrate(settings)
    with open_ledger(settings) as app:
        yield app


def _batch(n: int, start: int = 0) -> list[Metering]:
    return [
        Metering(usage(f"p-{i}", customer=f"c{i % 3}", quantity=1000 + i), Source("usage", 0, i))
        for i in range(start, start + n)
    ]


def test_a_recorded_batch_reads_back_as_metered_and_reserved_transactions(
    ledger: BillingLedger,
) -> None:
    batch = _batch(30)
    ledger.record_usage(batch)

    for m in batch:
        txn = ledger.transaction(m.transaction_id)
        assert (txn.state, txn.usage_id, txn.quantity) == (
            TxnState.RESERVED,
            m.record.usage_id,
            m.record.quantity,
        )
        assert txn.account_id == account_id(m.record.customer_id, "USD")
        history = ledger.history(m.transaction_id)
        assert [type(e) for e in history] == [
            BillingTransaction.Metered,
            BillingTransaction.Reserved,
        ]
    # (not the price book migrate started)
    events = [e for e in ledger.all_events() if e.originator_id != PRICE_BOOK_ID]
    # each account: Opened + AmountsReserved; each line: Opened + Settled; each
    # customer's invoice: Opened
    assert len(events) == 30 * 2 + 3 * 2 + 3 * 2 + 3
    assert ledger.last_save.events == len(events)
    account = ledger.account("c0", "USD")
    assert account is not None
    assert account.reserved == sum(
        ledger.transaction(m.transaction_id).amount for m in batch if m.record.customer_id == "c0"
    )


def test_a_batch_recorded_again_is_all_duplicates_after_one_refused_copy(
    ledger: BillingLedger, settings: Settings
) -> None:
    ledger.record_usage(_batch(40))
    before = count_events(settings.database_url)

    # A second ledger has not seen the first batch: its COPY hits the primary key,
    # it reloads, finds every transaction recorded, and writes nothing more.
    with open_ledger(settings) as other:
        decision = other.record_usage(_batch(40))
        assert (len(decision.transactions), len(decision.duplicates)) == (0, 40)
        assert other.last_save.attempts == 2
    assert count_events(settings.database_url) == before


def test_a_copy_that_hits_the_primary_key_writes_nothing_and_raises_integrity_error(
    ledger: BillingLedger, settings: Settings
) -> None:
    ledger.record_usage(_batch(5))
    before = count_events(settings.database_url)
    recorder = ledger.recorder
    assert isinstance(recorder, LedgerRecorder)
    taken = transaction_id("c0", "p-0")  # version 1 exists
    fresh = [StoredEvent(uuid4(), 1, "t", b"{}") for _ in range(3)]
    with pytest.raises(IntegrityError):
        recorder.insert_events([*fresh, StoredEvent(taken, 1, "t", b"{}")], notification_ids=False)
    assert count_events(settings.database_url) == before
    assert recorder.select_recorded_ids([taken, fresh[0].originator_id]) == {taken}


@pytest.mark.parametrize("notification_ids", [True, False])
def test_an_event_whose_previous_version_is_not_stored_is_refused_with_integrity_error(
    ledger: BillingLedger, settings: Settings, notification_ids: bool
) -> None:
    """A version gap is what a decision made on a state never saved would write: the
    primary key cannot see it, so the append refuses it."""
    ledger.record_usage(_batch(1))  # the transaction holds versions 1 and 2
    before = count_events(settings.database_url)
    recorder = ledger.recorder
    assert isinstance(recorder, LedgerRecorder)
    txn = transaction_id("c0", "p-0")
    with pytest.raises(IntegrityError, match="version 3 is not stored"):
        recorder.insert_events([StoredEvent(txn, 4, "t", b"{}")], notification_ids=notification_ids)
    assert count_events(settings.database_url) == before
    recorder.insert_events(  # its next version, and one after it in the same append, are fine
        [StoredEvent(txn, 3, "t", b"{}"), StoredEvent(txn, 4, "t", b"{}")],
        notification_ids=notification_ids,
    )
    assert count_events(settings.database_url) == before + 2


def test_appends_that_want_notification_ids_still_get_them(ledger: BillingLedger) -> None:
    account = CustomerAccount.open("solo", "USD", 100)
    account.set_limit(200)
    ids = [r.notification.id for r in ledger.save(account)]
    assert len(ids) == 2
    assert ids == sorted(ids)


def test_subscribing_to_the_recorder_is_refused_at_once_instead_of_waiting_for_ever(
    ledger: BillingLedger,
) -> None:
    recorder = ledger.recorder
    assert isinstance(recorder, LedgerRecorder)
    with pytest.raises(NotImplementedError, match=r"store\.eventlog\.follow"):
        recorder.subscribe(gt=0)
