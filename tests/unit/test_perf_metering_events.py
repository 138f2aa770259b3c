"""``meter_batch_events`` records exactly the events ``meter_batch``'s aggregates record.

The ingest's fast path builds a new transaction's events (Metered, then Reserved or
Compensated) without building the ``BillingTransaction`` aggregate. These tests hold
it to the reference: same transactions in the same order, same event classes, same
field values (all but the wall-clock ``timestamp``), same accounts, same outcomes.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from eventsourcing.domain import DomainEventProtocol

from domain.account import CustomerAccount
from domain.credit_line import CreditLine
from domain.ids import transaction_id
from domain.metering import Metering, meter_batch
from domain.metering_events import meter_batch_events
from domain.periods import PeriodPolicy
from domain.price_book import PriceBook
from domain.pricing import Price, PriceList, Tier
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.01"), "USD"),
        "gpt.tokens": Price(Decimal("2.50"), "USD", per=1_000_000),
        "eu.gpu.seconds": Price(Decimal("0.01"), "EUR"),
    }
)
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
TICK = timedelta(microseconds=1)
# No line exists yet: each batch opens the lines it needs (monthly periods).
LINES: dict[str, Any] = {
    "load_line": lambda line_id: None,
    "load_invoice": lambda invoice_id: None,
    "periods": PeriodPolicy(),
    "now": datetime(2026, 12, 15, tzinfo=UTC),
}


def _usage(
    usage_id: str,
    quantity: int | str = 1,
    *,
    customer_id: str = "acme",
    meter: str = "api.requests",
    currency: str | None = None,
    offset: int = 0,
) -> Metering:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id=customer_id,
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=AT,
        currency=currency,
    )
    return Metering(record=record, source=Source("usage", 1, offset))


def _loaded(
    customer_id: str, currency: str, *, limit: int | None, reserved: int
) -> CustomerAccount:
    account = CustomerAccount.open(customer_id, currency, limit)
    if reserved:
        account.reserve_all([(transaction_id(customer_id, "earlier"), reserved)])
    account.collect_events()  # as if loaded from the store
    return account


def _fields(event: DomainEventProtocol[Any]) -> tuple[type, dict[str, Any]]:
    return type(event), {k: v for k, v in vars(event).items() if k != "timestamp"}


def _both(
    batch: list[Metering],
    accounts: list[CustomerAccount],
    recorded: set[Any],
    prices: PriceList = PRICES,
) -> Any:
    """Run both forms, each on its own copy of the stored accounts."""

    def loader() -> Any:
        by_key = {(a.customer_id, a.currency): a for a in copy.deepcopy(accounts)}
        return lambda customer_id, currency: by_key.get((customer_id, currency))

    reference = meter_batch(
        batch, prices, load_account=loader(), **LINES, already_recorded=recorded
    )
    fast = meter_batch_events(
        batch, prices, load_account=loader(), **LINES, already_recorded=recorded
    )
    return reference, fast


MIXED = [
    _usage("a-1", 60, offset=1),
    _usage("a-2", 50, offset=2),  # refused: past acme's limit
    _usage("a-1", 60, offset=3),  # duplicate within the batch
    _usage("a-3", 30, offset=4, currency="usd"),
    _usage("t-1", "1999", meter="gpt.tokens", offset=5),  # 0.49975 cents: past the limit
    _usage("t-2", "2000", meter="gpt.tokens", offset=6),  # 0.5 cents: past the limit
    _usage("e-1", 4, meter="eu.gpu.seconds", offset=7),  # acme's EUR account: new
    _usage("g-1", 7, customer_id="globex", offset=8),  # globex: no limit
    _usage("x-1", 3, meter="nope", offset=9),  # rejected: unknown meter
    _usage("x-2", 3, currency="EUR", offset=10),  # rejected: currency mismatch
    _usage("old", 5, offset=11),  # already recorded
    _usage("z-1", 0, offset=12),  # zero amount: reserved even with no headroom
]
ACCOUNTS = [_loaded("acme", "USD", limit=100, reserved=10)]
RECORDED = {transaction_id("acme", "old")}


def test_both_forms_create_the_same_transactions_with_the_same_events() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED)
    assert [t.id for t in fast.transactions] == [t.id for t in reference.transactions]
    for txn, new in zip(reference.transactions, fast.transactions, strict=True):
        assert [_fields(e) for e in (new.metered, new.then)] == [
            _fields(e) for e in txn.pending_events
        ]
        assert (new.amount, new.compensation_reason) == (txn.amount, txn.compensation_reason)
    assert [_fields(e) for e in fast.transaction_events] == [
        _fields(e) for t in reference.transactions for e in t.pending_events
    ]


def test_both_forms_settle_the_same_transactions_into_the_same_lines() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED)
    assert [ln.id for ln in fast.lines] == [ln.id for ln in reference.lines]
    for ours, theirs in zip(fast.lines, reference.lines, strict=True):
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
    settled = {t for ln in fast.lines for t in ln.pending_events[-1].transaction_ids}
    reserved = {str(t.id) for t in fast.transactions if t.compensation_reason is None}
    assert settled == reserved  # every reserved transaction is in exactly one line


def test_both_forms_change_the_same_accounts_in_the_same_way() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED)
    assert [a.id for a in fast.accounts] == [a.id for a in reference.accounts]
    for ours, theirs in zip(fast.accounts, reference.accounts, strict=True):
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
        assert (ours.version, ours.reserved, ours.spend_limit) == (
            theirs.version,
            theirs.reserved,
            theirs.spend_limit,
        )


def test_both_forms_find_the_same_duplicates_rejections_and_refusals() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED)
    assert fast.duplicates == reference.duplicates
    assert fast.rejected == reference.rejected
    assert [t.id for t in fast.refused] == [t.id for t in reference.refused]
    # 100 reached at a-3: every later amount above 0 is refused, however small.
    assert [t.usage_id for t in reference.refused] == ["a-2", "t-1", "t-2"]


def test_the_fast_events_rebuild_the_aggregate_the_reference_builds() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED)
    for txn, new in zip(reference.transactions, fast.transactions, strict=True):
        rebuilt = new.metered.mutate(None)
        rebuilt = new.then.mutate(rebuilt)
        assert isinstance(rebuilt, BillingTransaction)
        ours = {k: v for k, v in vars(rebuilt).items() if k not in {"_created_on", "_modified_on"}}
        theirs = {k: v for k, v in vars(txn).items() if k not in {"_created_on", "_modified_on"}}
        ours.pop("_pending_events"), theirs.pop("_pending_events")
        assert ours == theirs
        assert rebuilt.state in (TxnState.RESERVED, TxnState.COMPENSATED)


def test_a_batch_of_only_recorded_records_yields_no_events_and_loads_no_account() -> None:
    loads: list[tuple[str, str]] = []
    batch = [_usage("r-1"), _usage("r-2")]

    def load(customer_id: str, currency: str) -> CustomerAccount | None:
        loads.append((customer_id, currency))
        return None

    fast = meter_batch_events(
        batch,
        PRICES,
        load_account=load,
        **LINES,
        already_recorded={m.transaction_id for m in batch},
    )
    assert (fast.transactions, fast.accounts, fast.transaction_events) == ([], [], [])
    assert fast.duplicates == batch
    assert loads == []


def test_both_forms_price_each_record_by_the_version_in_force_when_it_occurred() -> None:
    book = PriceBook.start(PRICES)
    book.publish(PriceList({**PRICES.prices, "api.requests": Price(Decimal("0.02"), "USD")}), AT)
    early = _usage("p-1", 10, offset=1)
    early = Metering(early.record.model_copy(update={"occurred_at": AT - TICK}), early.source)
    batch = [early, _usage("p-2", 10, offset=2)]
    loader: Any = lambda customer_id, currency: None  # noqa: E731
    reference = meter_batch(batch, book.schedule, load_account=loader, **LINES)
    fast = meter_batch_events(batch, book.schedule, load_account=loader, **LINES)
    assert [(t.price_version, t.amount) for t in reference.transactions] == [
        (1, Decimal("10.00")),
        (2, Decimal("20.00")),
    ]
    assert [(t.fields["price_version"], t.amount) for t in fast.transactions] == [
        (1, Decimal("10.00")),
        (2, Decimal("20.00")),
    ]
    assert [_fields(e) for e in fast.transaction_events] == [
        _fields(e) for t in reference.transactions for e in t.pending_events
    ]
    (line,) = fast.lines
    assert line.exact_total == Decimal("30.00")  # one line: the same meter and period


def _alerted(
    customer_id: str, currency: str, limit: int | None, reserved: int, *thresholds: str
) -> CustomerAccount:
    account = CustomerAccount.open(customer_id, currency, limit)
    account.set_alerts(list(thresholds))
    if reserved:
        account.reserve_all([(transaction_id(customer_id, "earlier"), reserved)])
    account.collect_events()
    return account


def _with_grants(customer_id: str, *, policy: str, grants: list[tuple[str, int, int]]) -> Any:
    account = CustomerAccount.open(customer_id, "USD")
    for grant_id, amount, priority in grants:
        account.grant_credit(
            grant_id, amount, priority=priority, effective_at=AT - timedelta(days=1),
            source="manual", reason="test",
        )  # fmt: skip
    account.set_credit_policy(policy)
    account.collect_events()
    return account


def test_both_forms_record_the_same_alert_crossings() -> None:
    accounts = [
        _alerted("acme", "USD", 100, 10, "percent_of_limit:50", "percent_of_limit:100", "spend:60"),
        _alerted("globex", "USD", None, 0, "spend:5"),
    ]
    reference, fast = _both(MIXED, accounts, RECORDED)
    crossed = [
        e for a in fast.accounts for e in a.pending_events
        if isinstance(e, CustomerAccount.AlertCrossed)
    ]  # fmt: skip
    # a-1 (10 + 60) reaches 50% and the period's 60; a-2 is refused at 120: 100%.
    assert [(e.customer_id, e.threshold, e.usage_id) for e in crossed] == [
        ("acme", "percent_of_limit:50", "a-1"),
        ("acme", "spend:60", "a-1"),
        ("acme", "percent_of_limit:100", "a-2"),
        ("globex", "spend:5", "g-1"),
    ]
    for ours, theirs in zip(fast.accounts, reference.accounts, strict=True):
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]


def test_both_forms_record_no_crossing_again_on_redelivery() -> None:
    accounts = [_alerted("acme", "USD", 100, 10, "percent_of_limit:50")]
    _, first = _both(MIXED, accounts, RECORDED)
    saved = next(a for a in first.accounts if a.id == accounts[0].id)
    assert [type(e) for e in saved.collect_events()].count(CustomerAccount.AlertCrossed) == 1
    recorded = RECORDED | {t.id for t in first.transactions}
    # Every record again, and a new one that asks for more: 50% was crossed already.
    redelivered = [*MIXED, _usage("a-9", 1, offset=13)]
    reference, fast = _both(redelivered, [saved], recorded)
    assert [t.fields["usage_id"] for t in fast.transactions] == ["a-9"]
    for decision in (reference, fast):
        events = [e for a in decision.accounts for e in a.pending_events]
        assert not [e for e in events if isinstance(e, CustomerAccount.AlertCrossed)]


TIERED = PriceList(
    {
        **PRICES.prices,
        "api.requests": Price(
            Decimal("0.02"), "USD", model="volume",
            tiers=(Tier(50, Decimal("0.02")), Tier(None, Decimal("0.01"))),
        ),
        "gpt.tokens": Price(
            Decimal("2.50"), "USD", 1_000_000, "graduated",
            (Tier(1000, Decimal("2.50")), Tier(None, Decimal("1"))), flat_fee=Decimal("0.001"),
        ),
    }
)  # fmt: skip


def test_both_forms_record_the_same_events_with_prices_by_line_quantity() -> None:
    reference, fast = _both(MIXED, ACCOUNTS, RECORDED, TIERED)
    assert [_fields(e) for e in fast.transaction_events] == [
        _fields(e) for t in reference.transactions for e in t.pending_events
    ]
    for ours, theirs in [*zip(fast.lines, reference.lines, strict=True),
                         *zip(fast.accounts, reference.accounts, strict=True)]:  # fmt: skip
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
    assert fast.rejected == reference.rejected
    assert [t.id for t in fast.refused] == [t.id for t in reference.refused]
    # a-1 60 at 0.01 (volume past 50) = 60; a-2 +50 past the limit; a-3 90 at 0.01 = +30
    assert [(t.usage_id, t.amount) for t in reference.transactions][:3] == [
        ("a-1", Decimal(60)), ("a-2", Decimal(50)), ("a-3", Decimal(30)),
    ]  # fmt: skip
    assert [t.usage_id for t in reference.refused] == ["a-2", "t-1", "t-2"]
    lines = {ln.meter: ln for ln in reference.lines if ln.customer_id == "acme"}
    assert lines["api.requests"].quantity == 90  # a-1, a-3 and z-1 (0)
    assert lines["api.requests"].exact_total == Decimal(90)


CREDITED = [
    _usage("c-1", 60, offset=1),  # 60 cents of acme's 100 of credit
    _usage("c-2", 50, offset=2),  # 40 left: blocked
    _usage("t-1", "1999", meter="gpt.tokens", offset=3),  # 0.49975 cents: covered
    _usage("g-1", 70, customer_id="globex", offset=4),  # globex: 50 credit, 20 billed
    _usage("g-2", 5, customer_id="globex", offset=5),  # billed in full
]
CREDIT_ACCOUNTS = [
    _with_grants("acme", policy="block", grants=[("a", 30, 1), ("b", 70, 0)]),
    _with_grants("globex", policy="overage", grants=[("p", 50, 0)]),
]


def test_both_forms_burn_the_same_credits_and_refuse_the_same_records() -> None:
    reference, fast = _both(CREDITED, CREDIT_ACCOUNTS, set())
    for ours, theirs in zip(fast.accounts, reference.accounts, strict=True):
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
    assert [_fields(e) for e in fast.transaction_events] == [
        _fields(e) for t in reference.transactions for e in t.pending_events
    ]
    assert [(t.usage_id, t.compensation_reason) for t in reference.refused] == [
        ("c-2", "credits exhausted")
    ]
    acme = fast.accounts[0]
    assert {g: acme.grants[g].remaining for g in "ab"} == {
        "a": Decimal("30"),
        "b": Decimal("9.50025"),  # the lower priority number burns first, exactly
    }


def test_both_forms_put_the_same_credit_lines_on_the_invoices() -> None:
    reference, fast = _both(CREDITED, CREDIT_ACCOUNTS, set())
    assert [ln.id for ln in fast.lines] == [ln.id for ln in reference.lines]
    for ours, theirs in zip(fast.lines, reference.lines, strict=True):
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
    credit = {ln.customer_id: ln.billed for ln in fast.lines if isinstance(ln, CreditLine)}
    # acme: 60 on api.requests, 0.49975 on gpt.tokens (rounds to 0); globex: 50.
    assert credit == {"acme": -60, "globex": -50}
    invoices = {i.customer_id: i for i in fast.invoices}
    for ln in fast.lines:
        assert ln.id in invoices[ln.customer_id].lines


def test_both_forms_burn_the_same_credits_with_prices_by_line_quantity() -> None:
    reference, fast = _both(CREDITED, CREDIT_ACCOUNTS, set(), TIERED)
    for ours, theirs in [*zip(fast.lines, reference.lines, strict=True),
                         *zip(fast.accounts, reference.accounts, strict=True)]:  # fmt: skip
        assert [_fields(e) for e in ours.pending_events] == [
            _fields(e) for e in theirs.pending_events
        ]
    # c-1: 60 requests at 0.01 (volume past 50) = 60 of acme's 100; c-2 would add 50 of
    # the 40 left: blocked (the limit would have let it through).
    assert [(t.usage_id, t.compensation_reason) for t in reference.refused] == [
        ("c-2", "credits exhausted")
    ]
    # and t-1's 1999 tokens (graduated, its flat fee first) the 0.4499 more.
    assert fast.accounts[0].grants["b"].consumed == Decimal("60.4499")


def test_a_cheaper_volume_tier_consumes_no_credit_and_gives_none_back() -> None:
    # 40 requests at 0.02 = 80; 20 more reach the cheaper tier: the line falls to 60 (-20).
    batch = [_usage("v-1", 40, offset=1), _usage("v-2", 20, offset=2)]
    accounts = [_with_grants("acme", policy="block", grants=[("a", 100, 0)])]
    reference, fast = _both(batch, accounts, set(), TIERED)
    assert [(t.usage_id, t.amount) for t in reference.transactions] == [
        ("v-1", Decimal(80)), ("v-2", Decimal(-20)),
    ]  # fmt: skip
    for decision in (reference, fast):
        (account,) = decision.accounts
        assert account.grants["a"].consumed == Decimal(80)  # the -20 gave nothing back
        (consumed,) = [
            e for e in account.pending_events if isinstance(e, CustomerAccount.CreditsConsumed)
        ]
        assert consumed.amounts == ["80"]
        credit = next(ln for ln in decision.lines if isinstance(ln, CreditLine))
        assert credit.billed == -80
