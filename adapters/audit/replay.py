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
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql

from domain.account import CustomerAccount
from domain.audit import (
    Balance,
    TxnAudit,
    balances_of,
    uuid_text,
)
from domain.audit_credits import CreditAudit
from domain.audit_invoices import InvoiceAudit
from domain.audit_lines import LineAudit, PushAudit
from domain.audit_purchases import PurchaseAudit
from domain.chain import GENESIS, ChainBreak, ChainLink, link_hash, link_problem, topic_header
from domain.contract import Contract
from domain.credit_line import CreditLine
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.money import add_exact, subtract_exact
from domain.price_book import PriceBook
from domain.purchase import CreditPurchase
from domain.transaction import BillingTransaction
from store.schema import EVENTS_TABLE

__all__ = [
    "ACCOUNT_TOPICS",
    "HISTORY_COPY",
    "TXN_TOPICS",
    "Overdrawn",
    "Replay",
    "Row",
    "Scope",
    "history_size",
    "read_history",
    "replay",
    "unwrap",
]

TXN_TOPICS = get_topic(BillingTransaction.Metered).removesuffix("Metered")
ACCOUNT_TOPICS = get_topic(CustomerAccount.Opened).removesuffix("Opened")
LINE_TOPICS = get_topic(InvoiceLine.Opened).removesuffix("Opened")
CREDIT_LINE_TOPICS = get_topic(CreditLine.Opened).removesuffix("Opened")
PUSH_TOPICS = get_topic(LinePush.Opened).removesuffix("Opened")
INVOICE_TOPICS = get_topic(Invoice.Opened).removesuffix("Opened")
BOOK_PUBLISHED = get_topic(PriceBook.Published)
CONTRACT_SET = get_topic(Contract.Set)
PURCHASE_TOPICS = get_topic(CreditPurchase.Started).removesuffix("Started")
HISTORY_COPY = sql.SQL(
    "COPY (SELECT uuid_send(originator_id), originator_version, topic, state, prev_hash, hash"
    " FROM {} ORDER BY notification_id) TO STDOUT (FORMAT BINARY)"
).format(sql.Identifier(EVENTS_TABLE))
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


@dataclass(frozen=True)
class Overdrawn:
    """A reservation that took an account past the spend limit in force at that event
    (a forged snapshot, or a rule broken): the account, its version, the figures."""

    account: tuple[str, str]
    version: int
    committed: Decimal
    limit: int


@dataclass
class Replay:
    """What the history says: every transaction, every spend limit, every chain break."""

    events: int = 0
    aggregates: int = 0
    transactions: dict[str, TxnAudit] = field(default_factory=dict)
    limits: dict[tuple[str, str], int | None] = field(default_factory=dict)
    lines: dict[str, LineAudit] = field(default_factory=dict)
    invoices: dict[str, InvoiceAudit] = field(default_factory=dict)
    pushes: dict[str, PushAudit] = field(default_factory=dict)
    breaks: list[ChainBreak] = field(default_factory=list)
    # What each account has committed (reserved + charged), as its own events say, and
    # every reservation that took it past the limit in force at that event.
    committed: dict[tuple[str, str], Decimal] = field(default_factory=dict)
    overdrawn: list[Overdrawn] = field(default_factory=list)
    # Each account's prepaid credits, as its credit events say (domain.audit_credits).
    credits: dict[tuple[str, str], CreditAudit] = field(default_factory=dict)
    # Every version of the price book: (book id, number) -> its [meters] table as stored.
    prices: dict[tuple[str | None, int], Any] = field(default_factory=dict)
    # Every contract version: (contract id, number) -> its Set event's fields as stored.
    contracts: dict[tuple[str, int], Any] = field(default_factory=dict)
    # Every purchase of credit (domain.audit_purchases), by purchase id.
    purchases: dict[str, PurchaseAudit] = field(default_factory=dict)

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
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(EVENTS_TABLE))
    ).fetchone()
    return int(row[0]) if row else 0


class _Aggregate:
    """The replay's cursor on one aggregate: its chain so far and where its events go."""

    __slots__ = (
        "account", "expected", "id", "invoice", "line", "prev", "purchase", "push", "txn",
    )  # fmt: skip

    def __init__(self, id_bytes: bytes) -> None:
        self.id = id_bytes
        self.expected = 1
        self.prev = GENESIS
        self.txn: TxnAudit | None = None
        self.account: tuple[str, str] | None = None
        self.line: LineAudit | None = None
        self.push: PushAudit | None = None
        self.invoice: InvoiceAudit | None = None
        self.purchase: PurchaseAudit | None = None


_SKIP = "skip"
# Always decoded; other kinds only for an aggregate in scope.
_ALWAYS = frozenset(
    {
        "metered", "Opened", "LimitSet", "line:Opened", "push:Opened", "invoice:Opened",
        "book:Published", "contract:Set", "purchase:Started",
    }
)  # fmt: skip
_WRAPPED = {
    "metered": ("quantity", "timestamp", "amount"),
    "ChargeFailed": ("next_attempt_at",),
    "Repriced": ("amount", "old_amount"),
    "line:Opened": ("period_start",),
    "invoice:Opened": ("period_start", "period_end", "first_line"),
    "invoice:LineAdded": ("line_id",),
    "invoice:CreditRequested": ("transaction_id",),
    "invoice:Credited": ("transaction_id",),
    "line:Settled": ("exact_total",),
    "line:Removed": ("exact_total",),
    "line:Repriced": ("exact_total",),
    "line:CreditsApplied": ("exact_total",),
}


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
        close = getattr(rows, "close", None)
        if close is not None:  # a COPY left half read would hang its transaction's end
            close()
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
        if kind in _ALWAYS or (
            kind != _SKIP
            and (
                agg.txn is not None
                or agg.line is not None
                or agg.push is not None
                or agg.invoice is not None
                or agg.account is not None
                or agg.purchase is not None
            )
        ):
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
    if topic.startswith(TXN_TOPICS):
        name = topic[len(TXN_TOPICS) :]
        return "metered" if name == "Metered" else name
    if topic in (ACCOUNT_TOPICS + "Opened", ACCOUNT_TOPICS + "LimitSet"):
        return topic[len(ACCOUNT_TOPICS) :]
    if topic.startswith(ACCOUNT_TOPICS):
        return "account:" + topic[len(ACCOUNT_TOPICS) :]
    if topic.startswith(LINE_TOPICS):
        return "line:" + topic[len(LINE_TOPICS) :]
    if topic.startswith(CREDIT_LINE_TOPICS):  # a credit line is a line of its invoice
        return "line:" + topic[len(CREDIT_LINE_TOPICS) :]
    if topic.startswith(INVOICE_TOPICS):
        return "invoice:" + topic[len(INVOICE_TOPICS) :]
    if topic == BOOK_PUBLISHED:
        return "book:Published"
    if topic == CONTRACT_SET:
        return "contract:Set"
    if topic.startswith(PURCHASE_TOPICS):
        return "purchase:" + topic[len(PURCHASE_TOPICS) :]
    if topic.startswith(PUSH_TOPICS) and not topic.endswith(".ItemPlanned"):
        return "push:" + topic[len(PUSH_TOPICS) :]
    return _SKIP  # planned items: nothing to recompute


def _route(  # noqa: PLR0917 (the replay's hot loop: no keyword packing)
    out: Replay, agg: _Aggregate, kind: str, version: int, state: bytes, scope: Scope
) -> None:
    if kind in _PRICING:  # every version, whatever the scope: transactions name them
        _pricing(out, agg, kind, state)
        return
    data = orjson.loads(state)
    for key in _WRAPPED.get(kind, ()):
        data[key] = unwrap(data[key])
    at = datetime.fromisoformat(unwrap(data["timestamp"])) if scope.partial else None
    if scope.as_of is not None and at is not None and at > scope.as_of:
        return
    if kind.startswith(("line:", "push:", "invoice:", "purchase:")):
        # Lines sum whole periods and purchases are compared with Stripe's invoices as
        # they are now: both are audited with the whole history only.
        if not scope.partial:
            _route_line(out, agg, kind, version, data, scope)
    elif kind == "metered":
        if scope.includes(data["customer_id"], at):
            agg.txn = TxnAudit.metered(_uuid_text(agg.id), data, out.prices, out.contracts)
            out.transactions[agg.txn.transaction_id] = agg.txn
    elif kind == "Opened":
        if scope.customer in (None, data["customer_id"]):
            agg.account = (data["customer_id"], data["currency"])
            out.limits[agg.account] = data["spend_limit"]
    elif kind == "LimitSet" or kind.startswith("account:"):
        if agg.account is not None:
            _account_event(out, agg.account, kind.removeprefix("account:"), version, data)
    elif agg.txn is not None:
        _txn_event(out, agg.txn, kind, data, version)


def _txn_event(out: Replay, txn: TxnAudit, kind: str, data: dict[str, Any], version: int) -> None:
    txn.apply(kind, data, version)
    if kind == "Repriced" and txn.priced_by not in out.prices:
        txn.before_its_version = True  # priced again by a version not published yet


_PRICING = frozenset({"book:Published", "contract:Set"})


def _pricing(out: Replay, agg: _Aggregate, kind: str, state: bytes) -> None:
    """A price book version or a contract version, kept whole: transactions name them."""
    # The library's parser, not orjson's: a price's per may be beyond 64 bits, which
    # orjson reads as a float (a version is one event: the speed does not matter).
    found = json.loads(state)
    if kind == "book:Published":
        out.prices[_uuid_text(agg.id), found["number"]] = found["meters"]
    else:
        out.contracts[_uuid_text(agg.id), found["number"]] = found


# The account's credit events, and their fields stored as registered types.
_CREDIT_EVENTS: dict[str, tuple[str, ...]] = {
    "CreditGranted": ("effective_at", "expires_at"),
    "CreditVoided": ("amount",),
    "CreditExpired": ("amount",),
    "CreditsConsumed": ("at",),
    "CreditPolicySet": (),
    "CreditAwaitingPayment": (),
    "CreditActivated": (),
}

# How each account event moves what counts against the limit (reserved + charged).
_COMMITS = {"AmountsReserved": 1, "ReservationReleased": -1, "ChargeReversed": -1}


def _account_event(
    out: Replay, account: tuple[str, str], name: str, version: int, data: dict[str, Any]
) -> None:
    if name == "LimitSet":
        out.limits[account] = data["spend_limit"]
        return
    if name == "AmountsRepriced":  # never refused by the limit (domain.account): no check
        committed = out.committed.get(account, Decimal(0))
        for old, new in zip(data["old_amounts"], data["amounts"], strict=True):
            committed = add_exact(subtract_exact(committed, Decimal(old)), Decimal(new))
        out.committed[account] = committed
        return
    if name == "TopUpStarted":  # its purchase's row starts here (billing.credit_purchases)
        out.purchases.setdefault(data["purchase_id"], PurchaseAudit.top_up_requested(data))
        return
    if name == "AmountsReserved" and data.get("burnt_from") is not None:
        data["burnt_at"] = unwrap(data["burnt_at"])  # burnt from a grant: consumed it too
        _credit_audit(out, account).apply(name, data, version)
    elif name in _CREDIT_EVENTS:
        for key in _CREDIT_EVENTS[name]:
            data[key] = unwrap(data[key])
        _credit_audit(out, account).apply(name, data, version)
        return
    sign = _COMMITS.get(name)
    if sign is None:  # settled: moves reserved to charged, the sum is the same
        return
    amounts = data["amounts"] if name == "AmountsReserved" else [unwrap(data["amount"])]
    committed = out.committed.get(account, Decimal(0))
    for amount in amounts:
        value = Decimal(amount)  # ``sign * value`` would round past 28 digits
        committed = add_exact(committed, value) if sign > 0 else subtract_exact(committed, value)
    out.committed[account] = committed
    limit = out.limits.get(account)
    if sign > 0 and limit is not None and committed > limit:
        out.overdrawn.append(Overdrawn(account, version, committed, limit))


def _credit_audit(out: Replay, account: tuple[str, str]) -> CreditAudit:
    credits = out.credits.get(account)
    if credits is None:
        credits = out.credits[account] = CreditAudit(*account)
    return credits


def _route_line(  # noqa: PLR0917 (the replay's hot loop: no keyword packing)
    out: Replay, agg: _Aggregate, kind: str, version: int, data: dict[str, Any], scope: Scope
) -> None:
    if kind.startswith("purchase:"):
        _purchase_event(out, agg, kind[9:], data, scope)
    elif kind == "line:Opened":
        if scope.customer in (None, data["customer_id"]):
            agg.line = LineAudit.opened(_uuid_text(agg.id), data)
            out.lines[agg.line.line_id] = agg.line
    elif kind == "push:Opened":
        line = uuid_text(data["line_id"])
        if line in out.lines:
            assert line is not None
            agg.push = PushAudit(_uuid_text(agg.id), line, out.lines[line].currency)
            out.pushes[agg.push.push_id] = agg.push
    elif kind == "invoice:Opened":
        if scope.customer in (None, data["customer_id"]):
            agg.invoice = InvoiceAudit.opened(_uuid_text(agg.id), data)
            out.invoices[agg.invoice.invoice_id] = agg.invoice
    elif agg.invoice is not None:
        agg.invoice.apply(kind[8:], data, version)
    elif agg.line is not None:
        agg.line.apply(kind[5:], data, version)
    elif agg.push is not None:
        agg.push.apply(kind[5:], data, version)


def _purchase_event(
    out: Replay, agg: _Aggregate, name: str, data: dict[str, Any], scope: Scope
) -> None:
    if name == "Started":
        if scope.customer in (None, data["customer_id"]):
            agg.purchase = PurchaseAudit.started(_uuid_text(agg.id), data)
            out.purchases[agg.purchase.purchase_id] = agg.purchase
    elif agg.purchase is not None:
        agg.purchase.apply(name, data)


def _uuid_text(id_bytes: bytes) -> str:
    """``str(UUID(bytes=id_bytes))``, several times faster."""
    h = id_bytes.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def unwrap(value: Any) -> Any:
    """A registered type (datetime, Decimal, UUID) as the string it is stored as."""
    return value["_data_"] if type(value) is dict else value
