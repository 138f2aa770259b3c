"""Sealed snapshots (``store.snapshots``): a snapshot the ledger took is used on load; one
inserted behind its back (the issue's reproduction: the account without its spend
limit, with the workers' own login) or edited after it was sealed is passed over, the
account is rebuilt from its events, and the limit in force still refuses."""

from __future__ import annotations

import psycopg
import pytest
from eventsourcing.domain import Snapshot

from adapters.audit.replay import Scope
from adapters.audit.report import audit
from adapters.bootstrap import login, migrate, open_ledger
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.ids import account_id
from store.ledger import BillingLedger
from store.roles import AUDITOR
from store.snapshots import SealedSnapshotRecorder
from tests.integration.roles import as_role
from tests.integration.support import record

pytestmark = pytest.mark.integration

CUSTOMER = account_id("capped", "USD")


def _recorder(ledger: BillingLedger) -> SealedSnapshotRecorder:
    assert ledger.snapshots is not None
    recorder = ledger.snapshots.recorder
    assert isinstance(recorder, SealedSnapshotRecorder)
    return recorder


def _unlimited_state(ledger: BillingLedger) -> tuple[str, bytes]:
    """The account's snapshot as the ledger would store it, with the limit lifted."""
    account = ledger.account("capped", "USD")
    assert account is not None and account.spend_limit == 800
    account.spend_limit = None
    stored = ledger.mapper.to_stored_event(Snapshot.take(account))
    return stored.topic, stored.state


def _reserved_and_refused(settings: Settings) -> tuple[int, int]:
    """Three records of 5.00 USD against the 8.00 USD limit, in a new process."""
    with open_ledger(settings) as ledger:
        account = ledger.account("capped", "USD")
        assert account is not None and account.spend_limit == 800  # rebuilt from its events
        assert _recorder(ledger).refused == 1
        ids = record(ledger, "capped", ["c-1", "c-2", "c-3"])
        refused = [i for i in ids if ledger.transaction(i).compensation_reason is not None]
    return len(ids) - len(refused), len(refused)


def _forge(url: str, statement: str, topic: str, state: bytes) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(statement, (topic, state, CUSTOMER))  # type: ignore[arg-type]


def _assert_passed_over(settings: Settings, server: str) -> None:
    """The forged snapshot is not used (the limit refuses) and the audit names it."""
    assert _reserved_and_refused(settings) == (1, 2)
    assert _snapshot_findings(settings, server) == [f"{CUSTOMER} v1"]


def _snapshot_findings(settings: Settings, server: str) -> list[str]:
    """The audit's ``snapshot`` findings, with the auditor's login."""
    return list(_details(settings, server))


def test_an_unsealed_snapshot_inserted_with_the_writers_login_is_not_used(
    roles_settings: Settings, server: str
) -> None:
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        ledger.set_spend_limit("capped", "USD", 800)  # 8.00 USD: the account's version 1
        topic, state = _unlimited_state(ledger)
    _forge(
        roles_settings.database_url,  # billing_writer's login
        "INSERT INTO public.billingledger_snapshots (topic, state, originator_id,"
        " originator_version) VALUES (%s, %s, %s, 1)",
        topic, state,
    )  # fmt: skip
    _assert_passed_over(roles_settings, server)


def test_a_snapshot_the_ledger_took_is_used_and_one_edited_after_is_not(
    roles_settings: Settings, server: str
) -> None:
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        ledger.set_spend_limit("capped", "USD", 800)
        ledger.take_snapshot(CUSTOMER)  # sealed to the account's version 1
        (taken,) = _recorder(ledger).select_events(CUSTOMER, desc=True, limit=1)
        assert taken.originator_version == 1 and _recorder(ledger).refused == 0
        assert ledger.mapper.to_domain_event(taken).state["spend_limit"] == 800
        topic, state = _unlimited_state(ledger)
    assert _snapshot_findings(roles_settings, server) == []
    _forge(
        server,  # behind the roles' backs: the seal is kept
        "UPDATE public.billingledger_snapshots SET topic = %s, state = %s"
        " WHERE originator_id = %s",
        topic, state,
    )  # fmt: skip
    _assert_passed_over(roles_settings, server)


def _insert_rows(url: str, rows: list[tuple[int, str | None, bytes | None, bytes | None]]) -> None:
    """Snapshot rows of the account as (version, topic, state, seal), with ``url``'s login."""
    with psycopg.connect(url) as conn:
        for version, topic, state, seal in rows:
            conn.execute(
                "INSERT INTO public.billingledger_snapshots (originator_id, originator_version,"
                " topic, state, seal) VALUES (%s, %s, %s, %s, %s)",
                (CUSTOMER, version, topic, state, seal),
            )


def _details(settings: Settings, server: str) -> dict[str, str]:
    """The audit's ``snapshot`` findings (subject: detail), with the auditor's login."""
    auditor = settings.model_copy(update={"database_url": as_role(server, AUDITOR)})
    report = audit(login(auditor), Scope(), horizon=auditor.overdue_after(), progress=False)
    return {f.subject: f.detail for f in report.findings if f.kind == "snapshot"}


def test_a_snapshot_the_ledger_took_is_used_after_a_restart(
    roles_settings: Settings,
) -> None:
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        ledger.set_spend_limit("capped", "USD", 800)
        ledger.take_snapshot(CUSTOMER)
    with open_ledger(roles_settings) as ledger:  # a new worker: nothing kept in memory
        assert ledger.snapshots is not None
        (used,) = ledger.snapshots.get(CUSTOMER, desc=True, limit=1)
        assert used.originator_version == 1
        account = ledger.account("capped", "USD")
        assert account is not None and account.spend_limit == 800
        assert _recorder(ledger).refused == 0


def test_rows_above_the_ledgers_snapshot_neither_hide_it_nor_fail_a_save(
    roles_settings: Settings, server: str
) -> None:
    """Forged rows at versions above the ledger's own snapshot (one at the version the
    account reaches next, with a garbage seal; one far ahead of the history, with none):
    the load still finds the ledger's snapshot (the limit is applied to the snapshots that
    hold, not to the rows), and the save that reaches the forged row's version records its
    usage once (its snapshot is dropped, not the save), with the writer's login."""
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        ledger.set_spend_limit("capped", "USD", 800)
        ledger.take_snapshot(CUSTOMER)  # the ledger's own, at version 1
        topic, state = _unlimited_state(ledger)
    _insert_rows(
        roles_settings.database_url,
        [(2, topic, state, bytes(32)), (1_000_000_000, topic, state, None)],
    )
    with open_ledger(roles_settings) as ledger:
        assert ledger.snapshots is not None
        (used,) = ledger.snapshots.get(CUSTOMER, desc=True, limit=1)
        assert used.originator_version == 1
        assert _recorder(ledger).refused == 0  # rows above the history are not even read
        ledger.snapshotting_intervals = {CustomerAccount: 2}  # a snapshot at version 2
        assert len(record(ledger, "capped", ["c-1"])) == 1  # recorded, not a duplicate
        assert ledger.last_save.attempts == 1
        (used,) = ledger.snapshots.get(CUSTOMER, desc=True, limit=1)  # past the forged v2
        assert used.originator_version == 1
        ledger.repository.cache = None
        account = ledger.account("capped", "USD")
        assert account is not None and account.version == 2 and account.spend_limit == 800
    assert _details(roles_settings, server) == {
        f"{CUSTOMER} v2": "its seal does not match its head event (forged or edited): never"
        " used on load",
        f"{CUSTOMER} v1000000000": "no seal (taken before migration 5, or inserted without"
        " one): never used on load",
    }


def test_malformed_snapshot_rows_are_passed_over_not_raised(
    roles_settings: Settings, server: str
) -> None:
    """Rows the column types allow but the ledger never writes (no state, no topic, a
    seal of the wrong length), with the writer's login: the load and the audit pass
    them over; nothing stops billing."""
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        for limit in (700, 750, 800):  # the account's versions 1-3
            ledger.set_spend_limit("capped", "USD", limit)
        topic, state = _unlimited_state(ledger)
    _insert_rows(
        roles_settings.database_url,
        [(1, topic, None, bytes(32)), (2, None, state, bytes(32)), (3, topic, state, b"\x01")],
    )
    with open_ledger(roles_settings) as ledger:
        account = ledger.account("capped", "USD")
        assert account is not None and account.spend_limit == 800
        assert _recorder(ledger).refused == 3
    details = _details(roles_settings, server)
    assert sorted(details) == [f"{CUSTOMER} v1", f"{CUSTOMER} v2", f"{CUSTOMER} v3"]
    assert details[f"{CUSTOMER} v1"].startswith("malformed")
    assert details[f"{CUSTOMER} v2"].startswith("malformed")
