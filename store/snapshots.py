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
* **loading** reads each snapshot with its head event's hash (a join) and returns only
  snapshots whose seal matches; ``limit`` counts those, not the rows read (the newest
  row may be a forged one: the next is read, in pages that double). Any other
  (forged, edited, malformed, or taken before migration 5) is passed over with a
  warning, counted in ``refused``, and the repository rebuilds the aggregate from its
  events or an older snapshot: slower, never wrong. Rows above the aggregate's newest
  event (no head to seal to: the writer may insert any number) are not read at all,
  so passing over forged rows costs at most one row per event of the history. The
  audit reports every such row (``adapters.audit``: ``snapshot``, saying why);
* a snapshot whose version already has a row (a forged one inserted ahead of the
  history, say) is dropped with a warning, not raised: the save that takes it has
  committed its events, and a snapshot is only a cache.

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

__all__ = ["SealedSnapshotRecorder", "seal_problem", "unsealed_snapshots"]

log = logging.getLogger(__name__)


def seal_problem(row: dict[str, Any]) -> str | None:
    """Why a snapshot row (with its head event's ``head_hash``) is not sealed to it;
    None when it is. Never raises on what the columns allow (NULLs, any version)."""
    seal, head = row.get("seal"), row.get("head_hash")
    topic, state, version = row.get("topic"), row.get("state"), row["originator_version"]
    if seal is None:
        return "no seal (taken before migration 5, or inserted without one)"
    if head is None:
        return "no hashed event at its version (none there, or one from before hashes)"
    if not isinstance(topic, str) or state is None or version < 0:
        return "malformed: no topic or no state, or a negative version"
    expected = snapshot_seal(bytes(head), row["originator_id"], version, topic, bytes(state))
    if bytes(seal) != expected:
        return "its seal does not match its head event (forged or edited)"
    return None


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
            " %s::bytea[]) ON CONFLICT DO NOTHING"
        ).format(table, id_type)
        # Not above the aggregate's newest event: a row there has no head to be sealed to.
        self._select_sealed = _with_heads(table, history) + SQL(
            " WHERE s.originator_id = %s AND s.originator_version <="
            " (SELECT max(originator_version) FROM {0} WHERE originator_id = %s)"
        ).format(history)
        # Per id, a probe of the primary key (as the batch reads of the events table).
        self._select_snapshotted = SQL(
            "SELECT known.id AS originator_id FROM unnest(%s::{1}[]) AS known(id)"
            " WHERE EXISTS (SELECT 1 FROM {0} s WHERE s.originator_id = known.id)"
        ).format(table, id_type)
        self.refused = 0

    def create_table(self) -> None:
        """Refused: the migrations make the table (``store.migrations``)."""
        raise ProgrammingError("the snapshots table is made by billing-ledger migrate")

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Seal and insert, in one transaction with the read of the head events' hashes;
        a snapshot whose version already has a row is dropped (see the module docstring)."""
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
            dropped = len(stored_events) - curs.rowcount
        if dropped:
            log.warning(
                "%d of these snapshots not stored, their versions already having a row: %s",
                dropped,
                ", ".join(f"{s.originator_id} v{s.originator_version}" for s in stored_events),
            )
        return None

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_snapshotted_ids(self, originator_ids: Sequence[UUID]) -> set[UUID]:
        """Which of these aggregates have any row in the snapshots table, sealed or not
        (one query): the others are read from their events alone, as the repository
        would read them (``store.batch_reads``)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._select_snapshotted, (list(set(originator_ids)),))
            return {row["originator_id"] for row in curs.fetchall()}

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
        """The aggregate's snapshots that hold their seal (the others passed over), as
        the library's: ``gt``/``lte`` bound the versions, ``limit`` counts the
        snapshots returned; read in pages until ``limit`` of them hold."""
        held: list[StoredEvent] = []
        page = limit
        while True:
            rows = self._select_page(originator_id, gt, lte, desc, page)
            for row in rows:
                problem = seal_problem(row)
                if problem is None:
                    held.append(
                        StoredEvent(row["originator_id"], row["originator_version"],
                                    row["topic"], bytes(row["state"]))
                    )  # fmt: skip
                    if limit is not None and len(held) == limit:
                        return held
                else:
                    self.refused += 1
                    log.warning(
                        "snapshot of %s v%d not used: %s (an older one or the events are)",
                        row["originator_id"], row["originator_version"], problem,
                    )  # fmt: skip
            if not rows or page is None or len(rows) < page:  # all read (limit 0: none)
                return held
            last = rows[-1]["originator_version"]
            if desc:
                lte = last - 1
            else:
                gt = last
            page *= 2

    def _select_page(
        self,
        originator_id: UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[dict[str, Any]]:
        statement: Composed = self._select_sealed
        params: list[Any] = [originator_id, originator_id]
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
            rows: list[dict[str, Any]] = curs.execute(statement, params).fetchall()
        return rows


def unsealed_snapshots(conn: psycopg.Connection[Any]) -> list[tuple[UUID, int, str]]:
    """(aggregate id, version, why) of every snapshot whose seal does not hold (the
    audit's ``snapshot`` finding), read in the caller's transaction, in table order."""
    query = _with_heads(
        Identifier("public", SNAPSHOTS_TABLE), Identifier("public", EVENTS_TABLE)
    ) + SQL(" ORDER BY s.originator_id, s.originator_version")
    with conn.cursor(row_factory=dict_row) as curs:
        return [
            (row["originator_id"], row["originator_version"], problem)
            for row in curs.execute(query)
            if (problem := seal_problem(row)) is not None
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
