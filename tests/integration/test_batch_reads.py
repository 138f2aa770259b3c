"""A batch reads its accounts and lines together (``store.batch_reads``), on real
PostgreSQL: one query where it used to make one per aggregate, the same state a
one-by-one read would give, rivals' writes seen, and nothing cached that was not saved."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL

from adapters.bootstrap import open_ledger
from adapters.settings import Settings
from domain.ids import account_id
from domain.metering import Metering
from domain.transaction import Source
from store.batch_reads import BatchReads
from store.ledger import BillingLedger
from store.recorder import LedgerRecorder
from store.snapshots import SealedSnapshotRecorder
from tests.integration.support import usage

pytestmark = pytest.mark.integration

CUSTOMERS = ("acme", "globex", "initech")
METERS = ("api.requests", "gpt-4o.input_tokens")


@pytest.fixture
def ledger(ingest_ledger: BillingLedger) -> BillingLedger:
    return ingest_ledger


class Spy:
    """The ledger's batch reads, kept, with every one-by-one read they fell back to."""

    def __init__(self, ledger: BillingLedger) -> None:
        self.reads: list[BatchReads] = []
        self.one_by_one: list[UUID] = []
        make = ledger._batch_reads

        def spied(*args: Any) -> BatchReads:
            reads = make(*args)
            read_one = reads.read_one

            def counted(aggregate_id: UUID) -> Any:
                self.one_by_one.append(aggregate_id)
                return read_one(aggregate_id)

            reads.read_one = counted
            self.reads.append(reads)
            return reads

        ledger._batch_reads = spied  # type: ignore[method-assign]


def _batch(tag: str, start: int = 0) -> list[Metering]:
    return [
        Metering(
            usage(f"{tag}-{n}", customer=c, meter=m, quantity=1000 + start + n),
            Source("usage", 0, start + n),
        )
        for n, (c, m) in enumerate((c, m) for c in CUSTOMERS for m in METERS for _ in range(2))
    ]


def _state(ledger: BillingLedger) -> dict[str, Any]:
    accounts = {c: ledger.account(c, "USD") for c in CUSTOMERS}
    return {c: (a.version, a.reserved) for c, a in accounts.items() if a is not None}


def test_a_batch_reads_its_accounts_and_lines_in_one_query_and_keeps_what_it_saved(
    settings: Settings, ledger: BillingLedger
) -> None:
    spy = Spy(ledger)
    first = ledger.record_usage(_batch("one"))
    # Nothing exists yet: one query says so; only the new lines' invoices are read alone.
    assert spy.reads[0].queries == 1
    assert set(spy.one_by_one) == {line.invoice_id for line in first.lines}

    spy.one_by_one.clear()
    second = ledger.record_usage(_batch("two", 100))
    assert len(second.transactions) == 12 and ledger.last_save.attempts == 1
    # Nine aggregates (3 accounts, 6 lines), all cached at the versions saved: one query,
    # no event read back, nothing read one by one; and one more asking whether the
    # customers' credit lines of the period exist (none has credit: no such line is
    # cached, and an absent one is never assumed absent without asking).
    assert (spy.reads[1].queries, spy.reads[1].events_read, spy.one_by_one) == (2, 0, [])

    with open_ledger(settings) as rival:
        rival.record_usage(_batch("rival", 200))
        rival.record_usage(_batch("rival-again", 250))
        rival_view = _state(rival)
    third = ledger.record_usage(_batch("three", 300))
    # The rival's two events of each aggregate after our cached versions are folded in,
    # in order: no lost race.
    assert spy.reads[2].events_read == 18 and ledger.last_save.attempts == 1
    assert len(third.transactions) == 12
    with open_ledger(settings) as fresh:  # read whole from the store by a ledger with no cache
        assert _state(ledger) == _state(fresh)
        assert all(_state(fresh)[c][0] == rival_view[c][0] + 1 for c in CUSTOMERS)


def test_after_a_restart_existing_aggregates_are_read_whole_and_absent_ones_not_at_all(
    settings: Settings, ledger: BillingLedger
) -> None:
    ledger.record_usage(_batch("before"))
    with open_ledger(settings) as restarted:
        spy = Spy(restarted)
        batch = [*_batch("after", 100), Metering(usage("new", customer="hooli"), Source("u", 1, 1))]
        restarted.record_usage(batch)
        # Not cached: the new customer's account and line are known absent from the
        # first query; the 9 that exist have no snapshot (a second query), so they are
        # read whole, together (a third), none one by one; only the new line's invoice
        # is read alone.
        assert spy.reads[0].queries == 3 and spy.reads[0].read_whole == 9
        assert account_id("hooli", "USD") not in spy.one_by_one
        assert len(spy.one_by_one) == 1
        assert restarted.last_save.attempts == 1
        restarted_view = _state(restarted)
        # Cached as the repository caches what it reads: the next batch reads no event.
        spy.one_by_one.clear()
        restarted.record_usage(_batch("again", 400))
        assert spy.reads[1].events_read == 0 and spy.one_by_one == []
        restarted_view = _state(restarted)
    with open_ledger(settings) as fresh:
        assert _state(fresh) == restarted_view


def test_after_a_restart_an_aggregate_with_a_snapshot_is_read_from_its_snapshot(
    settings: Settings, ledger: BillingLedger
) -> None:
    ledger.record_usage(_batch("before"))
    ledger.take_snapshot(account_id("acme", "USD"))
    ledger.record_usage(_batch("after-the-snapshot", 50))
    with open_ledger(settings) as restarted:
        spy = Spy(restarted)
        restarted.record_usage(_batch("after", 100))
        # acme's account has a snapshot: read by the repository, snapshot first (its seal
        # checked); the other 8 whole, together.
        assert spy.reads[0].read_whole == 8
        assert spy.one_by_one == [account_id("acme", "USD")]
        snapshots = restarted.snapshots
        assert snapshots is not None and isinstance(snapshots.recorder, SealedSnapshotRecorder)
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            plan = "\n".join(
                str(row[0])
                for row in conn.execute(
                    SQL("EXPLAIN ") + snapshots.recorder._select_snapshotted,
                    ([account_id(c, "USD") for c in CUSTOMERS],),
                )
            )
        assert "Seq Scan" not in plan and "_pkey" in plan, plan
        assert restarted.last_save.attempts == 1
        restarted_view = _state(restarted)
        accounts = [restarted.account(c, "USD") for c in CUSTOMERS]
    with open_ledger(settings) as fresh:
        assert _state(fresh) == restarted_view
        assert [fresh.account(c, "USD") for c in CUSTOMERS] == accounts


def test_a_decision_that_loses_its_race_leaves_the_cache_as_the_store_has_it(
    settings: Settings, ledger: BillingLedger
) -> None:
    """A rival writes between our reads and our save: the save fails, the batch is
    decided again, and what we cached and saved equals a fresh read of the store."""
    ledger.record_usage(_batch("warm"))
    raced = [False]
    make = ledger._batch_reads

    def racing(*args: Any) -> BatchReads:
        reads = make(*args)
        expect = reads.expect

        def expect_then_race(ids: Any) -> None:
            expect(ids)
            if not raced[0]:
                raced[0] = True
                with open_ledger(settings) as rival:
                    rival.record_usage(_batch("rival", 500))

        reads.expect = expect_then_race  # type: ignore[method-assign]
        return reads

    ledger._batch_reads = racing  # type: ignore[method-assign]
    decision = ledger.record_usage(_batch("ours", 600))
    assert raced[0] and ledger.last_save.attempts == 2 and len(decision.transactions) == 12
    with open_ledger(settings) as fresh:
        assert _state(ledger) == _state(fresh)


@pytest.mark.parametrize("statistics", ["none yet", "analyzed"])
def test_reads_by_id_go_through_the_primary_key_however_the_table_was_analyzed(
    settings: Settings, ledger: BillingLedger, statistics: str
) -> None:
    """Every read of a set of aggregates by id (a batch's, a webhook group's, a save's
    previous hashes) probes the primary key per id: none scans the events table, which
    grows by millions of rows, whatever the planner's statistics say."""
    recorder = ledger.recorder
    assert isinstance(recorder, LedgerRecorder)
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO billingledger_events"
            " (originator_id, originator_version, topic, state, prev_hash, hash)"
            " SELECT gen_random_uuid(), v, 'x', '\\x7b7d', '\\x00', '\\x00'"
            " FROM generate_series(1, 20000), generate_series(1, 3) AS v"
        )
        if statistics == "analyzed":
            conn.execute("ANALYZE billingledger_events")
        ids = [
            row[0]
            for row in conn.execute("SELECT originator_id FROM billingledger_events LIMIT 300")
        ]
        distinct = list(dict.fromkeys(ids))
        versions = [1] * len(distinct)
        for name in ("latest", "recorded", "histories", "after", "first", "hashes"):
            statement = getattr(recorder, f"_select_{name}")
            args = (distinct, versions) if name in ("after", "hashes") else (distinct,)
            plan = "\n".join(str(row[0]) for row in conn.execute(SQL("EXPLAIN ") + statement, args))
            assert "Seq Scan on billingledger_events" not in plan, (name, plan)
            assert "billingledger_events_pkey" in plan, (name, plan)


def test_a_read_that_fast_forwards_the_cache_meanwhile_does_not_tear_the_batch_reads(
    settings: Settings, ledger: BillingLedger
) -> None:
    """Another role of the process reads an account through the repository (which
    fast-forwards the cached object in place) while a batch's reads are under way: the
    batch reads copies taken before, each at its own version, and is saved first time."""
    ledger.record_usage(_batch("warm"))
    with open_ledger(settings) as rival:
        rival.record_usage(_batch("rival", 200))
    recorder = ledger.recorder
    assert isinstance(recorder, LedgerRecorder)
    select_after = recorder.select_after
    meanwhile: list[Any] = []

    def with_a_read_meanwhile(versions: dict[UUID, int]) -> Any:
        meanwhile.append(ledger.account("acme", "USD"))  # another thread's read, in effect
        return select_after(versions)

    recorder.select_after = with_a_read_meanwhile  # type: ignore[method-assign]
    ledger.record_usage(_batch("ours", 300))
    assert meanwhile and ledger.last_save.attempts == 1
    with open_ledger(settings) as fresh:
        assert _state(ledger) == _state(fresh)
