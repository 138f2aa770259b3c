"""``domain.repricing``: what a price version published for the past changes on an open
line, and how the aggregates, the audit's folds and the pushes' decisions follow."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.utils import get_topic

from domain.account import CustomerAccount
from domain.audit import TxnAudit, balances_of, check_balances
from domain.audit_lines import LineAudit
from domain.audit_prices import check_prices
from domain.closing import billed_shares
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.invoice_states import StripeInvoiceView
from domain.periods import Period
from domain.price_book import PriceBook, PriceSchedule
from domain.pricing import Price, PriceList, Tier
from domain.pushing import REPRICED_TOPIC, charged_events, repriced_last
from domain.repricing import apply_repricing, decide_line, final_attention
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

JAN = datetime(2027, 1, 1, tzinfo=UTC)
USED = JAN + timedelta(days=10)
PERIOD = Period(JAN, datetime(2027, 2, 1, tzinfo=UTC))
V1 = PriceList({"api": Price(Decimal("0.001"), "USD"), "gpu": Price(Decimal("2"), "USD")})


def _book(*later: tuple[PriceList, datetime]) -> PriceSchedule:
    book = PriceBook.start(V1)
    for prices, moment in later:
        book.publish(prices, moment)
    return book.schedule


def _txn(
    usage_id: str, quantity: str = "1500", meter: str = "api", at: datetime = USED
) -> BillingTransaction:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id="acme",
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=at,
    )
    return BillingTransaction.from_usage(record, _book(), Source("usage", 0, 1))


def _invoice(line: InvoiceLine) -> Invoice:
    return Invoice.open("acme", "USD", PERIOD, line.id)


def _open_line(*txns: BillingTransaction) -> tuple[InvoiceLine, CustomerAccount]:
    line = InvoiceLine.open("acme", "USD", "api", PERIOD)
    account = CustomerAccount.open("acme", "USD")
    account.reserve_all([(t.id, t.amount) for t in txns])
    line.settle([(t.id, t.amount) for t in txns])
    for txn in txns:
        txn.reserve(account.id, line.id, line.sequence)
    return line, account


V2 = PriceList({"api": Price(Decimal("0.002"), "USD"), "gpu": Price(Decimal("2"), "USD")})


# ---------------------------------------------------------------------------------------------
# the decision


def test_a_version_in_force_at_the_usage_now_prices_it_again_exactly() -> None:
    txn = _txn("u-1", "1500")  # 1500 x 0.001 USD = 1.5 USD = 150 cents
    line, _ = _open_line(txn)
    decision = decide_line(line, [txn], _book((V2, JAN)))
    (change,) = decision.changes
    assert (change.old_version, change.version.number) == (1, 2)
    assert (change.old_amount, change.amount) == (Decimal(150), Decimal(300))
    assert (decision.exact_total, decision.new_exact_total) == (Decimal(150), Decimal(300))
    assert (decision.billed, decision.new_billed, decision.left) == (150, 300, ())


def test_a_version_that_starts_after_the_usage_changes_nothing() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    decision = decide_line(line, [txn], _book((V2, USED + timedelta(microseconds=1))))
    assert (decision.changes, decision.left) == ((), ())


def test_only_the_usage_at_or_after_the_new_version_is_repriced() -> None:
    early, late = _txn("u-1", at=USED - timedelta(days=1)), _txn("u-2")
    line, _ = _open_line(early, late)
    decision = decide_line(line, [early, late], _book((V2, USED)))
    assert [c.transaction_id for c in decision.changes] == [late.id]
    assert (decision.line_id, decision.customer_id, decision.currency, decision.meter) == (
        line.id,
        "acme",
        "USD",
        "api",
    )
    assert (decision.period, decision.frozen) == (PERIOD, False)


def test_usage_repriced_by_two_versions_names_both() -> None:
    a, b = _txn("u-1", at=JAN + timedelta(days=10)), _txn("u-2", at=JAN + timedelta(days=20))
    line, account = _open_line(a, b)
    v3 = PriceList({"api": Price(Decimal("0.003"), "USD")})
    schedule = _book((V2, JAN + timedelta(days=5)), (v3, JAN + timedelta(days=15)))
    decision = decide_line(line, [a, b], schedule)
    assert [c.version.number for c in decision.changes] == [2, 3]
    invoice = _invoice(line)
    invoice.close("period ended")
    invoice.collect_events()
    apply_repricing(decision, line, {a.id: a, b.id: b}, account, invoice)
    (adjusted,) = invoice.collect_events()
    assert isinstance(adjusted, Invoice.Adjusted)
    assert adjusted.reason == "re-priced by price book version 2, 3"
    reason = final_attention(decision, _finalized(line))
    assert reason is not None
    assert reason.startswith("re-priced by price book version 2, 3 after it was finalized")


def test_a_decision_is_recorded_only_on_its_own_line() -> None:
    txn, other = _txn("u-1"), _txn("u-2")
    line, account = _open_line(txn)
    decision = decide_line(line, [txn], _book((V2, JAN)))
    elsewhere = InvoiceLine.open("acme", "USD", "api", PERIOD, late_of=PERIOD)
    with pytest.raises(ValueError, match=f"the decision is about line {line.id}, not"):
        apply_repricing(decision, elsewhere, {txn.id: txn}, account, _invoice(line))
    assert other.price_version == 1


def test_a_meter_the_new_version_lacks_or_prices_in_another_currency_is_left_alone() -> None:
    api, gpu = _txn("u-1"), _txn("u-2", "3", meter="gpu")
    line, _ = _open_line(api, gpu)
    other = PriceList({"gpu": Price(Decimal("2"), "EUR")})
    decision = decide_line(line, [api, gpu], _book((other, JAN)))
    assert decision.changes == ()
    reasons = {left.transaction_id: left.reason for left in decision.left}
    assert reasons == {
        api.id: "version 2 has no price for meter 'api'",
        gpu.id: "version 2 prices 'gpu' in EUR, the usage is in USD",
    }


def test_usage_a_new_version_prices_by_line_quantity_or_a_contract_priced_is_left_alone() -> None:
    api, other = _txn("u-1"), _txn("u-2")
    object.__setattr__(other, "contract_version", 3)  # as a contract had priced it
    line, _ = _open_line(api, other)
    tiered = Price(Decimal("0.002"), "USD", model="volume",
                   tiers=(Tier(10, Decimal("0.002")), Tier(None, Decimal("0.001"))))  # fmt: skip
    by_line = decide_line(line, [api], _book((PriceList({"api": tiered}), JAN)))
    assert by_line.changes == ()
    [left] = by_line.left
    assert left.reason.startswith("priced by line quantity: the tiers in force at the period's")
    by_contract = decide_line(line, [api, other], _book((V2, JAN)))
    assert [c.transaction_id for c in by_contract.changes] == [api.id]
    assert [(x.transaction_id, x.reason) for x in by_contract.left] == [
        (other.id, "priced by contract version 3: a contract's prices are not re-priced")
    ]


def test_compensated_usage_and_usage_of_another_line_are_not_looked_at() -> None:
    kept, reversed_, elsewhere = _txn("u-1"), _txn("u-2"), _txn("u-3")
    line, _ = _open_line(kept, reversed_)
    elsewhere.reserve(CustomerAccount.open("acme", "USD").id, UUID(int=7), 2)  # another line
    reversed_.compensate("operator reversal")
    decision = decide_line(line, [reversed_, elsewhere, kept], _book((V2, JAN)))
    assert [c.transaction_id for c in decision.changes] == [kept.id]


def test_of_versions_tied_on_their_moment_the_one_published_last_prices() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    v3 = PriceList({"api": Price(Decimal("0.003"), "USD")})
    (change,) = decide_line(line, [txn], _book((V2, JAN), (v3, JAN))).changes
    assert (change.version.number, change.amount) == (3, Decimal(450))


# ---------------------------------------------------------------------------------------------
# recording it


def _record(
    txns: list[BillingTransaction], schedule: PriceSchedule, *, history: bool = False
) -> tuple[InvoiceLine, CustomerAccount]:
    """Re-price ``txns`` on their line; the events before it are dropped, but for the
    transactions' with ``history``."""
    line, account = _open_line(*txns)
    for agg in (line, account, *([] if history else txns)):
        agg.collect_events()
    decision = decide_line(line, txns, schedule)
    apply_repricing(decision, line, {t.id: t for t in txns}, account, _invoice(line))
    return line, account


def test_each_transaction_records_its_old_and_new_version_and_amount_and_keeps_its_state() -> None:
    txn = _txn("u-1")
    _record([txn], _book((V2, JAN)))
    (event,) = txn.collect_events()
    assert isinstance(event, BillingTransaction.Repriced)
    assert (event.old_price_version, event.price_version) == (1, 2)
    assert (event.old_amount, event.amount, event.state) == (Decimal(150), Decimal(300), "reserved")
    assert (txn.amount, txn.price_version, txn.unit_price, txn.state) == (
        Decimal(300),
        2,
        Decimal("0.002"),
        TxnState.RESERVED,
    )


def test_the_line_total_follows_rounded_once_and_its_sequence_moves() -> None:
    a, b = _txn("u-1", "1"), _txn("u-2", "1")  # 0.1 cent each; 0.25 cent each after
    v2 = PriceList({"api": Price(Decimal("0.0025"), "USD")})
    line, _ = _record([a, b], _book((v2, JAN)))
    (event,) = line.collect_events()
    assert isinstance(event, InvoiceLine.Repriced)
    assert event.transaction_ids == [str(a.id), str(b.id)]
    assert (event.old_amounts, event.amounts) == (["0.1", "0.1"], ["0.25", "0.25"])
    assert (event.exact_total, event.billed, event.transactions) == (Decimal("0.5"), 1, 2)
    assert (line.exact_total, line.billed, line.sequence) == (Decimal("0.5"), 1, 3)


def test_the_account_holds_the_differences_in_one_event_even_past_its_limit() -> None:
    txn = _txn("u-1")
    line, account = _open_line(txn)
    account.set_limit(200)  # 150 held; the new price makes it 300: owed usage, never refused
    account.collect_events()
    decision = decide_line(line, [txn], _book((V2, JAN)))
    apply_repricing(decision, line, {txn.id: txn}, account, _invoice(line))
    (event,) = account.collect_events()
    assert isinstance(event, CustomerAccount.AmountsRepriced)
    assert (event.old_amounts, event.amounts) == (["150"], ["300"])
    assert (account.reserved, account.available) == (Decimal(300), Decimal(0))


def test_an_unchanged_amount_moves_the_version_only() -> None:
    txn = _txn("u-1")
    same = PriceList({"api": Price(Decimal("0.0010"), "USD")})
    line, account = _record([txn], _book((same, JAN)))
    assert txn.price_version == 2
    assert (line.collect_events(), account.collect_events()) == ([], [])


def test_a_line_of_a_closed_invoice_is_repriced_with_the_invoice_adjusted() -> None:
    txn = _txn("u-1")
    line, account = _open_line(txn)
    invoice = _invoice(line)
    invoice.close("period ended")
    line.freeze()
    invoice.collect_events()
    decision = decide_line(line, [txn], _book((V2, JAN)))
    assert decision.frozen
    apply_repricing(decision, line, {txn.id: txn}, account, invoice)
    (adjusted,) = invoice.collect_events()
    assert isinstance(adjusted, Invoice.Adjusted)
    assert (adjusted.line_id, adjusted.transaction_ids) == (line.id, [str(txn.id)])
    assert adjusted.reason == "re-priced by price book version 2"
    assert (line.billed, txn.amount) == (300, Decimal(300))


def _finalized(line: InvoiceLine) -> Invoice:
    invoice = _invoice(line)
    invoice.close("period ended")
    line.freeze()
    invoice.start_finalizing([(line.id, line.sequence, line.billed)])
    view = StripeInvoiceView("open", "INV-1", line.billed, 0, 0, None, JAN, "finalize")
    assert invoice.observe(view)
    return invoice


def test_a_line_of_a_finalizing_or_final_invoice_is_never_changed() -> None:
    txn = _txn("u-1")
    line, account = _open_line(txn)
    finalizing = _invoice(line)
    finalizing.close("period ended")
    finalizing.start_finalizing([(line.id, line.sequence, line.billed)])
    decision = decide_line(line, [txn], _book((V2, JAN)))
    for invoice in (finalizing, _finalized(line)):
        before = [len(a.pending_events) for a in (line, account, txn, invoice)]
        with pytest.raises(IllegalTransition, match="not a draft"):
            apply_repricing(decision, line, {txn.id: txn}, account, invoice)
        assert [len(a.pending_events) for a in (line, account, txn, invoice)] == before


def test_a_final_invoice_whose_total_would_change_needs_attention_once() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    invoice = _finalized(line)
    decision = decide_line(line, [txn], _book((V2, JAN)))
    reason = final_attention(decision, invoice)
    assert reason == (
        f"re-priced by price book version 2 after it was finalized: line {line.id} (api)"
        " bills 1.50 USD, the prices in force make it 3.00 USD; issue a credit note or bill"
        " the difference, then settle"
    )
    invoice.need_attention(reason)
    invoice.settle_attention("credit note cn_1 issued", "ops@example.com")
    assert final_attention(decision, invoice) is None  # raised once, even once settled
    same = PriceList({"api": Price(Decimal("0.00100001"), "USD")})  # bills 1.50 USD still
    assert final_attention(decide_line(line, [txn], _book((same, JAN))), _finalized(line)) is None
    assert final_attention(decision, _invoice(line)) is None  # a draft: re-priced instead


@pytest.mark.parametrize("state", ["metered", "compensated", "unlined"])
def test_a_transaction_is_repriced_only_in_a_line_and_not_compensated(state: str) -> None:
    txn = _txn("u-1")
    if state == "compensated":
        _open_line(txn)
        txn.compensate("gave up")
    elif state == "unlined":
        txn.reserve(CustomerAccount.open("acme", "USD").id)
    version = _book((V2, JAN)).latest
    with pytest.raises(IllegalTransition):
        txn.reprice(version, V2.price_of("api"), Decimal(300))


def test_a_charged_transaction_is_repriced_and_stays_charged() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    txn.record_charged("ii_1", line.id, line.sequence)
    txn.reprice(_book((V2, JAN)).latest, V2.price_of("api"), Decimal(300))
    assert (txn.state, txn.amount) == (TxnState.CHARGED, Decimal(300))


# ---------------------------------------------------------------------------------------------
# the audit's folds


def _plain(event: Any) -> dict[str, Any]:
    def text(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        return str(value) if isinstance(value, Decimal | UUID) else value

    return {key: text(value) for key, value in vars(event).items()}


def _folded(txn: BillingTransaction) -> TxnAudit:
    metered, *later = txn.collect_events()
    fold = TxnAudit.metered(str(txn.id), _plain(metered))
    for event in later:
        fold.apply(type(event).__name__, _plain(event), event.originator_version)
    return fold


def _versions(schedule: PriceSchedule) -> dict[tuple[str | None, int], Any]:
    return {(str(v.book_id), v.number): v.prices.to_meters() for v in schedule.versions}


def test_the_fold_follows_a_repricing_and_the_price_audit_checks_the_new_version() -> None:
    txn = _txn("u-1")
    schedule = _book((V2, JAN))
    _record([txn], schedule, history=True)
    fold = _folded(txn)
    assert fold.problems == ()
    assert (fold.amount, fold.priced_by, fold.state) == (
        Decimal(300),
        (str(schedule.book_id), 2),
        TxnState.RESERVED,
    )
    assert check_prices([fold], _versions(schedule)) == []
    balance = balances_of([fold], {})["acme", "USD"]
    assert (balance.metered, balance.in_flight, check_balances({("acme", "USD"): balance})) == (
        Decimal(300),
        Decimal(300),
        [],
    )


def test_a_repriced_event_with_a_wrong_amount_is_a_price_finding() -> None:
    txn = _txn("u-1")
    schedule = _book((V2, JAN))
    _record([txn], schedule, history=True)
    metered, reserved, repriced = txn.collect_events()
    fold = TxnAudit.metered(str(txn.id), _plain(metered))
    fold.apply("Reserved", _plain(reserved), 2)
    fold.apply("Repriced", {**_plain(repriced), "amount": "299"}, 3)
    (finding,) = check_prices([fold], _versions(schedule))
    assert finding.kind == "price"
    assert "amount 2.99 USD" in finding.detail and "at 3.00 USD" in finding.detail


def test_a_repriced_event_from_another_amount_than_the_history_holds_is_a_problem() -> None:
    txn = _txn("u-1")
    _record([txn], _book((V2, JAN)), history=True)
    metered, reserved, repriced = txn.collect_events()
    fold = TxnAudit.metered(str(txn.id), _plain(metered))
    fold.apply("Reserved", _plain(reserved), 2)
    fold.apply("Repriced", {**_plain(repriced), "old_amount": "151"}, 3)
    assert fold.problems == (
        "v3: Repriced from 1.51 USD (version 1), the history holds 1.50 USD (version 1)",
    )


def _line_fold(line: InvoiceLine) -> LineAudit:
    opened, *later = line.collect_events()
    fold = LineAudit.opened(str(line.id), _plain(opened))
    for event in later:
        fold.apply(type(event).__name__, _plain(event), event.originator_version)
    return fold


def test_the_line_fold_follows_the_new_amounts_and_totals() -> None:
    a, b = _txn("u-1"), _txn("u-2", "500")
    line, _ = _open_line(a, b)
    line_events = line.collect_events()
    decision = decide_line(line, [a], _book((V2, JAN)))
    apply_repricing(decision, line, {a.id: a}, CustomerAccount.open("acme", "USD"), _invoice(line))
    line.pending_events[:0] = line_events  # the whole history, in order
    fold = _line_fold(line)
    assert fold.problems == []
    assert fold.members[str(a.id)] == (Decimal(300), 2)
    assert (fold.exact_total, fold.billed, fold.billed_at[3]) == (Decimal(350), 350, 350)


def test_a_line_repriced_from_an_amount_it_does_not_hold_is_a_problem() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    opened, settled = line.collect_events()
    fold = LineAudit.opened(str(line.id), _plain(opened))
    fold.apply("Settled", _plain(settled), 2)
    fold.apply(
        "Repriced",
        {"transaction_ids": [str(txn.id)], "old_amounts": ["100"], "amounts": ["300"],
         "exact_total": "350", "billed": 350, "transactions": 1},
        3,
    )  # fmt: skip
    assert fold.problems[0] == (
        f"v3: reprices {txn.id} from 1.00 USD, which the line holds as 1.50 USD"
    )


def test_a_billed_share_counts_a_repriced_transaction_at_its_new_amount() -> None:
    a, b = _txn("u-1", "1"), _txn("u-2", "1")  # 0.1 cent each
    line, _ = _open_line(a, b)
    settled = line.collect_events()[-1]
    v2 = PriceList({"api": Price(Decimal("0.006"), "USD")})  # 0.6 cent each
    decision = decide_line(line, [a], _book((v2, JAN)))
    apply_repricing(decision, line, {a.id: a}, _open_line()[1], _invoice(line))
    (repriced,) = line.collect_events()
    assert isinstance(settled, InvoiceLine.Settled)
    assert isinstance(repriced, InvoiceLine.Repriced)
    assert billed_shares([settled]) == {a.id: 0, b.id: 0}
    assert billed_shares([settled, repriced]) == {a.id: 1, b.id: 0}  # 0.6 then 0.7 -> 1


# ---------------------------------------------------------------------------------------------
# the schedule as spans, and charging what was re-priced


def test_spans_put_in_force_what_price_at_does() -> None:
    v3 = PriceList({"api": Price(Decimal("0.003"), "USD")})
    feb = JAN + timedelta(days=31)
    schedule = _book((V2, feb), (v3, JAN), (V2, feb))  # version 2 is tied with 4: no span
    spans = schedule.spans()
    assert spans == [(None, JAN, 1), (JAN, feb, 3), (feb, None, 4)]
    for moment in (JAN - timedelta(days=1), JAN, feb - timedelta(microseconds=1), feb):
        (number,) = [
            n for s, u, n in spans if (s is None or moment >= s) and (u is None or moment < u)
        ]
        assert number == schedule.price_at(moment).number


def test_a_transaction_last_repriced_is_charged_only_while_it_is_not_charged_yet() -> None:
    waiting, charged = UUID(int=1), UUID(int=2)
    latest = {waiting: (3, REPRICED_TOPIC), charged: (4, REPRICED_TOPIC)}
    assert sorted(repriced_last({**latest, UUID(int=3): (2, "x")})) == [waiting, charged]
    states = {waiting: TxnState.RESERVED, charged: TxnState.CHARGED}
    events = charged_events(
        [waiting, charged], latest, stripe_object_id="ii_1", line_id=UUID(int=9), sequence=5,
        states=states,
    )  # fmt: skip
    assert [(e.originator_id, e.originator_version) for e in events] == [(waiting, 4)]
    assert charged_events([waiting], latest, stripe_object_id="ii", line_id=UUID(int=9),
                          sequence=5) == []  # fmt: skip
    assert get_topic(BillingTransaction.Repriced) == REPRICED_TOPIC


# ---------------------------------------------------------------------------------------------
# what the aggregates refuse, each with its reason


def test_a_transaction_refuses_a_repricing_that_cannot_be_with_its_reason() -> None:
    txn = _txn("u-1")
    _open_line(txn)
    v2 = _book((V2, JAN)).latest
    with pytest.raises(ValueError, match=r"is in USD, the price in EUR$"):
        txn.reprice(v2, Price(Decimal(1), "EUR"), Decimal(300))
    with pytest.raises(ValueError, match=r"^an amount cannot be negative: -1$"):
        txn.reprice(v2, V2.price_of("api"), Decimal(-1))
    with pytest.raises(ValueError, match=f"^transaction {txn.id} is priced by version 1$"):
        txn.reprice(_book().latest, V2.price_of("api"), Decimal(300))
    txn.reprice(v2, Price(Decimal(0), "USD", 1000), Decimal(0))  # a free price: 0 is fine
    assert (txn.amount, txn.per, txn.unit_price) == (Decimal(0), 1000, Decimal(0))
    unlined = _txn("u-2")
    unlined.reserve(CustomerAccount.open("acme", "USD").id)
    with pytest.raises(IllegalTransition, match=r"is in no line: nothing to reprice$"):
        unlined.reprice(v2, V2.price_of("api"), Decimal(300))
    gone = _txn("u-3")
    gone.compensate("refused")
    with pytest.raises(IllegalTransition, match=f"^cannot reprice: transaction {gone.id} is"):
        gone.reprice(v2, V2.price_of("api"), Decimal(300))


def test_a_line_and_an_account_refuse_what_they_do_not_hold_and_take_zero() -> None:
    txn = _txn("u-1")  # 150
    line, account = _open_line(txn)
    with pytest.raises(ValueError, match=r"^a repriced amount cannot be negative: -1$"):
        line.reprice([(txn.id, Decimal(150), Decimal(-1))])
    with pytest.raises(ValueError, match=f"^cannot reprice more than line {line.id} holds$"):
        line.reprice([(txn.id, Decimal(1000), Decimal(0))])  # the total would go below 0
    with pytest.raises(ValueError, match=f"^cannot reprice more than line {line.id} holds$"):
        line.reprice([(txn.id, Decimal(0), Decimal(0)), (UUID(int=1), Decimal(0), Decimal(0))])
    with pytest.raises(ValueError, match=r"^cannot reprice more than 1.50 USD reserved$"):
        account.reprice([(txn.id, Decimal(1000), Decimal(0))])
    line.reprice([(txn.id, Decimal(150), Decimal(0))])  # to nothing: a free price
    account.reprice([(txn.id, Decimal(150), Decimal(0))])
    assert (line.exact_total, line.billed, account.reserved) == (0, 0, 0)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.AmountsRepriced)
    assert event.transaction_ids == [str(txn.id)]


def test_the_fold_names_a_repricing_in_no_line_or_in_another_state() -> None:
    txn = _txn("u-1")
    metered = _plain(txn.collect_events()[0])
    legacy = {k: v for k, v in metered.items() if k not in ("price_book_id", "price_version")}
    fold = TxnAudit.metered(str(txn.id), legacy)  # before price books: no version named
    fold.apply("Reserved", {"account_id": "a", "line_id": None, "line_version": None}, 2)
    repriced = {"price_book_id": str(UUID(int=5)), "price_version": 2, "amount": "300",
                "old_price_version": 1, "old_amount": "150", "state": "charged"}  # fmt: skip
    fold.apply("Repriced", repriced, 3)
    assert fold.problems == (
        "v3: Repriced from 1.50 USD (version 1), the history holds 1.50 USD (version None)",
    )
    lined = TxnAudit.metered(str(txn.id), metered)
    lined.apply("Reserved", {"account_id": "a", "line_id": None, "line_version": None}, 2)
    lined.apply("Repriced", repriced, 3)
    assert lined.problems == ("v3: Repriced, but in no line",)
    in_line = TxnAudit.metered(str(txn.id), metered)
    in_line.apply("Reserved", {"account_id": "a", "line_id": str(UUID(int=7)),
                               "line_version": 2}, 2)  # fmt: skip
    in_line.apply("Repriced", repriced, 3)
    assert in_line.problems == ("v3: Repriced says charged, the history says reserved",)


def test_the_line_fold_names_amounts_that_do_not_pair_and_usage_it_does_not_hold() -> None:
    txn = _txn("u-1")
    line, _ = _open_line(txn)
    opened, settled = line.collect_events()
    fold = LineAudit.opened(str(line.id), _plain(opened))
    fold.apply("Settled", _plain(settled), 2)
    fold.apply(
        "Repriced",
        {"transaction_ids": [str(txn.id), "t-2"], "old_amounts": ["150"], "amounts": ["300"],
         "exact_total": "300", "billed": 300, "transactions": 1},
        3,
    )  # fmt: skip
    assert fold.problems == ["v3: 2 transactions, 1 old and 1 new amounts"]
    fold.apply(
        "Repriced",
        {"transaction_ids": ["t-2"], "old_amounts": ["1"], "amounts": ["2"],
         "exact_total": "301", "billed": 301, "transactions": 1},
        4,
    )  # fmt: skip
    assert fold.problems[1] == "v4: reprices t-2 from 0.01 USD, which the line holds as nothing"


def test_the_line_fold_sums_repriced_amounts_exactly_past_28_digits() -> None:
    line = InvoiceLine.open("acme", "USD", "api", PERIOD)
    big, tiny = UUID(int=1), UUID(int=2)
    line.settle([(big, Decimal("1000000000000000")), (tiny, Decimal("1E-20"))])
    line.reprice([(tiny, Decimal("1E-20"), Decimal("2E-20"))])
    fold = _line_fold(line)
    assert fold.problems == []
    assert fold.exact_total == Decimal("1000000000000000.00000000000000000002")
