"""Sealed snapshots: the ledger uses a snapshot only if it is tied to the event it was
taken at.

eventsourcing's snapshot recorder stores and returns snapshots as they are, so a row
inserted into the snapshots table by anyone with the writer's login (a customer's
state with the spend limit lifted, say) was loaded as the customer's account.
``SealedSnapshotRecorder`` keeps the recorder's table and contract and adds a
``seal`` column (migration 5):

* **taking** a snapshot reads the hash of its head event (same aggregate, same
  version) in the same transaction and stores ``domain.chain.snapshot_seal(head hash,
  id, version, topic, state)``;
* **loading** reads each snapshot with its head event's hash (one query, a join) and
  returns only snapshots whose seal matches. Any other (forged, edited, sealed to an
  event that is not there, or taken before migration 5) is passed over with a
  warning, counted in ``refused``, and the repository rebuilds the aggregate from its
  events: slower, never wrong. The audit reports such rows too
  (``adapters.audit``: ``snapshot``).

What the seal does not do: the writer can compute it too (it is a hash, not a
signature), so a writer forging a sealed snapshot is as possible as a writer forging
an event; the audit's replay, which never reads snapshots, is what catches what
either would change (``limit_exceeded``, ``sequence``). What it ends is a snapshot
trusted on load with nothing tying it to the history.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    InterfaceError,
    OperationalError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg.rows import dict_row
from psycopg.sql import SQL, Composable, Composed, Identifier

from domain.chain import snapshot_seal
from store.schema import EVENTS_TABLE, SNAPSHOTS_TABLE

__all__ = ["SealedSnapshotRecorder", "seal_holds", "unsealed_snapshots"]

log = logging.getLogger(__name__)


def seal_holds(row: dict[str, Any]) -> bool:
    """Whether a snapshot row (with its head event's ``head_hash``) is sealed to it."""
    seal, head = row.get("seal"), row.get("head_hash")
    if seal is None or head is None:
        return False
    expected = snapshot_seal(
        bytes(head), row["originator_id"], row["originator_version"], row["topic"],
        bytes(row["state"]),
    )  # fmt: skip
    return bytes(seal) == expected


class SealedSnapshotRecorder(PostgresAggregateRecorder):
    """The snapshots' recorder, sealing and checking seals (see the module docstring)."""

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str, history_table_name: str
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = Identifier(self.datastore.schema)
        table = SQL("{0}.{1}").format(schema, Identifier(self.events_table_name))
        history = SQL("{0}.{1}").format(schema, Identifier(history_table_name))
        id_type = SQL(self.datastore.originator_id_type)
        self._select_heads = SQL(
            "SELECT originator_id, originator_version, hash FROM {0}"
            " WHERE (originator_id, originator_version) IN"
            " (SELECT * FROM unnest(%s::{1}[], %s::bigint[]))"
        ).format(history, id_type)
        self._insert_sealed = SQL(
            "INSERT INTO {0} (originator_id, originator_version, topic, state, seal)"
            " SELECT * FROM unnest(%s::{1}[], %s::bigint[], %s::text[], %s::bytea[],"
            " %s::bytea[])"
        ).format(table, id_type)
        self._select_sealed = _with_heads(table, history) + SQL(" WHERE s.originator_id = %s")
        self.refused = 0

    def create_table(self) -> None:
        """Refused: the migrations make the table (``store.migrations``)."""
        raise ProgrammingError("the snapshots table is made by billing-ledger migrate")

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Seal and insert, in one transaction with the read of the head events' hashes."""
        if not stored_events:
            return None
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            curs.execute(
                self._select_heads,
                ([s.originator_id for s in stored_events],
                 [s.originator_version for s in stored_events]),
            )  # fmt: skip
            heads = {(r["originator_id"], r["originator_version"]): r["hash"] for r in curs}
            seals = []
            for s in stored_events:
                head = heads.get((s.originator_id, s.originator_version))
                seals.append(
                    None
                    if head is None
                    else snapshot_seal(
                        bytes(head), _uuid(s.originator_id), s.originator_version, s.topic,
                        s.state,
                    )
                )  # fmt: skip
            curs.execute(
                self._insert_sealed,
                ([s.originator_id for s in stored_events],
                 [s.originator_version for s in stored_events],
                 [s.topic for s in stored_events], [s.state for s in stored_events], seals),
                binary=True,
            )  # fmt: skip
        return None

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The aggregate's snapshots that hold their seal (the others passed over)."""
        statement: Composed = self._select_sealed
        params: list[Any] = [originator_id]
        if gt is not None:
            statement += SQL(" AND s.originator_version > %s")
            params.append(gt)
        if lte is not None:
            statement += SQL(" AND s.originator_version <= %s")
            params.append(lte)
        statement += SQL(
            " ORDER BY s.originator_version DESC" if desc else " ORDER BY s.originator_version"
        )
        if limit is not None:
            statement += SQL(" LIMIT %s")
            params.append(limit)
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            rows = curs.execute(statement, params).fetchall()
        held = []
        for row in rows:
            if seal_holds(row):
                held.append(
                    StoredEvent(row["originator_id"], row["originator_version"], row["topic"],
                                bytes(row["state"]))
                )  # fmt: skip
            else:
                self.refused += 1
                log.warning(
                    "snapshot of %s at version %d not used: its seal does not match its head"
                    " event (rebuilt from the events)",
                    row["originator_id"], row["originator_version"],
                )  # fmt: skip
        return held


def unsealed_snapshots(conn: psycopg.Connection[Any]) -> list[tuple[UUID, int]]:
    """(aggregate id, version) of every snapshot whose seal does not hold (the audit's
    ``snapshot`` finding), read in the caller's transaction, in table order."""
    query = _with_heads(
        Identifier("public", SNAPSHOTS_TABLE), Identifier("public", EVENTS_TABLE)
    ) + SQL(" ORDER BY s.originator_id, s.originator_version")
    with conn.cursor(row_factory=dict_row) as curs:
        return [
            (row["originator_id"], row["originator_version"])
            for row in curs.execute(query)
            if not seal_holds(row)
        ]


def _with_heads(snapshots: Composable, history: Composable) -> Composed:
    """Snapshots (``s``) with the hash of the event each was taken at (``head_hash``)."""
    return SQL(
        "SELECT s.originator_id, s.originator_version, s.topic, s.state, s.seal,"
        " e.hash AS head_hash FROM {0} s LEFT JOIN {1} e"
        " ON e.originator_id = s.originator_id AND e.originator_version = s.originator_version"
    ).format(snapshots, history)


def _uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)
