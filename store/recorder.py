"""The PostgreSQL event store: eventsourcing's recorder, without the table lock.

eventsourcing's stock ``PostgresApplicationRecorder`` runs ``LOCK TABLE ... IN
EXCLUSIVE MODE`` and ``NOTIFY`` inside every insert so that a follower reading by
``notification_id`` never skips a row that commits late. That serialises every
writer. ``LedgerRecorder`` keeps the recorder's contract (same table, same
``(originator_id, originator_version)`` primary key that settles concurrent
writers, same ``IntegrityError``) but takes no lock: each row also stores the id of
the transaction that wrote it (``pg_current_xact_id()``), so a follower can read a
gap-free log by taking only rows whose transaction is older than every open one.
A trigger refuses UPDATE and DELETE on the events table: history is append-only.
The recorder makes no table: the events table, its columns and the trigger are
made by the migrations (``store.migrations``), so ``CREATE_TABLE`` is ``n`` in every
environment ``postgres_env`` gives, and ``create_table`` refuses.
Each row also carries ``hash`` and ``prev_hash`` (``domain.chain``): a SHA-256 over
its content and the hash of the aggregate's previous event, computed here, so an
audit can prove no row was edited or deleted behind the trigger's back. Hashes of
previous events that are not in the batch are read in one query per append.

Appends go in one plain transaction, as a binary ``COPY`` into the events table
when the caller does not need the notification ids (``save(...,
notification_ids=False)``; the ingest's batches), else as one ``INSERT ... SELECT
FROM unnest(...) RETURNING notification_id``. A duplicate ``(originator_id,
originator_version)`` fails either statement with the same ``IntegrityError``, and
the whole batch with it; so does an event whose previous version is neither in the
batch nor stored (decided on a state that was never saved: a gap the key cannot see).

``OrjsonTranscoder`` writes the very bytes eventsourcing's ``JSONTranscoder`` writes
(and reads them with it), ~2.5x faster for the flat events of the ingest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from operator import attrgetter
from typing import Any, NamedTuple, cast
from uuid import UUID

import orjson
import psycopg
from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    InterfaceError,
    JSONTranscoder,
    OperationalError,
    ProgrammingError,
    StoredEvent,
    Subscription,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import Cursor
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow
from psycopg.sql import SQL, Composed, Identifier
from psycopg.types.string import BytesBinaryDumper

from domain.chain import GENESIS, event_hash
from store.credit_rows import BalanceRow, upsert_balances
from store.ingest_rows import Row
from store.webhooks import WebhookReceipt, insert_receipts

__all__ = [
    "ConsumerPosition",
    "LedgerRecorder",
    "OrjsonTranscoder",
    "postgres_env",
    "stored_positions",
]

_JSON_NATIVE = frozenset({str, int, bool, type(None)})
_BY_VERSION = attrgetter("originator_version")
# Where a connection is: the server's start and the database's oid (a database made again
# under the same name has another).
_SERVER_IDENTITY = (
    "SELECT pg_postmaster_start_time() AS started,"
    " (SELECT oid FROM pg_database WHERE datname = current_database()) AS database"
)
# How many aggregates' newest committed events a recorder keeps (``_remember_heads``):
# an ingest batch touches a few hundred accounts and lines.
MAX_HEADS = 50_000
_STORED_COLUMNS = "originator_id, originator_version, topic, state"


class ConsumerPosition(NamedTuple):
    """How far a consumer group has processed one partition (the next offset to read)."""

    group_name: str
    topic: str
    partition: int
    next_offset: int


class LedgerRecorder(PostgresApplicationRecorder):
    """Application recorder with lock-free appends (see the module docstring)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name=events_table_name)
        # Each aggregate's newest event this process committed: version, hash (``_chain``).
        self._heads: OrderedDict[Any, tuple[int, bytes]] = OrderedDict()
        self._heads_server: tuple[Any, ...] | None = None  # the database they were kept in
        self._table = table = SQL("{0}.{1}").format(
            Identifier(self.datastore.schema), Identifier(self.events_table_name)
        )
        # Four arrays of plain types dump ~10x faster than one array of a composite type.
        self._insert_arrays = SQL(
            "INSERT INTO {0} (originator_id, originator_version, topic, state, prev_hash, hash) "
            "SELECT * FROM unnest(%s::{1}[], %s::bigint[], %s::text[], %s::bytea[], "
            "%s::bytea[], %s::bytea[]) RETURNING notification_id"
        ).format(table, SQL(self.datastore.originator_id_type))
        self._copy_events = SQL(
            "COPY {0} (originator_id, originator_version, topic, state, prev_hash, hash) "
            "FROM STDIN (FORMAT BINARY)"
        ).format(table)
        self._copy_types = [
            self.datastore.originator_id_type, "int8", "text", "bytea", "bytea", "bytea"
        ]  # fmt: skip
        # Each by id through the primary key (a LATERAL subquery per id, with an ORDER BY or
        # a LIMIT so it is not flattened into a join): given `= ANY(ids)` or a join, the
        # planner hashed the ids and scanned the whole table on a fresh table's statistics
        # (12 ms a batch at 40,000 rows, growing with it). Ids are passed distinct.
        self._select_latest = self._per_id(
            "originator_id, originator_version, topic", "",
            "ORDER BY originator_version DESC LIMIT 1",
        )  # fmt: skip
        self._select_recorded = self._per_id("originator_id", "", "LIMIT 1")
        self._select_histories = self._per_id(_STORED_COLUMNS, "", "ORDER BY originator_version")
        self._select_after = self._per_id(
            _STORED_COLUMNS, "AND originator_version > known.version", "ORDER BY originator_version"
        )
        self._select_first = self._per_id(_STORED_COLUMNS, "AND originator_version = 1", "LIMIT 1")
        self._select_hashes = self._per_id(
            "originator_id, originator_version, hash",
            "AND originator_version = known.version", "LIMIT 1",
        )  # fmt: skip

    def _per_id(self, columns: str, condition: str, rest: str) -> Composed:
        """For each id given (``%s``: an array; a second array of versions when the
        condition names ``known.version``), the rows of the subquery ``SELECT columns
        WHERE originator_id = id condition rest``, through the primary key. The pieces
        are this module's constants, never input."""
        with_versions = "known.version" in condition
        return SQL(
            "SELECT e.* FROM unnest({ids}{versions}) AS {known} CROSS JOIN LATERAL"
            " (SELECT {columns} FROM {table} WHERE originator_id = known.id {condition} {rest})"
            " AS e"
        ).format(
            ids=SQL("%s::{0}[]").format(SQL(self.datastore.originator_id_type)),
            versions=SQL(", %s::bigint[]" if with_versions else ""),
            known=SQL("known(id, version)" if with_versions else "known(id)"),
            columns=SQL(columns),
            table=self._table,
            condition=SQL(condition),
            rest=SQL(rest),
        )

    def create_table(self) -> None:
        """Refused: the schema is made by ``billing-ledger migrate``, never by a process
        at start (``CREATE_TABLE=n``; see ``store.migrations``)."""
        raise ProgrammingError(
            "LedgerRecorder creates no tables: run billing-ledger migrate (and set CREATE_TABLE=n)"
        )

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        notification_ids: bool = True,
        rows: Sequence[Row] = (),
        balances: Mapping[UUID, BalanceRow] | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Insert in one plain transaction (no pipeline: nothing else to send first).

        The stock recorder pipelines the lock, the NOTIFY and the insert; with a
        multi-megabyte batch that pipeline stalled here with both ends waiting to read.
        With ``notification_ids=False`` the rows are copied and None is returned; then
        ``rows`` (already encoded and chained: ``store.ingest_rows``, new aggregates
        only) are copied after the events, in the same transaction. ``balances``: the
        saved accounts' credit balance rows by account (``store.credit_rows``), written last.
        """
        if rows and notification_ids:
            raise ProgrammingError("ready rows are copied: save them with notification_ids=False")
        ids: list[int] | None = None
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            self._insert_events(curs, stored_events, **kwargs)  # e.g. a process's tracking row
            if not stored_events and not rows:
                return []
            chained = self._chain(curs, stored_events)
            if not notification_ids:
                self._copy(curs, stored_events, chained, rows)
                if balances:
                    upsert_balances(curs, list(balances.values()))
            else:
                ids = self._insert_returning(curs, stored_events, chained, balances)
        if getattr(conn, "_ledger_server", None) == self._heads_server:
            self._remember_heads(stored_events, chained)  # committed: history now
        return ids

    def _insert_returning(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        chained: Sequence[tuple[bytes, bytes]],
        balances: Mapping[UUID, BalanceRow] | None,
    ) -> list[int]:
        """Insert the events and return their notification ids (then the balances)."""
        curs.execute(
            self._insert_arrays,
            (
                [e.originator_id for e in stored_events],
                [e.originator_version for e in stored_events],
                [e.topic for e in stored_events],
                [e.state for e in stored_events],
                [prev for prev, _ in chained],
                [digest for _, digest in chained],
            ),
            binary=True,
        )
        ids = [row["notification_id"] for row in curs.fetchall()]
        if balances:
            upsert_balances(curs, list(balances.values()))
        return ids

    def _remember_heads(
        self, stored_events: Sequence[StoredEvent], chained: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """Keep each aggregate's newest event this process has committed (its version and
        hash), so that its next append chains to it without reading it back (``_chain``).
        The table is append-only, so a committed row stays as it is: what is kept is not
        wrong, only perhaps not the newest (another process appended since), and then the
        version does not match and the hash is read as before. A database that lost
        committed rows (a failover to a replica behind, a restore, the database made
        again) is another server start or another database: what was kept is forgotten
        when a connection first finds either (``_check_server``), so the read finds the
        gap as it always did. At most ``MAX_HEADS`` aggregates, the least
        recently appended to going first."""
        heads = self._heads
        for e, (_, digest) in zip(stored_events, chained, strict=True):
            head = heads.get(e.originator_id)
            if head is None or head[0] < e.originator_version:
                heads[e.originator_id] = (e.originator_version, digest)
                with suppress(KeyError):  # cleared by another thread meanwhile
                    heads.move_to_end(e.originator_id)
        while len(heads) > MAX_HEADS:
            try:
                heads.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                break

    def _check_server(self, curs: Cursor[DictRow]) -> None:
        """On a connection not seen before, which server start and database it reaches;
        the hashes kept (``_remember_heads``) are forgotten when that is not where they
        were kept. One query per connection, not per append."""
        conn: Any = curs.connection
        if getattr(conn, "_ledger_server", None) is not None:
            return
        curs.execute(_SERVER_IDENTITY)
        row = curs.fetchone()
        identity = (row["started"], row["database"]) if row else ("unknown",)
        if identity != self._heads_server:
            self._heads.clear()
            self._heads_server = identity
        conn._ledger_server = identity

    def _copy(
        self,
        curs: Cursor[DictRow],
        stored_events: Iterable[StoredEvent],
        chained: Sequence[tuple[bytes, bytes]],
        rows: Sequence[Row],
    ) -> None:
        # Binary COPY: ~2 us of client CPU per row, against ~18 us to dump four arrays.
        # By oid, bytea's binary dumper is the DB-API ``Binary`` wrapper's, in Python (a
        # call per value, three a row); registering bytes' own puts psycopg's C one there.
        curs.adapters.register_dumper(bytes, BytesBinaryDumper)
        with curs.copy(self._copy_events) as copy:
            copy.set_types(self._copy_types)
            for e, (prev, digest) in zip(stored_events, chained, strict=True):
                copy.write_row(
                    (e.originator_id, e.originator_version, e.topic, e.state, prev, digest)
                )
            write = copy.write_row
            for row in rows:
                write(row)

    def _chain(
        self, curs: Cursor[DictRow], stored_events: Sequence[StoredEvent]
    ) -> list[tuple[bytes, bytes]]:
        """``(prev_hash, hash)`` of each event, in the given order (see ``domain.chain``).

        Chains within the batch; the hashes of previous events stored before are read
        in one query, inside the append's transaction.
        """
        in_batch = {(e.originator_id, e.originator_version) for e in stored_events}
        heads = self._heads
        self._check_server(curs)
        known: dict[tuple[Any, int], bytes | None] = {}
        wanted: list[tuple[Any, int]] = []
        for e in stored_events:
            before = (e.originator_id, e.originator_version - 1)
            if e.originator_version == 1 or before in in_batch:
                continue
            head = heads.get(e.originator_id)
            if head is not None and head[0] == before[1]:
                known[before] = head[1]  # this process committed it (``_remember_heads``)
            else:
                wanted.append(before)
        hashes = self._stored_hashes(curs, wanted)
        hashes.update(known)
        chained: dict[tuple[Any, int], tuple[bytes, bytes]] = {}
        for e in sorted(stored_events, key=_BY_VERSION):  # a predecessor before its successor
            key = (e.originator_id, e.originator_version)
            prev_key = (e.originator_id, e.originator_version - 1)
            if e.originator_version == 1:
                prev = GENESIS
            elif prev_key in chained:
                prev = chained[prev_key][1]
            elif prev_key not in hashes:
                raise IntegrityError(f"{key}: version {e.originator_version - 1} is not stored")
            else:
                prev = hashes[prev_key] or GENESIS  # a row from before hashes: audit says so
            chained[key] = (
                prev,
                # The ledger's ids are UUIDs (the table's originator_id is uuid).
                event_hash(
                    prev, cast(UUID, e.originator_id), e.originator_version, e.topic, e.state
                ),
            )
        return [chained[e.originator_id, e.originator_version] for e in stored_events]

    def _stored_hashes(
        self, curs: Cursor[DictRow], keys: Sequence[tuple[Any, int]]
    ) -> dict[tuple[Any, int], bytes | None]:
        if not keys:
            return {}
        curs.execute(self._select_hashes, ([k[0] for k in keys], [k[1] for k in keys]))
        return {
            (row["originator_id"], row["originator_version"]): row["hash"]
            for row in curs.fetchall()
        }

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_recorded_ids(self, originator_ids: Iterable[UUID]) -> set[UUID]:
        """Which of these aggregates have at least one event (one query)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._select_recorded, (list(set(originator_ids)),))
            return {row["originator_id"] for row in curs.fetchall()}

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_latest(self, originator_ids: Iterable[UUID]) -> dict[UUID, tuple[int, str]]:
        """Each aggregate's newest version and the topic of its newest event (one query)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._select_latest, (list(set(originator_ids)),))
            return {
                row["originator_id"]: (row["originator_version"], row["topic"])
                for row in curs.fetchall()
            }

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_histories(self, originator_ids: Iterable[UUID]) -> list[StoredEvent]:
        """Every event of these aggregates, each aggregate's in order (one query)."""
        return self._stored(self._select_histories, originator_ids)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_after(self, versions: dict[UUID, int]) -> list[StoredEvent]:
        """The events of these aggregates after the given versions, each aggregate's in
        order (one query: how a batch fast-forwards the aggregates it has cached)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._select_after, (list(versions), list(versions.values())))
            return [
                StoredEvent(r["originator_id"], r["originator_version"], r["topic"], r["state"])
                for r in curs.fetchall()
            ]

    def select_first_events(self, originator_ids: Iterable[UUID]) -> list[StoredEvent]:
        """The first event (version 1) of each of these aggregates that has one (one query)."""
        return self._stored(self._select_first, originator_ids)

    def _stored(self, statement: Composed, originator_ids: Iterable[UUID]) -> list[StoredEvent]:
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(statement, (list(set(originator_ids)),))
            return [
                StoredEvent(r["originator_id"], r["originator_version"], r["topic"], r["state"])
                for r in curs.fetchall()
            ]

    def _insert_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        positions: Sequence[ConsumerPosition] = (),
        webhooks: Sequence[WebhookReceipt] = (),
        **kwargs: Any,
    ) -> None:
        """Record Kafka consumer positions, or Stripe events' receipts, in the same
        transaction as the events.

        A process manager passes ``save(..., positions=[...])``: what it records and
        how far it has consumed commit together, or not at all. The webhook handler
        passes ``save(..., webhooks=[receipt, ...])``: a Stripe event id already
        recorded raises ``AlreadyReceived`` and the effects are rolled back with it.
        """
        if webhooks:
            insert_receipts(curs, webhooks)
        if positions:
            curs.execute(
                "INSERT INTO billing.consumer_positions (group_name, topic, partition, next_offset)"
                " SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::bigint[])"
                " ON CONFLICT (group_name, topic, partition) DO UPDATE"
                " SET next_offset = GREATEST(billing.consumer_positions.next_offset,"
                " EXCLUDED.next_offset)",
                [list(column) for column in zip(*positions, strict=True)],
            )
        super()._insert_events(curs, stored_events, **kwargs)

    def _lock_table(self, curs: Cursor[DictRow]) -> None:
        """No table lock: the primary key settles concurrent writers."""

    def _notify_channel(self, curs: Cursor[DictRow]) -> None:
        """No NOTIFY (it serialises commits too); followers poll by transaction id."""

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """Refused at once: the library's subscription LISTENs for a NOTIFY this recorder
        never sends, so it would wait for ever. Follow the log with ``store.eventlog.follow``."""
        raise NotImplementedError(
            "LedgerRecorder sends no NOTIFY, so a subscription would never hear an event:"
            " follow the log by transaction id with store.eventlog.follow instead"
        )


class OrjsonTranscoder(JSONTranscoder):
    """``JSONTranscoder``'s bytes from orjson, for a flat object of plain and registered types.

    A registered type (UUID, Decimal, datetime) becomes ``{"_type_": name, "_data_":
    encoded}`` as the library writes it; orjson then writes the flat dict (it escapes
    strings as ``json`` does with ``ensure_ascii=False``). A list of plain values (text,
    integers, booleans, nulls: an ingest save's ``AmountsReserved``, ``Settled``,
    ``CreditsConsumed``, ``CreditsApplied``) is written by orjson too, as ``json``
    writes it. Anything else (a list of anything else, a nested dict, an int beyond 64
    bits, a str subclass) takes the library's own encoder, so the stored bytes never
    differ. Decoding is the library's.
    """

    def encode(self, obj: Any) -> bytes:
        if type(obj) is not dict:
            return super().encode(obj)
        flat: dict[str, Any] = {}
        for key, value in obj.items():
            kind = type(value)
            if kind in _JSON_NATIVE or (kind is list and _plain_list(value)):
                flat[key] = value
            elif kind in self.types:
                transcoding = self.types[kind]
                flat[key] = {"_type_": transcoding.name, "_data_": transcoding.encode(value)}
            else:
                return super().encode(obj)
        try:
            return orjson.dumps(flat)
        except (TypeError, orjson.JSONEncodeError):  # e.g. an int beyond 64 bits
            return super().encode(obj)


def _plain_list(values: list[Any]) -> bool:
    """Whether every item is a plain value (``_JSON_NATIVE``): orjson writes the list."""
    return all(type(item) in _JSON_NATIVE for item in values)


def postgres_env(url: str, *, pool_size: int = 4, lock_free: bool = True) -> dict[str, str]:
    """eventsourcing's environment for the PostgreSQL at ``url`` (a libpq URI); with
    ``CREATE_TABLE`` ``n`` (its default is yes): the migrations own the schema."""
    params: dict[str, Any] = conninfo_to_dict(url)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(params.get("dbname") or params.get("user") or "postgres"),
        "POSTGRES_HOST": str(params.get("host") or "127.0.0.1"),
        "POSTGRES_PORT": str(params.get("port") or "5432"),
        "POSTGRES_USER": str(params.get("user") or "postgres"),
        "POSTGRES_PASSWORD": str(params.get("password") or ""),
        "POSTGRES_POOL_SIZE": str(pool_size),
        "POSTGRES_CONNECT_TIMEOUT": "10",
        "CREATE_TABLE": "n",
    }
    if lock_free:
        env["APPLICATION_RECORDER_TOPIC"] = f"{__name__}:{LedgerRecorder.__name__}"
    return env


def stored_positions(
    conn: psycopg.Connection[Any], group: str, topic: str, partitions: Sequence[int]
) -> dict[int, int]:
    """The next offsets recorded for ``group`` on these partitions of ``topic``
    (what ``save(..., positions=...)`` stored with the steps)."""
    rows = conn.execute(
        "SELECT partition, next_offset FROM billing.consumer_positions"
        " WHERE group_name = %s AND topic = %s AND partition = ANY(%s)",
        (group, topic, list(partitions)),
    ).fetchall()
    return {int(p): int(o) for p, o in rows}
