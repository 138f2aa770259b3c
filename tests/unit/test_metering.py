"""``meter_batch``: the ingest decision for one batch, with accounts from a dict."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

from domain.account import CustomerAccount
from domain.ids import account_id, transaction_id
from domain.invoice_line import InvoiceLine
from domain.metering import Metering, MeteringDecision, meter_batch
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

# One cent per request, so a record's amount in cents is its quantity.
PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.01"), "USD"),
        "eu.gpu.seconds": Price(Decimal("0.01"), "EUR"),
    }
)
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
MONTHLY = PeriodPolicy()
NOW = AT


def NO_LINES(line_id: UUID) -> InvoiceLine | None:
    """No line exists yet: each batch opens the lines it needs."""
    return None


class Accounts:
    """The account store, faked by a dict keyed by (customer, currency); counts its loads."""

    def __init__(self, *accounts: CustomerAccount) -> None:
        self.by_key = {(a.customer_id, a.currency): a for a in accounts}
        self.loads: list[tuple[str, str]] = []

    def load(self, customer_id: str, currency: str) -> CustomerAccount | None:
        self.loads.append((customer_id, currency))
        return self.by_key.get((customer_id, currency))


def _usage(
    usage_id: str,
    quantity: int = 1,
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
    return Metering(record=record, source=Source("usage", 0, offset))


def _account(customer_id: str = "acme", currency: str = "USD", **kw: int) -> CustomerAccount:
    account = CustomerAccount(customer_id=customer_id, currency=currency, **kw)
    account.collect_events()  # as if loaded from the store: nothing pending
    return account


def _meter(
    batch: Sequence[Metering],
    accounts: Accounts | None = None,
    already_recorded: Iterable[Metering] = (),
) -> MeteringDecision:
    return meter_batch(
        batch,
        PRICES,
        load_account=(accounts or Accounts()).load,
        load_line=NO_LINES,
        load_invoice=lambda invoice_id: None,
        periods=MONTHLY,
        now=NOW,
        already_recorded={m.transaction_id for m in already_recorded},
    )


def _names(aggregate: BillingTransaction | CustomerAccount) -> list[str]:
    return [type(e).__name__ for e in aggregate.pending_events]


# ---------------------------------------------------------------------------------------------
# new records


def test_new_records_become_metered_and_reserved_transactions_on_a_new_account() -> None:
    decision = _meter([_usage("req-1", 5), _usage("req-2", 7)])
    [account] = decision.accounts
    assert account.id == account_id("acme", "USD")
    assert [t.id for t in decision.transactions] == [
        transaction_id("acme", "req-1"),
        transaction_id("acme", "req-2"),
    ]
    for txn in decision.transactions:
        assert txn.state is TxnState.RESERVED
        assert txn.account_id == account.id
        assert _names(txn) == ["Metered", "Reserved"]
    assert [t.amount for t in decision.transactions] == [5, 7]  # 5 and 7 requests at 1 cent
    assert account.reserved == 12  # 5 + 7
    assert _names(account) == ["Opened", "AmountsReserved"]
    assert (decision.duplicates, decision.rejected, decision.refused) == ([], [], [])


def test_the_decision_lists_accounts_lines_invoices_then_transactions_as_its_aggregates() -> None:
    decision = _meter([_usage("req-1")])
    assert decision.aggregates == [
        *decision.accounts,
        *decision.lines,
        *decision.invoices,
        *decision.transactions,
    ]
    assert len(decision.invoices) == 1  # the line's invoice, opened with it
    assert len(decision.aggregates) == 4


def test_reserved_transactions_join_the_line_of_their_meter_and_period_in_one_event() -> None:
    later = Metering(
        UsageRecord(
            usage_id="next-month",
            customer_id="acme",
            meter="api.requests",
            quantity=Decimal(2),
            occurred_at=datetime(2027, 1, 1, tzinfo=UTC),
        ),
        Source("usage", 0, 9),
    )
    batch = [_usage("a", 3), _usage("b", 4), _usage("e", 5, meter="eu.gpu.seconds"), later]
    decision = _meter(batch)
    by_key = {(ln.meter, ln.period.key): ln for ln in decision.lines}
    assert sorted(by_key) == [
        ("api.requests", "2026-12-01T00:00:00Z"),
        ("api.requests", "2027-01-01T00:00:00Z"),
        ("eu.gpu.seconds", "2026-12-01T00:00:00Z"),
    ]
    december = by_key["api.requests", "2026-12-01T00:00:00Z"]
    [_opened, settled] = december.pending_events
    assert isinstance(settled, InvoiceLine.Settled)
    assert settled.amounts == ["3", "4"] and settled.exact_total == 7 and settled.billed == 7
    for txn in decision.transactions:
        line = by_key[txn.meter, txn.occurred_at.strftime("%Y-%m-01T00:00:00Z")]
        assert (txn.line_id, txn.line_version) == (line.id, line.sequence)


def test_a_refused_transaction_joins_no_line() -> None:
    accounts = Accounts(_account(spend_limit=2))
    decision = _meter([_usage("big", 5)], accounts)
    assert decision.lines == [] and decision.transactions[0].line_id is None


def test_the_transaction_keeps_where_the_record_came_from() -> None:
    [txn] = _meter([_usage("req-1", offset=77)]).transactions
    assert txn.source == "usage/0@77"


# ---------------------------------------------------------------------------------------------
# duplicates


def test_a_record_repeated_in_one_batch_becomes_one_transaction() -> None:
    first, again = _usage("req-1", 5, offset=1), _usage("req-1", 5, offset=2)
    decision = _meter([first, again])
    assert [t.id for t in decision.transactions] == [first.transaction_id]
    assert decision.duplicates == [again]
    assert decision.accounts[0].reserved == 5  # reserved once, not 10


def test_a_repeated_usage_id_is_a_duplicate_even_with_another_payload() -> None:
    decision = _meter([_usage("req-1", 5), _usage("req-1", 900)])
    assert [t.amount for t in decision.transactions] == [5]  # the first one wins
    assert len(decision.duplicates) == 1


def test_already_recorded_records_are_skipped_as_duplicates_without_a_transaction() -> None:
    old, new = _usage("req-1", 5), _usage("req-2", 7)
    decision = _meter([old, new], already_recorded=[old])
    assert decision.duplicates == [old]
    assert [t.id for t in decision.transactions] == [new.transaction_id]
    assert decision.accounts[0].reserved == 7


def test_a_batch_of_only_recorded_records_changes_nothing_and_loads_no_account() -> None:
    accounts = Accounts()
    batch = [_usage("req-1"), _usage("req-2")]
    decision = meter_batch(
        batch,
        PRICES,
        load_account=accounts.load,
        load_line=NO_LINES,
        load_invoice=lambda invoice_id: None,
        periods=MONTHLY,
        now=NOW,
        already_recorded={m.transaction_id for m in batch},
    )
    assert (decision.transactions, decision.accounts, decision.aggregates) == ([], [], [])
    assert decision.duplicates == batch
    assert accounts.loads == []


def test_the_same_usage_id_from_two_customers_is_two_transactions() -> None:
    decision = _meter([_usage("req-1", customer_id="acme"), _usage("req-1", customer_id="globex")])
    assert len(decision.transactions) == 2
    assert decision.duplicates == []


def test_usage_ids_that_contain_the_separator_are_not_taken_for_duplicates() -> None:
    one = _usage("eu:req-1", customer_id="acme")
    two = _usage("req-1", customer_id="acme")
    decision = _meter([one, two])
    assert decision.duplicates == []
    assert len(decision.transactions) == 2


# ---------------------------------------------------------------------------------------------
# rejected


def test_a_record_for_an_unknown_meter_is_rejected_with_the_reason() -> None:
    bad, good = _usage("req-1", meter="gpt-9.tokens"), _usage("req-2", 3)
    decision = _meter([bad, good])
    assert decision.rejected == [(bad, "unknown meter 'gpt-9.tokens'")]
    assert [t.id for t in decision.transactions] == [good.transaction_id]


def test_a_record_whose_currency_differs_from_its_meter_is_rejected_with_the_reason() -> None:
    bad = _usage("req-1", currency="EUR")  # api.requests is priced in USD
    decision = _meter([bad])
    [(rejected, reason)] = decision.rejected
    assert rejected is bad
    assert reason == "currency 'EUR' does not match meter 'api.requests' priced in USD"
    assert (decision.transactions, decision.accounts) == ([], [])


def test_a_record_whose_currency_matches_its_meter_in_any_case_is_accepted() -> None:
    decision = _meter([_usage("req-1", currency="usd")])
    assert decision.rejected == []
    assert decision.transactions[0].currency == "USD"


def test_every_record_of_a_batch_ends_as_exactly_one_outcome() -> None:
    batch = [
        _usage("req-1"),
        _usage("req-1"),  # duplicate
        _usage("req-2", meter="nope"),  # rejected
        _usage("req-2", meter="nope"),  # rejected again: it was never recorded
        _usage("req-3", currency="EUR"),  # rejected
        _usage("req-4"),
    ]
    decision = _meter(batch)
    outcomes = (len(decision.transactions), len(decision.duplicates), len(decision.rejected))
    assert outcomes == (2, 1, 3)
    assert sum(outcomes) == len(batch)


# ---------------------------------------------------------------------------------------------
# the spend limit


def test_a_reservation_past_the_spend_limit_is_compensated_and_a_later_smaller_one_fits() -> None:
    account = _account(spend_limit=100)
    big, too_big, small = _usage("req-1", 60), _usage("req-2", 50), _usage("req-3", 30)
    decision = _meter([big, too_big, small], Accounts(account))
    states = [t.state for t in decision.transactions]
    # 60 fits (40 left); 50 > 40 is refused; 30 still fits (10 left)
    assert states == [TxnState.RESERVED, TxnState.COMPENSATED, TxnState.RESERVED]
    [refused] = decision.refused
    assert refused.id == too_big.transaction_id
    assert refused.account_id is None
    assert _names(refused) == ["Metered", "Compensated"]
    assert refused.compensation_reason == (
        "spend limit: 0.50 USD would exceed the limit of 1.00 USD"
    )
    assert (account.reserved, account.available) == (90, 10)  # 60 + 30


def test_a_batch_the_limit_refuses_entirely_records_no_reservation() -> None:
    account = _account(spend_limit=0)
    decision = _meter([_usage("req-1", 1), _usage("req-2", 2)], Accounts(account))
    assert [t.state for t in decision.transactions] == [TxnState.COMPENSATED] * 2
    assert decision.accounts == [account]
    assert (account.reserved, account.pending_events) == (0, [])


def test_a_zero_amount_is_reserved_even_with_no_headroom_left() -> None:
    account = _account(spend_limit=0)
    decision = _meter([_usage("req-1", 0)], Accounts(account))
    assert decision.transactions[0].state is TxnState.RESERVED


def test_earlier_reservations_on_the_account_count_against_the_limit() -> None:
    account = _account(spend_limit=100)
    account.reserve_all([(transaction_id("acme", "old"), 95)])
    account.collect_events()
    decision = _meter([_usage("req-1", 6), _usage("req-2", 5)], Accounts(account))
    # 95 committed, 5 left: 6 refused, 5 fits
    assert [t.state for t in decision.transactions] == [TxnState.COMPENSATED, TxnState.RESERVED]
    assert account.reserved == 100


# ---------------------------------------------------------------------------------------------
# accounts


def test_one_account_per_customer_and_currency_however_many_records() -> None:
    accounts = Accounts(_account("acme", "USD"))
    batch = [
        *(_usage(f"usd-{n}", customer_id="acme") for n in range(5)),
        *(_usage(f"eur-{n}", customer_id="acme", meter="eu.gpu.seconds") for n in range(2)),
        *(_usage(f"g-{n}", customer_id="globex") for n in range(3)),
    ]
    decision = _meter(batch, accounts)
    keys = [(a.customer_id, a.currency) for a in decision.accounts]
    assert sorted(keys) == [("acme", "EUR"), ("acme", "USD"), ("globex", "USD")]
    assert sorted(accounts.loads) == sorted(keys)  # each loaded once
    assert {a.id for a in decision.accounts} == {account_id(c, cur) for c, cur in keys}
    by_key = {(a.customer_id, a.currency): a for a in decision.accounts}
    # the loaded account is used as it is; only the missing ones are opened
    assert by_key["acme", "USD"] is accounts.by_key["acme", "USD"]
    assert _names(by_key["acme", "USD"]) == ["AmountsReserved"]
    assert _names(by_key["globex", "USD"]) == ["Opened", "AmountsReserved"]
    assert (by_key["acme", "USD"].reserved, by_key["acme", "EUR"].reserved) == (5, 2)


def test_reserved_on_each_account_equals_the_amounts_of_its_reserved_transactions() -> None:
    acme = _account("acme", "USD", spend_limit=50)
    acme.reserve_all([(transaction_id("acme", "old"), 20)])  # reserved before this batch
    acme.collect_events()
    batch = [
        _usage("a-1", 10),
        _usage("a-2", 25),  # 20 + 10 + 25 = 55 > 50: refused
        _usage("a-3", 20),  # 20 + 10 + 20 = 50: fits
        _usage("g-1", 7, customer_id="globex"),
        _usage("e-1", 4, meter="eu.gpu.seconds"),
        _usage("x-1", 3, meter="nope"),  # rejected: never reserved
    ]
    decision = _meter(batch, Accounts(acme))
    before = {acme.id: 20}
    for account in decision.accounts:
        reserved_txns = [
            t
            for t in decision.transactions
            if t.state is TxnState.RESERVED and t.account_id == account.id
        ]
        assert account.reserved - before.get(account.id, 0) == sum(t.amount for t in reserved_txns)
    assert {a.currency: a.reserved for a in decision.accounts if a.customer_id == "acme"} == {
        "USD": 50,  # 20 + 10 + 20
        "EUR": 4,
    }
    assert [t.usage_id for t in decision.refused] == ["a-2"]
