"""The projector: follows the event store and keeps the SQL read models, exactly once.

It reads the log with the store's gap-free reader (``store.eventlog.read_after``)
and decodes rows with the application's own mapper. For each projection, one
database transaction locks the projection's row in ``billing.projection_positions``,
applies the next batch after that position to the projection's table and moves the
position. The rows and the position commit together or not at all, so a crash
mid-batch leaves both as they were and the batch is applied once, later. The row lock
(held only inside that transaction, released by a crash like any other) makes two
projectors of one projection take turns instead of both applying a batch.

The batch is read and decoded before that transaction begins, at the position as it
stood: the lock gives the transaction an id, and while a transaction with an id is
open, no follower of the log (the relay, the other lane) can read a save committed
after it began. When another projector moved the position meanwhile, the batch read
is not the one after the locked position, and the one that is is read inside. When
nothing is visible after the position, no transaction is begun at all (an idle lane's
poll takes no transaction id).

``rebuild(name)`` replays the whole history into a shadow table, then in one
transaction catches it up to the end of the log, drops the live table, renames the
shadow in its place and moves the position. A reader sees the old table or the new
one, never an empty or partial one. The shadow is made ``LIKE`` the live table
(columns, defaults, generated columns, constraints, indexes), so the migrations stay
the one definition of a read model's shape; PostgreSQL names the copied indexes
after the shadow, so the swap gives each the name of its live counterpart (matched
by definition) and the live table's grants.

Two lanes: the project role runs two projectors, each its own thread and positions.
``MAIN_LANE`` applies every read model but the credit ones, a batch of every event;
``CREDIT_LANE`` applies ``billing.credit_grants`` and ``billing.credit_balances``
alone, reading only the events they fold (``topics``; ``store.eventlog.read_topics_after``
moves its position past the others unread). A round of the main lane is long (eleven
read models, thousands of events); the credit lane's is a few rows, so a customer's
balance is in SQL as soon as the log lets it read the save that moved it, whatever the
other read models are doing. A projector built without lanes (``Projector(db, decode)``)
applies them all, as the tools and tests do.

The tables and their position rows are made by the migrations (``store.migrations``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from projections.balances import BalancesProjection
from projections.base import SCHEMA, Decode, History, Projection, UnknownProjection
from projections.charge_attempts import ChargeAttemptsProjection
from projections.contracts import ContractVersionsProjection
from projections.credits import CREDIT_BALANCES, CREDIT_GRANTS
from projections.invoice_lines import InvoiceLinesProjection, LinePushesProjection
from projections.invoices import InvoiceEventsProjection, InvoicesProjection
from projections.purchases import PurchasesProjection
from projections.transactions import TransactionsProjection
from store.connections import Database
from store.eventlog import START, Position, follow, read_after, read_topics_after
from store.migrations.runner import retry_delays
from store.schema import EVENTS_TABLE

__all__ = [
    "CREDIT_LANE",
    "MAIN_LANE",
    "PROJECTIONS",
    "Projector",
    "RebuildLocked",
    "RebuildReport",
    "projection",
    "projector_behind",
    "rebuild",
]

log = logging.getLogger(__name__)

PROJECTIONS: tuple[Projection, ...] = (
    TransactionsProjection(),
    BalancesProjection(),
    ChargeAttemptsProjection(),
    InvoiceLinesProjection(),
    LinePushesProjection(),
    InvoicesProjection(),
    InvoiceEventsProjection(),
    CREDIT_GRANTS,
    CREDIT_BALANCES,
    ContractVersionsProjection(),
    PurchasesProjection(),
)

CREDIT_LANE: tuple[Projection, ...] = (CREDIT_GRANTS, CREDIT_BALANCES)
"""The credit projections, which the project role keeps apart from the others, in a
projector of their own that reads only their events (``CREDIT_TOPICS``): a customer's
balance is in SQL as soon as the save that moved it is readable, however far behind
the other read models are."""
MAIN_LANE: tuple[Projection, ...] = tuple(p for p in PROJECTIONS if p not in CREDIT_LANE)

_SHADOW_SUFFIX = "__rebuild"


def projection(name: str) -> Projection:
    """The projection called ``name`` (raises UnknownProjection)."""
    for p in PROJECTIONS:
        if p.name == name:
            return p
    names = ", ".join(p.name for p in PROJECTIONS)
    raise UnknownProjection(f"unknown projection {name!r} (one of: {names})")


class Projector:
    """Applies new events to each projection; ``pump()`` once, or ``run(stop)``."""

    def __init__(
        self,
        database: Database,
        decode: Decode,
        *,
        projections: Sequence[Projection] = PROJECTIONS,
        batch: int = 2000,
        topics: Iterable[str] | None = None,
    ) -> None:
        self.database = database
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.decode = decode
        self.projections = tuple(projections)
        self.batch = batch
        self.topics = None if topics is None else tuple(sorted(set(topics)))
        self.history = History(decode)
        self.applied = 0
        self._conn: psycopg.Connection[Any] | None = None

    def run(self, stop: threading.Event, idle_wait_s: float = 0.05) -> None:
        try:
            follow(self.pump, stop, name="projector", idle_wait_s=idle_wait_s, on_round=self.pulse)
        finally:
            self.close()

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def pump(self) -> int:
        """Apply the next batch of visible events to each projection; returns how many."""
        if self._conn is None or self._conn.closed:
            self._conn = self.database.dedicated(autocommit=True)
        cache: dict[Position, Batch] = {}
        try:
            total = sum(self._pump(self._conn, p, cache) for p in self.projections)
        except psycopg.OperationalError:
            self.close()  # reconnect on the next pump
            raise
        self.applied += total
        return total

    def pump_all(self) -> int:
        """Pump until nothing visible is left; returns how many events were applied."""
        total = 0
        while applied := self.pump():
            total += applied
        return total

    def _pump(
        self, conn: psycopg.Connection[Any], p: Projection, cache: dict[Position, Batch]
    ) -> int:
        # Read and decode the batch before the transaction: its row lock gives it a
        # transaction id, and while that is open no follower of the log (the relay, the
        # other lane) sees a save committed after it began. The batch is the same rows
        # read inside (a prefix of the log after the position, whatever the snapshot);
        # another projector that moved the position meanwhile makes it a cache miss.
        ahead = _read_position(conn, p.name)
        if ahead not in cache:
            cache[ahead] = _read_batch(conn, ahead, self.batch, self.history, self.topics)
        events, last = cache[ahead]
        if not events and last == ahead:
            return 0  # nothing visible after it: no transaction (and no id) at all
        with conn.transaction():
            position = _lock_position(conn, p.name)
            applied, last = _apply_next(
                conn, p, p.name, position, limit=self.batch, history=self.history, cache=cache,
                topics=self.topics,
            )  # fmt: skip
            if last != position:
                _store_position(conn, p.name, last)
        return applied


class RebuildLocked(RuntimeError):
    """A rebuild could not lock its live table to swap the shadow in (a long reader)."""


@dataclass(frozen=True)
class RebuildReport:
    name: str
    events: int
    rows: int


SWAP_LOCK_TIMEOUT_S = 2.0
SWAP_ATTEMPTS = 10


def rebuild(
    database: Database,
    name: str,
    decode: Decode,
    *,
    batch: int = 5000,
    before_swap: Callable[[], None] | None = None,
    lock_timeout_s: float = SWAP_LOCK_TIMEOUT_S,
    attempts: int = SWAP_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> RebuildReport:
    """Recompute projection ``name`` from the first event and swap it in atomically.

    The swap takes the live table's lock *before* the last events are applied to the
    shadow, so no write to the live table (a save's ``billing.credit_balances`` row,
    ``store.credit_rows``) can land between them and be dropped with it: such a save
    waits and writes to the new table. Waiting for that lock (behind a long reader)
    holds up every writer queued after it, so it gives up after ``lock_timeout_s`` and
    tries again after a jittered pause, ``attempts`` times, then raises
    ``RebuildLocked``.

    ``before_swap`` runs when the shadow table is built and before the swap (tests
    use it to read the live table while the shadow exists).
    """
    p = projection(name)
    shadow = p.name + _SHADOW_SUFFIX
    history = History(decode)
    with database.dedicated(autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(SCHEMA, shadow))
        )  # a rebuild that died half way
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                sql.Identifier(SCHEMA, shadow), sql.Identifier(SCHEMA, p.name)
            )
        )
        events, position = 0, START
        while True:  # the bulk, in committed batches: the live projector keeps going
            with conn.transaction():
                applied, position = _apply_next(
                    conn, p, shadow, position, limit=batch, history=history
                )
            events += applied
            if not applied:
                break
        if before_swap is not None:
            before_swap()
        delays = retry_delays(attempts, base_s=0.2, max_s=5.0)
        for attempt in range(1, attempts + 1):
            try:
                position, applied = _swap_in(
                    conn, p, shadow, position, batch=batch, history=history,
                    lock_timeout_s=lock_timeout_s,
                )  # fmt: skip
            except (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected) as exc:
                if attempt == attempts:
                    raise RebuildLocked(
                        f"rebuild {p.name}: could not lock the live table in {attempts}"
                        f" attempts (lock_timeout {lock_timeout_s:g} s): a long transaction"
                        " reads it; the shadow table is kept, run the rebuild again"
                    ) from exc
                log.warning(
                    "rebuild %s: the live table is busy (attempt %d of %d), trying again",
                    p.name, attempt, attempts,
                    extra={"step": "rebuild", "status": "retry",
                           "error_code": type(exc).__name__},
                )  # fmt: skip
                sleep(delays[attempt - 1])
                continue
            events += applied
            break
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA, p.name))
        ).fetchone()
    rows = int(row[0]) if row else 0
    log.info("rebuilt %s: %d rows from %d events", p.name, rows, events)
    return RebuildReport(p.name, events, rows)


def _swap_in(
    conn: psycopg.Connection[Any],
    p: Projection,
    shadow: str,
    position: Position,
    *,
    batch: int,
    history: History,
    lock_timeout_s: float,
) -> tuple[Position, int]:
    """One try at the swap, in one transaction: the live projector's position (it waits
    until the swap commits), then the live table, then the events since ``position``
    into the shadow, then the swap. The position reached and the events applied."""
    applied_all = 0
    with conn.transaction():
        # SET LOCAL: only this transaction's lock waits give up after this long.
        timeout = f"{lock_timeout_s * 1000:.0f}ms"
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
        _lock_position(conn, p.name)
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(SCHEMA, p.name))
        )
        while True:
            applied, position = _apply_next(conn, p, shadow, position, limit=batch, history=history)
            applied_all += applied
            if not applied:
                break
        _swap(conn, p, shadow)
        _store_position(conn, p.name, position)
    return position, applied_all


def _swap(conn: psycopg.Connection[Any], p: Projection, shadow: str) -> None:
    """Put ``shadow`` in the live table's place, with its index names and grants."""
    live = sql.Identifier(SCHEMA, p.name)
    names = _index_names(conn, p.name)
    grants = _grants(conn, live)
    conn.execute(sql.SQL("DROP TABLE {}").format(live))
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(
            sql.Identifier(SCHEMA, shadow), sql.Identifier(p.name)
        )
    )
    for index, definition in _indexes(conn, p.name):
        wanted = names.get(definition)
        if not wanted:
            raise LookupError(f"rebuild {p.name}: index {index} ({definition}) is not on the table")
        name = wanted.pop(0)
        if name != index:  # renaming a primary key's index renames its constraint too
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    sql.Identifier(SCHEMA, index), sql.Identifier(name)
                )
            )
    for grant in grants:
        conn.execute(grant)


def _indexes(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """(name, definition without its own name and table) of each index of ``table``."""
    rows = conn.execute(
        "SELECT c.relname, i.indisprimary::text || ' ' || i.indisunique::text || ' '"
        " || regexp_replace(pg_get_indexdef(i.indexrelid), '^.*? USING ', '')"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s::regclass ORDER BY c.relname",
        (f"{SCHEMA}.{table}",),
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _index_names(conn: psycopg.Connection[Any], table: str) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for name, definition in _indexes(conn, table):
        names.setdefault(definition, []).append(name)
    return names


def _grants(conn: psycopg.Connection[Any], table: sql.Identifier) -> list[sql.Composed]:
    """GRANT statements giving a new table what ``table`` grants (CREATE TABLE gives none)."""
    rows = conn.execute(
        "SELECT r.rolname, a.privilege_type, a.is_grantable"
        " FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a"
        " LEFT JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE c.oid = %s::regclass AND a.grantee <> c.relowner",
        (table.as_string(conn),),
    ).fetchall()
    return [
        sql.SQL("GRANT {} ON {} TO {}{}").format(
            sql.SQL(privilege),  # one of PostgreSQL's privilege keywords, from the catalog
            table,
            sql.Identifier(role) if role is not None else sql.SQL("PUBLIC"),
            sql.SQL(" WITH GRANT OPTION" if grantable else ""),
        )
        for role, privilege, grantable in rows
    ]


Batch = tuple[list[Any], Position]  # decoded events, and the position after them


def _apply_next(
    conn: psycopg.Connection[Any],
    p: Projection,
    table: str,
    position: Position,
    *,
    limit: int,
    history: History,
    cache: dict[Position, Batch] | None = None,
    topics: Sequence[str] | None = None,
) -> tuple[int, Position]:
    """Apply the batch after ``position`` to ``table``; returns (count, new position).

    ``cache``: the batches this pump already read and decoded, by start position: the
    projections usually stand at one position, and the rows visible after it then are
    a prefix of any later read (a row that commits later sorts after them), so one read
    and one decoding serve them all.

    ``topics``: only rows of these topics are read; the position may then move past
    rows of others with nothing applied (``store.eventlog.read_topics_after``)."""
    batch = cache.get(position) if cache is not None else None
    if batch is None:
        batch = _read_batch(conn, position, limit, history, topics)
        if cache is not None:
            cache[position] = batch
    events, last = batch
    if events:
        p.apply(conn, table, events, history)
    return len(events), last


def _read_batch(
    conn: psycopg.Connection[Any],
    position: Position,
    limit: int,
    history: History,
    topics: Sequence[str] | None,
) -> Batch:
    """The next ``limit`` visible events after ``position`` (of ``topics`` only, when
    given), decoded, and the position after them."""
    if topics is None:
        rows = read_after(conn, position, limit)
        last = rows[-1].position if rows else position
    else:
        rows, last = read_topics_after(conn, position, limit, topics)
    return [history.decode(r.notification()) for r in rows], last


def _read_position(conn: psycopg.Connection[Any], name: str) -> Position:
    """The projection's position, read without locking it (outside a transaction: no
    transaction id taken)."""
    return _position(conn, name, "")


def _lock_position(conn: psycopg.Connection[Any], name: str) -> Position:
    return _position(conn, name, " FOR UPDATE")


def _position(conn: psycopg.Connection[Any], name: str, lock: str) -> Position:
    row = conn.execute(
        sql.SQL(
            "SELECT xid::text, notification_id FROM billing.projection_positions WHERE name = %s{}"
        ).format(sql.SQL(lock)),
        (name,),
    ).fetchone()
    if row is None:
        raise LookupError(f"no position for projection {name!r}: run billing-ledger migrate")
    return Position(str(row[0]), int(row[1]))


def _store_position(conn: psycopg.Connection[Any], name: str, position: Position) -> None:
    conn.execute(
        "UPDATE billing.projection_positions SET xid = %s::xid8, notification_id = %s"
        " WHERE name = %s",
        (position.xid, position.notification_id, name),
    )


def projector_behind(conn: psycopg.Connection[Any]) -> int:
    """Events (visible in commit order) the slowest projection has not applied yet."""
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(max((SELECT count(*) FROM {events} e"
            " WHERE (e.xid, e.notification_id) > (p.xid, p.notification_id)"
            " AND e.xid < pg_snapshot_xmin(pg_current_snapshot()))), 0)"
            " FROM billing.projection_positions p"
        ).format(events=sql.Identifier(EVENTS_TABLE))
    ).fetchone()
    return int(row[0]) if row else 0
