"""``billing.credit_balances`` is written in the save that moves an account's credit
(``store.credit_rows``), and the projector counts each credit event once whichever of
the two wrote it first: real PostgreSQL, no projector running unless a test runs it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import projections.credits
import store.ledger
from adapters.settings import Settings
from domain.account import CustomerAccount, moves_credit
from projections.projector import Projector, RebuildLocked, rebuild
from store.connections import Database
from store.ledger import BillingLedger
from tests.integration.support import projection_rows, rebuild_all, record

_COLUMNS = "policy, grants, granted, consumed, expired, voided, remaining, account_version"


def _grant(amount: int, grant_id: str = "promo") -> Any:
    def grant(account: CustomerAccount) -> bool:
        return account.grant_credit(
            grant_id, amount, effective_at=datetime.now(UTC) - timedelta(days=1),
            source="promotional", reason="welcome",
        )  # fmt: skip

    return grant


def _row(settings: Settings, customer: str) -> tuple[Any, ...] | None:
    with psycopg.connect(settings.database_url) as conn:
        return conn.execute(
            f"SELECT {_COLUMNS} FROM billing.credit_balances"  # noqa: S608
            " WHERE customer_id = %s AND currency = 'USD'",
            (customer,),
        ).fetchone()


def _expected(ledger: BillingLedger, customer: str) -> tuple[Any, ...]:
    """The row the account's state says, with the version of its last credit event."""
    account = ledger.account(customer, "USD")
    assert account is not None
    t = account.credit_totals()
    credit = [e for e in ledger.history(account.id) if moves_credit(e)]
    return (
        t.policy, t.grants, t.granted, t.consumed, t.expired, t.voided,
        t.granted - t.consumed - t.expired - t.voided, credit[-1].originator_version,
    )  # fmt: skip


def _project(settings: Settings, ledger: BillingLedger) -> None:
    with Database(settings.database_url) as db, Projector(db, ledger.mapper.to_domain_event) as p:
        p.pump_all()


@contextmanager
def _saves_without_rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Saves as a build before this one made them: no balance row in the save."""
    with monkeypatch.context() as m:
        m.setattr(store.ledger, "balance_row", lambda account, events: None)
        yield


def test_the_balance_is_in_sql_when_the_save_returns(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", _grant(1000))
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")  # the grant's save
    record(ingest_ledger, "acme", ["a-1", "a-2"], qty=1000)  # 100 and 100.1 cents
    row = _row(settings, "acme")
    assert row is not None and row[3:7] == (Decimal("200.1"), 0, 0, Decimal("799.9"))
    assert row == _expected(ingest_ledger, "acme")
    ingest_ledger.change_account("acme", "USD", lambda a: bool(a.void_credit("promo", "test")))
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")  # voided: 0 left
    # The projector then counts nothing twice, and a rebuild gives the very same rows.
    _project(settings, ingest_ledger)
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")
    live = projection_rows(settings.database_url)
    rebuild_all(settings.database_url, ingest_ledger)
    assert projection_rows(settings.database_url) == live


def test_a_save_writes_the_whole_balance_over_rows_the_projector_left_behind(
    ingest_ledger: BillingLedger, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows from before this build (or behind the projector): the next save writes the
    account's whole state; the projector then skips the events that state holds,
    projected or not."""
    with _saves_without_rows(monkeypatch):
        ingest_ledger.change_account("acme", "USD", _grant(1000))
        record(ingest_ledger, "acme", ["a-1"], qty=1000)
        _project(settings, ingest_ledger)  # the row, by the projector: 100 consumed
        record(ingest_ledger, "acme", ["a-2"], qty=2000)  # not projected yet
    assert _row(settings, "acme")[3] == 100  # type: ignore[index]
    record(ingest_ledger, "acme", ["a-3"], qty=3000)  # this save writes the whole state
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")
    assert _row(settings, "acme")[3] == 600  # type: ignore[index]
    _project(settings, ingest_ledger)  # a-2's and a-3's events: held by the row already
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")


def test_the_projector_adds_only_the_steps_newer_than_the_row(
    ingest_ledger: BillingLedger, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row written by a save, then saves that did not write it (another build): the
    projector adds exactly the steps after the row's version, in one batch with the
    steps before it."""
    ingest_ledger.change_account("acme", "USD", _grant(1000))
    record(ingest_ledger, "acme", ["a-1"], qty=1000)  # the row: 100 consumed
    with _saves_without_rows(monkeypatch):
        record(ingest_ledger, "acme", ["a-2"], qty=2000)
        ingest_ledger.change_account("acme", "USD", _grant(500, "second"))
        ingest_ledger.change_account("acme", "USD", lambda a: a.set_credit_policy("block"))
    assert _row(settings, "acme")[3] == 100  # type: ignore[index]
    _project(settings, ingest_ledger)  # every credit event in one pass, the first ones held
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")
    assert _row(settings, "acme")[:4] == ("block", 2, 1500, 300)  # type: ignore[index]
    live = projection_rows(settings.database_url)
    rebuild_all(settings.database_url, ingest_ledger)
    assert projection_rows(settings.database_url) == live


def test_an_account_without_credit_gets_no_row(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    record(ingest_ledger, "plain", ["p-1"], qty=1000)
    assert _row(settings, "plain") is None


def test_the_projectors_statement_itself_adds_only_the_steps_newer_than_the_row(
    ingest_ledger: BillingLedger, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that commits between the projector's read of the rows' versions and its
    write: the statement checks the version again under the row's lock. (The read is
    made to find nothing, as if every save came after it.)"""
    ingest_ledger.change_account("acme", "USD", _grant(1000))
    record(ingest_ledger, "acme", ["a-1"], qty=1000)
    with _saves_without_rows(monkeypatch):
        record(ingest_ledger, "acme", ["a-2"], qty=2000)  # a step the row lacks
    monkeypatch.setattr(
        projections.credits, "_KNOWN_VERSIONS",
        "SELECT customer_id, currency, account_version FROM {table}"
        " WHERE false AND %s::text[] IS NOT NULL AND %s::text[] IS NOT NULL",
    )  # fmt: skip
    _project(settings, ingest_ledger)
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")
    assert _row(settings, "acme")[3] == 300  # type: ignore[index]


def test_a_policy_set_on_an_account_without_grants_writes_its_row(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", lambda a: a.set_credit_policy("block"))
    assert _row(settings, "acme")[:3] == ("block", 0, 0)  # type: ignore[index]
    assert _row(settings, "acme") == _expected(ingest_ledger, "acme")


def test_a_rebuild_waits_for_the_live_table_a_bounded_time_and_tries_again(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    """A reader holds the live table: the swap gives up its lock wait (so the saves
    queued behind it are not held up for as long as the reader reads), pauses, tries
    again, and swaps once the reader is gone; the rows are the history's."""
    ingest_ledger.change_account("acme", "USD", _grant(1000))
    record(ingest_ledger, "acme", ["a-1"], qty=1000)
    live = projection_rows(settings.database_url)["credit_balances"]
    reader = psycopg.connect(settings.database_url)
    reader.execute("SELECT count(*) FROM billing.credit_balances").fetchone()  # held open
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        reader.close()  # the reader is done: the next try takes the lock

    with Database(settings.database_url) as db:
        report = rebuild(
            db, "credit_balances", ingest_ledger.mapper.to_domain_event, lock_timeout_s=0.2,
            sleep=pause,
        )  # fmt: skip
    assert len(pauses) == 1 and report.rows == 1
    assert projection_rows(settings.database_url)["credit_balances"] == live


def test_a_rebuild_that_never_gets_the_live_table_says_so_and_leaves_it(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", _grant(1000))
    live = projection_rows(settings.database_url)["credit_balances"]
    with psycopg.connect(settings.database_url) as reader, Database(settings.database_url) as db:
        reader.execute("SELECT count(*) FROM billing.credit_balances").fetchone()
        with pytest.raises(RebuildLocked, match="could not lock the live table in 2 attempts"):
            rebuild(
                db, "credit_balances", ingest_ledger.mapper.to_domain_event,
                lock_timeout_s=0.1, attempts=2, sleep=lambda _: None,
            )  # fmt: skip
    assert projection_rows(settings.database_url)["credit_balances"] == live
