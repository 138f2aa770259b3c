"""Replays of the event history for auditors: ``audit``, ``balances --as-of``, ``export``.

The history is read in one binary ``COPY`` in log order (``notification_id``: the
table's own order, so the server reads it sequentially), inside one repeatable-read
transaction (the projections are read in the same snapshot).
Each row's hash chain is checked (``domain.chain``) and its stored JSON decoded with
orjson straight into the audit's fold (``domain.audit``): no aggregate is rebuilt.
The results are compared with the live read models and, with ``--stripe``, with
the invoice items in Stripe. Nothing here decides what is legal; the domain does.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from adapters.progress import Progress
from adapters.stripe_client import StripeCharges, StripeSettings
from domain.audit import (
    Balance,
    Finding,
    InvoiceItem,
    TxnAudit,
    balances_of,
    check_balances,
    check_stripe,
    check_transactions,
)
from domain.chain import GENESIS, ChainBreak, ChainLink, link_hash, link_problem, topic_header
from projections.transactions import COLUMNS as TXN_COLUMNS

__all__ = [
    "HISTORY_COPY",
    "AuditReport",
    "Replay",
    "Scope",
    "audit",
    "balances_as_of",
    "export_events",
    "read_history",
    "render",
    "replay",
    "stripe_invoice_items",
]

EVENTS = "billingledger_events"
_TXN = "domain.transaction:BillingTransaction."
_ACCOUNT = "domain.account:CustomerAccount."
HISTORY_COPY = sql.SQL(
    "COPY (SELECT uuid_send(originator_id), originator_version, topic, state, prev_hash, hash"
    " FROM {} ORDER BY notification_id) TO STDOUT (FORMAT BINARY)"
).format(sql.Identifier(EVENTS))
HISTORY_TYPES = ["bytea", "int8", "text", "bytea", "bytea", "bytea"]  # ids as 16 bytes: faster
_PROGRESS_EVERY = 50_000

Row = tuple[bytes, int, str, bytes, bytes | None, bytes | None]
"""One stored event as the replay reads it: the aggregate id's 16 bytes, version, topic,
state, prev_hash, hash."""


@dataclass(frozen=True)
class Scope:
    """What part of the history to replay: one customer, Metered times, an instant."""

    customer: str | None = None
    start: datetime | None = None  # transactions metered at or after
    end: datetime | None = None  # transactions metered before
    as_of: datetime | None = None  # only events up to this instant

    @property
    def partial(self) -> bool:
        """Only part of the transactions: balances and foreign items cannot be compared."""
        return self.start is not None or self.end is not None or self.as_of is not None

    def includes(self, customer: str, metered_at: datetime | None) -> bool:
        if self.customer is not None and customer != self.customer:
            return False
        if metered_at is None:
            return True
        return (self.start is None or metered_at >= self.start) and (
            self.end is None or metered_at < self.end
        )


@dataclass
class Replay:
    """What the history says: every transaction, every spend limit, every chain break."""

    events: int = 0
    aggregates: int = 0
    transactions: dict[str, TxnAudit] = field(default_factory=dict)
    limits: dict[tuple[str, str], int | None] = field(default_factory=dict)
    breaks: list[ChainBreak] = field(default_factory=list)

    def balances(self) -> dict[tuple[str, str], Balance]:
        return balances_of(self.transactions.values(), self.limits)


def read_history(conn: psycopg.Connection[Any]) -> Iterator[Row]:
    """Every stored event in log order, as one binary COPY.

    An aggregate's events are in version order within it: a version is appended only
    after the one before it committed, so it has the higher notification id.
    """
    with conn.cursor() as cur, cur.copy(HISTORY_COPY) as copy:
        copy.set_types(HISTORY_TYPES)
        yield from copy.rows()


def history_size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(EVENTS))).fetchone()
    return int(row[0]) if row else 0


class _Aggregate:
    """The replay's cursor on one aggregate: its chain so far and where its events go."""

    __slots__ = ("account", "expected", "id", "prev", "txn")

    def __init__(self, id_bytes: bytes) -> None:
        self.id = id_bytes
        self.expected = 1
        self.prev = GENESIS
        self.txn: TxnAudit | None = None
        self.account: tuple[str, str] | None = None


_SKIP = "skip"
_ALWAYS = frozenset({"metered", "Opened", "LimitSet"})  # else only for a transaction in scope
_NO_DATA: dict[str, Any] = {}
_WRAPPED = {"metered": ("quantity", "timestamp"), "ChargeFailed": ("next_attempt_at",)}


def replay(
    rows: Iterable[Row], scope: Scope = Scope(), tick: Callable[[int], None] | None = None
) -> Replay:
    """``_replay`` with the cyclic garbage collector paused: it would walk the millions of
    objects a replay keeps, again and again, and none of them form cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay(rows, scope, tick)
    finally:
        if enabled:
            gc.enable()


def _replay(rows: Iterable[Row], scope: Scope, tick: Callable[[int], None] | None) -> Replay:
    """Fold the history (rows in log order) into transactions and limits.

    The hot loop of an audit: ids stay bytes, each topic is classified and its hash
    header built once, and a Reserved event (nothing in it is checked) is not decoded
    unless its time matters. Each aggregate's chain is followed in a dict by id.
    """
    out = Replay()
    aggregates: dict[bytes, _Aggregate] = {}
    topics: dict[str, tuple[str, bytes]] = {}
    events = 0
    for row in rows:
        id_bytes, version, topic, state, prev_hash, digest = row
        events += 1
        agg = aggregates.get(id_bytes)
        if agg is None:
            agg = aggregates[id_bytes] = _Aggregate(id_bytes)
        known = topics.get(topic)
        if known is None:
            known = topics[topic] = (_kind(topic), topic_header(topic))
        kind, header = known
        if (
            version != agg.expected
            or prev_hash != agg.prev
            or digest != link_hash(agg.prev, id_bytes, version, header, state)
        ):
            _chain_break(out, agg, row)
        agg.expected, agg.prev = version + 1, digest or GENESIS
        if kind == "Reserved" and not scope.partial:
            if agg.txn is not None:
                agg.txn.apply(kind, _NO_DATA, version)
        elif kind in _ALWAYS or (kind != _SKIP and agg.txn is not None):
            _route(out, agg, kind, version, state, scope)
        if tick is not None and events % _PROGRESS_EVERY == 0:
            tick(events)
    out.events, out.aggregates = events, len(aggregates)
    return out


def _chain_break(out: Replay, agg: _Aggregate, row: Row) -> None:
    id_bytes, version, topic, state, prev_hash, digest = row
    link = ChainLink(UUID(bytes=id_bytes), version, topic, state, prev_hash, digest)
    problem = link_problem(link, agg.expected, agg.prev)
    if problem is not None:
        out.breaks.append(ChainBreak(link.originator_id, version, problem))


def _kind(topic: str) -> str:
    if topic.startswith(_TXN):
        name = topic[len(_TXN) :]
        return "metered" if name == "Metered" else name
    if topic in (_ACCOUNT + "Opened", _ACCOUNT + "LimitSet"):
        return topic[len(_ACCOUNT) :]
    return _SKIP  # an account's reservations: not needed to recompute anything


def _route(  # noqa: PLR0917 (the replay's hot loop: no keyword packing)
    out: Replay, agg: _Aggregate, kind: str, version: int, state: bytes, scope: Scope
) -> None:
    data = orjson.loads(state)
    for key in _WRAPPED.get(kind, ()):
        data[key] = _unwrap(data[key])
    at = datetime.fromisoformat(_unwrap(data["timestamp"])) if scope.partial else None
    if scope.as_of is not None and at is not None and at > scope.as_of:
        return
    if kind == "metered":
        if scope.includes(data["customer_id"], at):
            agg.txn = TxnAudit.metered(_uuid_text(agg.id), data)
            out.transactions[agg.txn.transaction_id] = agg.txn
    elif kind == "Opened":
        if scope.customer in (None, data["customer_id"]):
            agg.account = (data["customer_id"], data["currency"])
            out.limits[agg.account] = data["spend_limit"]
    elif kind == "LimitSet":
        if agg.account is not None:
            out.limits[agg.account] = data["spend_limit"]
    elif agg.txn is not None:
        agg.txn.apply(kind, data, version)


def _uuid_text(id_bytes: bytes) -> str:
    """``str(UUID(bytes=id_bytes))``, several times faster."""
    h = id_bytes.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _unwrap(value: Any) -> Any:
    """A registered type (datetime, Decimal, UUID) as the string it is stored as."""
    return value["_data_"] if type(value) is dict else value


# -- the audit -----------------------------------------------------------------------


@dataclass
class AuditReport:
    """What an audit replayed and every finding; ``ok`` when there are none."""

    scope: dict[str, Any]
    events: int
    aggregates: int
    transactions: int
    balances: int
    stripe_items: int | None
    seconds: float
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def audit(
    database_url: str,
    scope: Scope,
    *,
    horizon: timedelta,
    stripe_items: Callable[[], list[InvoiceItem]] | None = None,
    progress: bool = True,
) -> AuditReport:
    """Replay, check every invariant, compare with the read models (and Stripe)."""
    started = time.perf_counter()
    with psycopg.connect(database_url) as conn:
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            result = _replay_with_progress(conn, scope, progress)
            balances = result.balances()
            findings = _history_findings(result, balances, horizon)
            findings += projection_lag(conn)
            findings += compare_transactions(conn, result.transactions, scope)
            if not scope.partial:
                findings += compare_balances(conn, balances, scope.customer)
            findings += dead_letters_without_reason(conn)
    items = stripe_items() if stripe_items is not None else None
    if items is not None:
        foreign = not scope.partial
        findings += check_stripe(items, result.transactions, foreign_items=foreign)
    return AuditReport(
        scope={
            k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(scope).items()
        },
        events=result.events,
        aggregates=result.aggregates,
        transactions=len(result.transactions),
        balances=len(balances),
        stripe_items=None if items is None else len(items),
        seconds=round(time.perf_counter() - started, 3),
        findings=findings,
    )


def _replay_with_progress(conn: psycopg.Connection[Any], scope: Scope, progress: bool) -> Replay:
    if not progress:
        return replay(read_history(conn), scope)
    bar = Progress(history_size(conn), "replayed events")
    result = replay(read_history(conn), scope, tick=bar.update)
    bar.update(result.events)
    bar.done()
    return result


def _history_findings(
    result: Replay, balances: dict[tuple[str, str], Balance], horizon: timedelta
) -> list[Finding]:
    findings = [
        Finding("chain", f"{b.originator_id} v{b.version}", b.problem) for b in result.breaks
    ]
    findings += check_transactions(
        result.transactions.values(), now=datetime.now(UTC), horizon=horizon
    )
    return findings + check_balances(balances)


# What a TxnAudit knows; the other columns are the times of the later steps.
_TXN_COMPARED = tuple(
    c
    for c in TXN_COLUMNS
    if c not in {"transaction_id", "occurred_at", "reserved_at", "charged_at", "compensated_at",
                 "updated_at"}
)  # fmt: skip


def compare_transactions(
    conn: psycopg.Connection[Any], txns: dict[str, TxnAudit], scope: Scope
) -> list[Finding]:
    """Every difference between the replayed transactions and ``billing.transactions``."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for row in _projected_transactions(conn, scope):
        txn_id = str(row["transaction_id"])
        seen.add(txn_id)
        txn = txns.get(txn_id)
        if txn is None:
            findings.append(
                Finding("projection", txn_id, "in billing.transactions, not in history")
            )
            continue
        for column in _TXN_COMPARED:
            want, got = _expected(txn, column), row[column]
            if want != got:
                findings.append(
                    Finding(
                        "projection",
                        txn_id,
                        f"transactions.{column}: {got!r}, history says {want!r}",
                    )
                )
    for txn_id in txns.keys() - seen:
        findings.append(
            Finding("projection", txn_id, "in history, missing from billing.transactions")
        )
    return findings


def _expected(txn: TxnAudit, column: str) -> Any:
    value = getattr(txn, column)
    if column == "quantity":
        return Decimal(value)
    if column in ("next_attempt_at", "metered_at") and value is not None:
        return datetime.fromisoformat(value)
    return str(value) if column == "state" else value


def _projected_transactions(conn: psycopg.Connection[Any], scope: Scope) -> list[dict[str, Any]]:
    where: list[sql.Composable] = []
    params: list[Any] = []
    for clause, value in (
        ("customer_id = %s", scope.customer),
        ("metered_at >= %s", scope.start),
        ("metered_at < %s", scope.end),
        ("metered_at <= %s", scope.as_of),
    ):
        if value is not None:
            where.append(sql.SQL(clause))
            params.append(value)
    query = sql.SQL("SELECT transaction_id, {} FROM billing.transactions{}").format(
        sql.SQL(", ").join(map(sql.Identifier, _TXN_COMPARED)),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


_BALANCE_COMPARED = (
    "metered",
    "charged",
    "compensated",
    "in_flight",
    "transactions",
    "refused",
    "spend_limit",
    "available",
)


def compare_balances(
    conn: psycopg.Connection[Any], balances: dict[tuple[str, str], Balance], customer: str | None
) -> list[Finding]:
    """Every difference between the replayed balances and ``billing.customer_balances``."""
    findings: list[Finding] = []
    query = sql.SQL("SELECT customer_id, currency, {} FROM billing.customer_balances{}").format(
        sql.SQL(", ").join(map(sql.Identifier, _BALANCE_COMPARED)),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, [customer] if customer else []).fetchall()
    live = {(r["customer_id"], r["currency"]): r for r in rows}
    for key in sorted(live.keys() | balances.keys()):
        subject = "/".join(key)
        row, bal = live.get(key), balances.get(key)
        if row is None or bal is None:
            where = "billing.customer_balances" if row is None else "history"
            findings.append(Finding("projection", subject, f"balance missing from {where}"))
            continue
        for column in _BALANCE_COMPARED:
            if row[column] != getattr(bal, column):
                findings.append(
                    Finding(
                        "projection",
                        subject,
                        f"customer_balances.{column}: {row[column]!r},"
                        f" history says {getattr(bal, column)!r}",
                    )
                )
    return findings


def projection_lag(conn: psycopg.Connection[Any]) -> list[Finding]:
    """Read models that have not applied every event yet (their differences may be lag)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT p.name, (SELECT count(*) FROM {} e"
            " WHERE (e.xid, e.notification_id) > (p.xid, p.notification_id))"
            " FROM billing.projection_positions p ORDER BY p.name"
        ).format(sql.Identifier(EVENTS))
    ).fetchall()
    return [
        Finding(
            "projection_lag",
            name,
            f"{behind} event(s) not applied yet: run the project role, then audit again",
        )
        for name, behind in rows
        if behind
    ]


def dead_letters_without_reason(conn: psycopg.Connection[Any]) -> list[Finding]:
    """Every dead letter must say why (I6); the table's CHECK forbids only ''."""
    rows = conn.execute(
        "SELECT source_topic, source_partition, source_offset FROM billing.dead_letters"
        " WHERE reason IS NULL OR btrim(reason) = ''"
    ).fetchall()
    return [
        Finding("dead_letter", f"{t}/{p}@{o}", "dead letter without a reason") for t, p, o in rows
    ]


def stripe_invoice_items(
    settings: StripeSettings, customer: str | None = None
) -> list[InvoiceItem]:
    """Every live invoice item in Stripe (of one customer's Stripe customer, if given),
    listed through the project's one Stripe client (its rate limit and breaker)."""
    client = StripeCharges(settings)
    stripe_customer = None
    if customer is not None:
        stripe_customer = client.find_customer(customer)
        if stripe_customer is None:
            return []
    return [
        InvoiceItem(
            str(item["id"]),
            (item.get("metadata") or {}).get("txn_id"),
            int(item["amount"]),
            str(item["currency"]),
        )
        for item in client.invoice_items(stripe_customer)
    ]


def render(report: AuditReport) -> str:
    """The report as a person reads it: what was replayed, then one line per finding."""
    scope = ", ".join(f"{k}={v}" for k, v in report.scope.items() if v is not None) or "everything"
    lines = [
        f"audit of {scope}: {report.events:,} events, {report.aggregates:,} aggregates,"
        f" {report.transactions:,} transactions, {report.balances:,} balances"
        + (f", {report.stripe_items:,} Stripe items" if report.stripe_items is not None else "")
        + f" in {report.seconds:.1f} s",
    ]
    if report.ok:
        return "\n".join([*lines, "OK: every check holds"])
    rows = [(f.kind, f.subject, f.detail) for f in report.findings]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("kind", "subject"))]
    lines.append(f"FAILED: {len(rows)} finding(s)")
    lines.append(f"{'kind'.ljust(widths[0])}  {'subject'.ljust(widths[1])}  detail")
    lines += [f"{k.ljust(widths[0])}  {s.ljust(widths[1])}  {d}" for k, s, d in rows]
    return "\n".join(lines)


# -- point in time and export ---------------------------------------------------------


def balances_as_of(
    database_url: str, as_of: datetime, customer: str | None = None
) -> dict[str, Any]:
    """Balances and transaction states at ``as_of``, from the history alone."""
    scope = Scope(customer=customer, as_of=as_of)
    with psycopg.connect(database_url) as conn:
        result = replay(read_history(conn), scope)
    balances = [
        {
            "customer_id": customer_id,
            "currency": currency,
            **{c: getattr(bal, c) for c in _BALANCE_COMPARED},
        }
        for (customer_id, currency), bal in sorted(result.balances().items())
    ]
    txns = [
        {
            "transaction_id": t.transaction_id,
            "customer_id": t.customer_id,
            "usage_id": t.usage_id,
            "amount": t.amount,
            "currency": t.currency,
            "state": str(t.state),
            "attempts": t.attempts,
        }
        for t in sorted(result.transactions.values(), key=lambda t: (t.customer_id, t.metered_at))
    ]
    return {"as_of": as_of.isoformat(), "balances": balances, "transactions": txns}


_EXPORT = sql.SQL(
    "SELECT notification_id, originator_id, originator_version, topic, state, prev_hash, hash"
    " FROM {0} WHERE originator_id IN (SELECT originator_id FROM {0}"
    " WHERE originator_version = 1 AND topic = ANY(%s)"
    " AND convert_from(state, 'UTF8')::jsonb ->> 'customer_id' = %s)"
    " ORDER BY notification_id"
).format(sql.Identifier(EVENTS))


def export_events(
    database_url: str, customer: str, start: datetime | None = None, end: datetime | None = None
) -> Iterator[dict[str, Any]]:
    """The customer's events (transactions and accounts) in log order, each with its
    position (notification id) and hashes; ``start``/``end`` bound the event times."""
    firsts = [_TXN + "Metered", _ACCOUNT + "Opened"]
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(_EXPORT, (firsts, customer))
        for position, originator_id, version, topic, state, prev_hash, digest in cur:
            data = orjson.loads(state)
            at = datetime.fromisoformat(_unwrap(data["timestamp"]))
            if (start is not None and at < start) or (end is not None and at >= end):
                continue
            yield {
                "position": position,
                "aggregate_id": str(originator_id),
                "version": version,
                "event": topic.rpartition(":")[2],
                "timestamp": at.isoformat(),
                "data": {k: v for k, v in data.items() if k != "timestamp"},
                "prev_hash": prev_hash.hex() if prev_hash is not None else None,
                "hash": digest.hex() if digest is not None else None,
            }
