"""The recorder chains an aggregate's next event to the newest one this process
committed without reading its hash back (``LedgerRecorder._remember_heads``), and reads
it when another process appended since or its own append was refused: every event's
``prev_hash`` is its predecessor's stored hash whichever way it was found."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.sql import SQL, Identifier

from adapters.bootstrap import migrate, open_ledger
from adapters.settings import Settings
from domain.chain import GENESIS
from store.recorder import LedgerRecorder

pytestmark = pytest.mark.integration


class _Recorders:
    """Two processes' recorders (two ledgers), each with the hashes it read back."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.read: dict[str, list[tuple[Any, int]]] = {"a": [], "b": []}

    def spied(self, ledger: Any, name: str) -> LedgerRecorder:
        recorder = ledger.recorder
        assert isinstance(recorder, LedgerRecorder)
        stored_hashes = recorder._stored_hashes

        def counted(curs: Any, keys: Any) -> Any:
            self.read[name] += list(keys)
            return stored_hashes(curs, keys)

        recorder._stored_hashes = counted  # type: ignore[method-assign]
        return recorder


@pytest.fixture
def recorders(settings: Settings) -> Iterator[tuple[LedgerRecorder, LedgerRecorder, _Recorders]]:
    migrate(settings)
    spy = _Recorders(settings)
    with open_ledger(settings) as a, open_ledger(settings) as b:
        yield spy.spied(a, "a"), spy.spied(b, "b"), spy


def _event(aggregate: uuid.UUID, version: int, note: str) -> StoredEvent:
    return StoredEvent(aggregate, version, "tests:Note", f'{{"note":"{note}"}}'.encode())


def _chain_holds(url: str, aggregate: uuid.UUID) -> list[int]:
    """The aggregate's versions, each checked to chain to its predecessor's stored hash."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT originator_version, prev_hash, hash FROM billingledger_events"
            " WHERE originator_id = %s ORDER BY originator_version",
            (aggregate,),
        ).fetchall()
    for (version, prev, _), before in zip(rows, [None, *rows], strict=False):
        assert prev == (GENESIS if version == 1 else before[2]), f"v{version} does not chain"
    return [r[0] for r in rows]


def test_a_process_chains_to_what_it_committed_without_reading_it_back(
    recorders: tuple[LedgerRecorder, LedgerRecorder, _Recorders], settings: Settings
) -> None:
    a, _, spy = recorders
    aggregate = uuid.uuid4()
    for version in (1, 2, 3):
        a.insert_events([_event(aggregate, version, f"n{version}")])
    a.insert_events([_event(aggregate, 4, "n4"), _event(aggregate, 5, "n5")])
    assert spy.read["a"] == []  # every predecessor was its own, just committed
    assert _chain_holds(settings.database_url, aggregate) == [1, 2, 3, 4, 5]


def test_after_another_process_appended_the_hash_is_read_from_the_store(
    recorders: tuple[LedgerRecorder, LedgerRecorder, _Recorders], settings: Settings
) -> None:
    a, b, spy = recorders
    aggregate = uuid.uuid4()
    a.insert_events([_event(aggregate, 1, "a1")])
    b.insert_events([_event(aggregate, 2, "b2")])  # b never saw v1: read
    a.insert_events([_event(aggregate, 3, "a3")])  # a's newest is v1, not v2: read
    assert spy.read == {"a": [(aggregate, 2)], "b": [(aggregate, 1)]}
    assert _chain_holds(settings.database_url, aggregate) == [1, 2, 3]


def test_an_append_that_was_refused_is_not_kept_as_the_aggregate_s_newest(
    recorders: tuple[LedgerRecorder, LedgerRecorder, _Recorders], settings: Settings
) -> None:
    a, b, spy = recorders
    aggregate = uuid.uuid4()
    a.insert_events([_event(aggregate, 1, "a1")])
    b.insert_events([_event(aggregate, 2, "b2")])
    with pytest.raises(IntegrityError):  # a's own v2 lost the race: rolled back
        a.insert_events([_event(aggregate, 2, "a2")])
    a.insert_events([_event(aggregate, 3, "a3")])  # chained to b's v2, read from the store
    assert spy.read["a"] == [(aggregate, 2)]  # (v1 was its own)
    assert _chain_holds(settings.database_url, aggregate) == [1, 2, 3]


def test_a_database_made_again_under_the_process_is_read_not_trusted(
    recorders: tuple[LedgerRecorder, LedgerRecorder, _Recorders], settings: Settings
) -> None:
    """A database that lost committed rows (made again here: as a restore or a failover to
    a replica behind would leave it) is another database to the recorder: the hash it
    kept is forgotten, the predecessor is read, and its absence refuses the append (a
    decision on a state the store no longer holds), as before anything was kept."""
    a, _, spy = recorders
    aggregate = uuid.uuid4()
    a.insert_events([_event(aggregate, 1, "a1")])
    a.insert_events([_event(aggregate, 2, "a2")])
    name = conninfo_to_dict(settings.database_url)["dbname"]
    server = make_conninfo(settings.database_url, dbname="postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(SQL("DROP DATABASE {} WITH (FORCE)").format(Identifier(name)))
        conn.execute(SQL("CREATE DATABASE {}").format(Identifier(name)))
    migrate(settings)
    with pytest.raises(IntegrityError, match="version 2 is not stored"):
        a.insert_events([_event(aggregate, 3, "a3")])
    assert (aggregate, 2) in spy.read["a"]


def test_the_hashes_kept_are_bounded_the_least_recently_appended_to_going_first(
    recorders: tuple[LedgerRecorder, LedgerRecorder, _Recorders],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, _, _ = recorders
    monkeypatch.setattr("store.recorder.MAX_HEADS", 3)
    first, *others = [uuid.uuid4() for _ in range(5)]
    a.insert_events([_event(first, 1, "x")])
    for aggregate in others:
        a.insert_events([_event(aggregate, 1, "x")])
    assert list(a._heads) == others[1:]  # the first two went
    a.insert_events([_event(first, 2, "again")])  # read back, then kept as the newest
    assert list(a._heads) == [*others[2:], first]
