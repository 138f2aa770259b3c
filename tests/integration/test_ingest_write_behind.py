"""The ingest's write-behind against real PostgreSQL and the broker: another writer moves
an account while a batch is saved on the writer thread and the next one is decided on
the state that save would leave. Every record is recorded once, the money is the sum
of the records, the other writer's change stays, and the audit is clean."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from adapters.bootstrap import build_ingest_worker, open_ledger
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.transaction import TxnState
from store.ledger import BillingLedger, Decided
from tests.integration.support import (
    audit_findings,
    metered_usage_ids,
    produce_records,
    run_worker_until,
    total_lag,
    usage,
)

pytestmark = pytest.mark.integration


def test_a_rival_write_during_saves_behind_costs_a_retry_and_never_a_record_or_a_cent(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    ledger = ingest_ledger
    settings = settings.model_copy(update={"batch_max_records": 4})
    records = [usage(f"wb-{i}", customer=("acme", "bolt")[i % 2]) for i in range(40)]
    save = ledger.save_decided
    saves: list[str] = []

    def rival_on_some_saves(decided: Decided, **kwargs: Any) -> Any:
        # On the writer thread, between a decision and its save (and so while the next
        # batch is decided on it): another process sets acme's limit.
        saves.append(threading.current_thread().name)
        if len(saves) in {2, 5}:
            with open_ledger(settings) as rival:
                rival.set_spend_limit("acme", "USD", 1_000_000 + len(saves))
        return save(decided, **kwargs)

    ledger.save_decided = rival_on_some_saves  # type: ignore[method-assign]
    produce_records(settings, records)
    worker = build_ingest_worker(settings, ledger)
    run_worker_until(worker, 40, what="40 records")
    stats = worker.stats

    assert any(name.startswith("ingest-save") for name in saves)  # saved behind
    assert stats.conflicts >= 2 and stats.contended_batches == 0
    assert sorted(metered_usage_ids(settings.database_url)) == sorted(r.usage_id for r in records)
    assert total_lag(settings) == 0
    with open_ledger(settings) as fresh:  # nothing cached: what the store holds
        for customer in ("acme", "bolt"):
            txns = [
                fresh.transaction(transaction_id(customer, r.usage_id))
                for r in records
                if r.customer_id == customer
            ]
            assert all(t.state is TxnState.RESERVED for t in txns)
            account = fresh.account(customer, "USD")
            assert account is not None and account.reserved == sum(t.amount for t in txns)
        acme = fresh.account("acme", "USD")
        assert acme is not None and acme.spend_limit == 1_000_005  # the rival's last write
    assert audit_findings(settings, ledger) == []
