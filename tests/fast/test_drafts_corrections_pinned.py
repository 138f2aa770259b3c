"""The open-draft checker and the corrections, pinned through their ports: the in-memory
ledger, the strict fake Stripe and a fixed clock. What each check records on the
invoice and its lines and hands to the pushers; what each reversal and adoption
records on the transaction, its account, its line and invoice, and asks of Stripe;
and what each does when another writer saves first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from adapters.charging.corrections import Corrections
from adapters.charging.drafts import CheckResult, DraftChecker
from adapters.charging.pusher import LinePusher
from adapters.errors import PaymentFailed
from domain.account import CustomerAccount
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import LinePush
from domain.invoice_states import InvoiceState, StripeInvoiceView
from domain.periods import PeriodPolicy
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import BillingTransaction, Source, TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve, usage

POLICY = RetryPolicy(horizon=timedelta(hours=1))
NOW = T0 + timedelta(days=2)
DECEMBER = PeriodPolicy().period_of(T0)
DOWN = ChargeFailure("http_503", "down", retryable=True)


class Racing:
    """The ledger, where another writer saves first: before each of the next ``races``
    saves, ``other`` runs (it loads and saves on the real ledger), so the save that
    follows loses the version check as it would against a concurrent process."""

    def __init__(self, ledger: BillingLedger, other: Callable[[], object], races: int) -> None:
        self._ledger = ledger
        self._other = other
        self.races = races
        self.saves = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        self.saves += 1
        if self.races > 0:
            self.races -= 1
            self._other()
        return self._ledger.save(*objs, **kwargs)


@dataclass
class KeyedDeletes(FakeGateway):
    """The fake Stripe, remembering the idempotency key of each deletion."""

    delete_keys: list[str] = field(default_factory=list)

    def delete_item(self, item_id: str, key: str) -> ChargeFailure | None:
        self.delete_keys.append(key)
        return super().delete_item(item_id, key)


class Parts:
    """A ledger, the fake Stripe, one pusher, all on one fixed clock."""

    def __init__(self) -> None:
        self.clock = Clock(NOW)
        self.ledger = memory_ledger()
        self.gateway = KeyedDeletes(clock=self.clock)
        self.pusher = LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5
        )
        self.handed: list[tuple[UUID, str]] = []

    def pushed(self, n: int = 1, **kw: Any) -> tuple[list[UUID], UUID, Invoice]:
        """``n`` records reserved and pushed: their transactions, line and invoice."""
        ids = reserve(self.ledger, n, **kw)
        line = self.line(ids[0])
        assert self.pusher.push(line).result is StepResult.CHARGED
        return ids, line, self.invoice(line)

    def line(self, txn: UUID) -> UUID:
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def invoice(self, line: UUID) -> Invoice:
        found = self.ledger.invoice_by_id(self.ledger.line_by_id(line).invoice_id)
        assert found is not None
        return found

    def checker(self, ledger: Any = None) -> DraftChecker:
        return DraftChecker(
            ledger or self.ledger,
            self.gateway,
            lambda line, customer: self.handed.append((line, customer)),
            clock=self.clock,
        )

    def item_of(self, line: UUID) -> str:
        [item] = [k for k, i in self.gateway.items.items() if i["line"] == line]
        return item

    def events(self, aggregate: UUID, kind: type) -> list[Any]:
        return [e for e in self.ledger.events.get(aggregate) if isinstance(e, kind)]


# -- the open-draft checker -------------------------------------------------------------


def test_a_draft_equal_to_the_ledger_is_recorded_checked_with_its_total_and_items() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(3)
    _, other, _ = parts.pushed(2, meter="gpt-4o.input_tokens", quantity=4000, prefix="t")
    assert parts.checker().check(invoice.id) is CheckResult.EQUAL
    [checked] = parts.events(invoice.id, Invoice.DraftChecked)
    assert (checked.total, checked.items, checked.drifted) == (302, 2, [])
    assert parts.handed == []
    assert parts.gateway.held(line) == [300] and parts.gateway.held(other) == [2]


def test_an_item_changed_by_hand_is_drift_recorded_on_its_line_and_handed_to_its_pusher() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(3)
    parts.gateway.items[parts.item_of(line)]["amount"] = 70
    assert parts.checker().check(invoice.id) is CheckResult.DRIFT
    assert parts.handed == [(line, "acme")]
    push = parts.ledger.line_push(line)
    assert push is not None and push.drifted and push.repairs == 1
    [drift] = parts.events(push.id, LinePush.DriftFound)
    assert (drift.repair, drift.found) == (1, [70])
    [checked] = parts.events(invoice.id, Invoice.DraftChecked)
    assert (checked.total, checked.items, checked.drifted) == (70, 1, [str(line)])
    assert parts.ledger.invoice_by_id(invoice.id).attention is None  # type: ignore[union-attr]


def test_a_line_item_of_0_that_is_gone_counts_as_holding_0_in_the_drift_found() -> None:
    parts = Parts()
    [big] = reserve(parts.ledger, 1, quantity=1_000_000_000)  # two items: MAX and the rest
    reserve(parts.ledger, 1, prefix="s")
    line = parts.line(big)
    parts.pusher.push(line)
    Corrections(parts.ledger, parts.gateway, clock=parts.clock).reverse(big, "test")
    parts.pusher.push(line)
    assert parts.gateway.held(line) == [100, 0]
    first, second = [k for k, i in parts.gateway.items.items() if i["line"] == line]
    del parts.gateway.items[second]  # the item of 0 deleted by hand: nothing, as decided
    parts.gateway.items[first]["amount"] = 70
    assert parts.checker().check(parts.invoice(line).id) is CheckResult.DRIFT
    push = parts.ledger.line_push(line)
    assert push is not None
    [drift] = parts.events(push.id, LinePush.DriftFound)
    assert drift.found == [70, 0]


def test_drifted_lines_are_recorded_in_line_order_and_each_handed_over_once() -> None:
    parts = Parts()
    _, first, invoice = parts.pushed(1)
    _, second, _ = parts.pushed(1, meter="gpt-4o.input_tokens", quantity=4000, prefix="t")
    _, third, _ = parts.pushed(1, meter="gpt-4o.output_tokens", quantity=4000, prefix="o")
    for line in (first, second, third):
        parts.gateway.items[parts.item_of(line)]["amount"] = 55
    assert parts.checker().check(invoice.id) is CheckResult.DRIFT
    lines = sorted([first, second, third])
    assert [line for line, _ in parts.handed] == lines
    [checked] = parts.events(invoice.id, Invoice.DraftChecked)
    assert checked.drifted == [str(line) for line in lines]
    assert checked.total == 165


def test_a_line_whose_drift_is_not_repaired_yet_is_not_read_again() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(1)
    parts.gateway.items[parts.item_of(line)]["amount"] = 70
    checker = parts.checker()
    assert checker.check(invoice.id) is CheckResult.DRIFT
    reads = parts.gateway.calls.count("read")
    assert checker.check(invoice.id) is CheckResult.SKIPPED
    assert parts.gateway.calls.count("read") == reads
    assert len(parts.events(invoice.id, Invoice.DraftChecked)) == 1


def test_a_push_that_may_still_land_defers_the_check_until_it_cannot() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(1)
    reserve(parts.ledger, 1, prefix="b")
    parts.gateway.hold("timeout")
    assert parts.pusher.push(line).result is StepResult.RETRY
    push = parts.ledger.line_push(line)
    assert push is not None
    until = push.in_doubt_until(parts.clock.now)
    assert until is not None
    checker = parts.checker()
    parts.clock.now = until - timedelta(microseconds=1)
    assert checker.check(invoice.id) is CheckResult.SKIPPED
    assert "read" not in parts.gateway.calls
    parts.clock.now = until
    assert checker.check(invoice.id) is CheckResult.EQUAL  # the request never landed
    assert parts.gateway.calls.count("read") == 1


def test_invoices_that_are_not_open_drafts_of_this_ledger_are_skipped_unread() -> None:
    parts = Parts()
    checker = parts.checker()
    assert checker.check(uuid4()) is CheckResult.SKIPPED  # no such invoice
    [unpushed] = reserve(parts.ledger, 1, prefix="u")  # a line never pushed: no draft
    assert checker.check(parts.invoice(parts.line(unpushed)).id) is CheckResult.SKIPPED
    _, _, invoice = parts.pushed(1, customer="beta")
    invoice.need_attention("an operator looks at it")
    parts.ledger.save(invoice)
    assert checker.check(invoice.id) is CheckResult.SKIPPED  # stopped for an operator
    assert "read" not in parts.gateway.calls
    assert parts.events(invoice.id, Invoice.DraftChecked) == []


def test_a_closed_invoice_is_left_to_the_closer() -> None:
    parts = Parts()
    _, _, invoice = parts.pushed(1)
    invoice.close("test")
    parts.ledger.save(invoice)
    assert parts.checker().check(invoice.id) is CheckResult.SKIPPED
    assert "read" not in parts.gateway.calls


def test_stripe_unreadable_fails_the_check_and_records_nothing() -> None:
    parts = Parts()
    _, _, invoice = parts.pushed(1)
    parts.gateway.failures.append(DOWN)
    assert parts.checker().check(invoice.id) is CheckResult.FAILED
    assert parts.events(invoice.id, Invoice.DraftChecked) == []
    assert parts.ledger.invoice_by_id(invoice.id).attention is None  # type: ignore[union-attr]


def test_a_draft_finalized_by_hand_stops_the_invoice_with_its_stripe_status() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(1)
    stripe_id = invoice.stripe_invoice_id
    assert stripe_id is not None
    parts.gateway.items[parts.item_of(line)]["amount"] = 70  # drift too: attention first
    parts.gateway.finalize_invoice(stripe_id, invoice.id, look_first=False)
    assert parts.checker().check(invoice.id) is CheckResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None
    assert stopped.attention == f"Stripe's invoice {stripe_id} is open, not a draft"
    assert parts.handed == [] and parts.events(invoice.id, Invoice.DraftChecked) == []
    push = parts.ledger.line_push(line)
    assert push is not None and not push.drifted


def test_an_item_the_ledger_did_not_make_stops_the_invoice_with_what_verify_found() -> None:
    parts = Parts()
    _, _, invoice = parts.pushed(1)
    parts.gateway.items["ii_by_hand"] = {
        "amount": 999, "line": None, "invoice": invoice.stripe_invoice_id,
    }  # fmt: skip
    assert parts.checker().check(invoice.id) is CheckResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.attention is not None
    assert "ii_by_hand (9.99 USD)" in stopped.attention
    [needed] = parts.events(invoice.id, Invoice.AttentionNeeded)
    assert needed.reason == stopped.attention
    assert parts.handed == []


def test_a_push_saved_while_checking_wins_and_the_check_is_skipped() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(1)
    parts.gateway.items[parts.item_of(line)]["amount"] = 70

    def push_meanwhile() -> None:
        reserve(parts.ledger, 1, prefix="late")
        parts.pusher.push(line)

    racing = Racing(parts.ledger, push_meanwhile, races=1)
    assert parts.checker(racing).check(invoice.id) is CheckResult.SKIPPED
    assert parts.handed == []
    push = parts.ledger.line_push(line)
    assert push is not None and not push.drifted
    assert parts.events(invoice.id, Invoice.DraftChecked) == []
    assert parts.gateway.held(line) == [200]  # the push set it: nothing to repair


def test_an_attention_save_that_loses_a_race_is_skipped_and_records_nothing() -> None:
    parts = Parts()
    _, line, invoice = parts.pushed(1)
    assert invoice.stripe_invoice_id is not None
    parts.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)

    def closed_meanwhile() -> None:
        closing = parts.invoice(line)
        closing.close("deadline")
        parts.ledger.save(closing)

    racing = Racing(parts.ledger, closed_meanwhile, races=1)
    assert parts.checker(racing).check(invoice.id) is CheckResult.SKIPPED
    kept = parts.ledger.invoice_by_id(invoice.id)
    assert kept is not None and (kept.state, kept.attention) == (InvoiceState.CLOSED, None)


# -- corrections: reversals -------------------------------------------------------------


def _compensated(parts: Parts, txn: UUID) -> BillingTransaction.Compensated:
    [event] = [
        e for e in parts.ledger.history(txn) if isinstance(e, BillingTransaction.Compensated)
    ]
    return event


def _legacy(
    parts: Parts, usage_id: str, *, charged_as: str | None = None, meter: str = "api.requests"
) -> UUID:
    """A transaction as a history written before lines has it: Reserved with no line
    (and, when ``charged_as``, Charged on its own Stripe item); another record of its
    period, reserved beside it, opens the account and the period's line."""
    [txn_id] = reserve(parts.ledger, 1, prefix=f"anchor-{usage_id}")
    account_id = parts.ledger.transaction(txn_id).account_id
    assert account_id is not None
    legacy = BillingTransaction.from_usage(
        usage(usage_id, meter=meter), parts.ledger.prices, Source("usage", 0, 99)
    )
    legacy.reserve(account_id)
    if charged_as is not None:
        legacy.record_charged(charged_as)
    parts.ledger.save(legacy)
    return legacy.id


def test_reversing_a_charge_on_an_open_invoice_lowers_its_line_and_releases_the_hold() -> None:
    parts = Parts()
    ids, line, _ = parts.pushed(3)
    before = parts.ledger.account("acme", "USD")
    assert before is not None
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[1], "customer asked") is StepResult.REVERSED
    lowered = parts.ledger.line_by_id(line)
    assert lowered.billed == 200
    reversed_txn = parts.ledger.transaction(ids[1])
    assert (reversed_txn.state, reversed_txn.compensation_reason) == (
        TxnState.COMPENSATED, "customer asked",
    )  # fmt: skip
    compensated = _compensated(parts, ids[1])
    assert compensated.stripe_reversal_id == f"line:{line}@{lowered.sequence}"
    after = parts.ledger.account("acme", "USD")
    assert after is not None and after.reserved == before.reserved - reversed_txn.amount
    [released] = [
        e for e in parts.ledger.events.get(after.id)
        if isinstance(e, CustomerAccount.ReservationReleased)
    ]  # fmt: skip
    assert (released.transaction_id, released.amount) == (str(ids[1]), reversed_txn.amount)
    assert parts.gateway.calls.count("delete") == 0


def test_reversing_a_reserved_transaction_lowers_its_line_and_names_no_stripe_reversal() -> None:
    parts = Parts()
    ids = reserve(parts.ledger, 2)
    line = parts.line(ids[0])
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[0], "duplicate usage") is StepResult.REVERSED
    assert parts.ledger.line_by_id(line).billed == 100
    assert parts.ledger.transaction(ids[0]).state is TxnState.COMPENSATED
    assert _compensated(parts, ids[0]).stripe_reversal_id is None
    parts.pusher.push(line)
    assert parts.gateway.held(line) == [100]


def test_only_a_charge_or_a_reservation_on_a_line_can_be_reversed() -> None:
    parts = Parts()
    ids, _, _ = parts.pushed(1)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    corrections.reverse(ids[0], "first")
    with pytest.raises(IllegalTransition, match=f"transaction {ids[0]} is compensated"):
        corrections.reverse(ids[0], "again")
    legacy = _legacy(parts, "legacy")  # reserved, on no line: nothing in Stripe to follow
    with pytest.raises(IllegalTransition, match="not charged"):
        corrections.reverse(legacy, "no line")
    assert parts.ledger.transaction(legacy).state is TxnState.RESERVED


def test_reversing_a_charge_from_before_lines_deletes_its_own_item_by_a_reversal_key() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy", charged_as="ii_legacy")
    before = parts.ledger.account("acme", "USD")
    assert before is not None
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(legacy, "refund") is StepResult.REVERSED
    assert parts.gateway.deleted == ["ii_legacy"]
    assert parts.gateway.delete_keys == [f"reverse:{legacy}"]
    assert _compensated(parts, legacy).stripe_reversal_id == "deleted:ii_legacy"
    after = parts.ledger.account("acme", "USD")
    assert after is not None and after.reserved == before.reserved - 100


def test_a_legacy_item_stripe_would_not_delete_leaves_the_charge_standing() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy", charged_as="ii_legacy")
    parts.gateway.failures.append(DOWN)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    with pytest.raises(PaymentFailed, match=r"^reversal not done in Stripe: down$"):
        corrections.reverse(legacy, "refund")
    assert parts.ledger.transaction(legacy).state is TxnState.CHARGED


def _closed(parts: Parts, n: int = 2) -> tuple[list[UUID], UUID, Invoice]:
    ids, line, invoice = parts.pushed(n)
    invoice.close("deadline")
    parts.ledger.save(invoice)
    return ids, line, invoice


def test_reversing_on_a_closed_invoice_lowers_the_line_and_records_it_adjusted() -> None:
    parts = Parts()
    ids, line, invoice = _closed(parts)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED
    lowered = parts.ledger.line_by_id(line)
    assert lowered.billed == 100
    [adjusted] = parts.events(invoice.id, Invoice.Adjusted)
    assert (adjusted.line_id, adjusted.transaction_ids, adjusted.reason) == (
        line, [str(ids[0])], "goodwill",
    )  # fmt: skip
    assert _compensated(parts, ids[0]).stripe_reversal_id == f"line:{line}@{lowered.sequence}"


def _finalized(parts: Parts, n: int, quantity: int = 1000) -> tuple[list[UUID], UUID, Invoice]:
    ids, line, invoice = parts.pushed(n, quantity=quantity)
    invoice.close("deadline")
    pushed = parts.ledger.line_by_id(line)
    invoice.start_finalizing([(line, pushed.sequence, pushed.billed)])
    parts.ledger.save(invoice)
    return ids, line, invoice


def test_reversing_after_finalizing_requests_a_credit_of_the_billed_share() -> None:
    parts = Parts()
    ids, line, invoice = _finalized(parts, 2)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[1], "goodwill") is StepResult.REVERSED
    [requested] = parts.events(invoice.id, Invoice.CreditRequested)
    assert (requested.transaction_id, requested.amount, requested.reason) == (
        ids[1], 100, "goodwill",
    )  # fmt: skip
    assert _compensated(parts, ids[1]).stripe_reversal_id == f"credit:{ids[1]}"
    assert parts.ledger.line_by_id(line).billed == 200  # the final line is unchanged


def test_a_billed_share_of_0_is_reversed_without_a_credit() -> None:
    parts = Parts()
    # 0.4 cents each: shares 0, 1, 0 of the 1 cent billed.
    ids = reserve(parts.ledger, 3, quantity=1600, meter="gpt-4o.input_tokens")
    line = parts.line(ids[0])
    parts.pusher.push(line)
    invoice = parts.invoice(line)
    invoice.close("deadline")
    pushed = parts.ledger.line_by_id(line)
    invoice.start_finalizing([(line, pushed.sequence, pushed.billed)])
    parts.ledger.save(invoice)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED
    assert parts.events(invoice.id, Invoice.CreditRequested) == []
    assert _compensated(parts, ids[0]).stripe_reversal_id == "billed share 0: nothing to credit"
    assert corrections.reverse(ids[1], "goodwill") is StepResult.REVERSED
    [requested] = parts.events(invoice.id, Invoice.CreditRequested)
    assert (requested.transaction_id, requested.amount) == (ids[1], 1)


def test_reversing_on_a_void_invoice_needs_no_credit() -> None:
    parts = Parts()
    ids, _, invoice = _finalized(parts, 1)
    # finalized, then voided in Stripe
    for status in ("open", "void"):
        view = StripeInvoiceView(
            status=status, number="INV-1", total=100, amount_paid=0, attempt_count=0,
            next_payment_attempt=None, at=NOW, source=f"evt_{status}",
        )  # fmt: skip
        invoice.observe(view)
    parts.ledger.save(invoice)
    assert parts.ledger.invoice_by_id(invoice.id).state is InvoiceState.VOID  # type: ignore[union-attr]
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED
    assert parts.events(invoice.id, Invoice.CreditRequested) == []
    assert _compensated(parts, ids[0]).stripe_reversal_id == "invoice void: nothing to credit"


def test_a_reversal_that_loses_a_race_reloads_and_reverses_on_what_was_saved() -> None:
    parts = Parts()
    ids, line, _ = parts.pushed(2)
    more: list[UUID] = []

    def ingest_meanwhile() -> None:
        more.extend(reserve(parts.ledger, 1, prefix="late"))

    racing = Racing(parts.ledger, ingest_meanwhile, races=1)
    corrections = Corrections(racing, parts.gateway, clock=parts.clock)  # type: ignore[arg-type]
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED
    assert racing.saves == 2
    assert parts.ledger.line_by_id(line).billed == 200  # 2 + 1 late - 1 reversed
    assert parts.ledger.transaction(ids[0]).state is TxnState.COMPENSATED


def test_a_reversal_that_keeps_losing_races_gives_up_after_20_tries_changing_nothing() -> None:
    parts = Parts()
    ids, _, _ = parts.pushed(1)
    limits = iter(range(10**6, 10**6 + 100))

    def limit_set_meanwhile() -> None:  # the account, saved by another writer each time
        parts.ledger.set_spend_limit("acme", "USD", next(limits))

    racing = Racing(parts.ledger, limit_set_meanwhile, races=100)
    corrections = Corrections(racing, parts.gateway, clock=parts.clock)  # type: ignore[arg-type]
    assert corrections.reverse(ids[0], "goodwill") is StepResult.RACED
    assert racing.saves == 20
    assert parts.ledger.transaction(ids[0]).state is TxnState.CHARGED


# -- corrections: adopting transactions from before lines ------------------------------


def test_a_transaction_from_before_lines_is_settled_into_its_periods_line() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy")
    period_line = parts.ledger.line("acme", "USD", "api.requests", DECEMBER)
    assert period_line is not None
    anchor = period_line.id
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.adopt(legacy) is StepResult.SETTLED
    adopted = parts.ledger.transaction(legacy)
    line = parts.ledger.line_by_id(anchor)
    assert (adopted.line_id, adopted.state, adopted.line_version) == (
        anchor, TxnState.RESERVED, line.sequence,
    )  # fmt: skip
    assert (line.transactions, line.billed) == (2, 200)
    assert corrections.adopt(legacy) is StepResult.NOTHING


def test_a_failed_charge_from_before_lines_is_adopted_too() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy")
    txn = parts.ledger.transaction(legacy)
    txn.record_charge_failure("http_503", "down", retryable=True, next_attempt_at=NOW)
    parts.ledger.save(txn)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.adopt(legacy) is StepResult.SETTLED
    assert parts.ledger.transaction(legacy).line_id is not None


def test_a_charged_or_compensated_transaction_from_before_lines_is_not_adopted() -> None:
    parts = Parts()
    charged = _legacy(parts, "charged", charged_as="ii_legacy")
    gone = _legacy(parts, "gone")
    txn = parts.ledger.transaction(gone)
    txn.compensate("dropped")
    parts.ledger.save(txn)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.adopt(charged) is StepResult.NOTHING
    assert corrections.adopt(gone) is StepResult.NOTHING
    assert parts.ledger.transaction(charged).line_id is None
    assert parts.ledger.transaction(gone).line_id is None


def test_an_adoption_that_loses_a_race_settles_into_the_line_as_saved_by_the_other() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy")
    more: list[UUID] = []

    def ingest_meanwhile() -> None:
        more.extend(reserve(parts.ledger, 1, prefix="late"))

    racing = Racing(parts.ledger, ingest_meanwhile, races=1)
    corrections = Corrections(racing, parts.gateway, clock=parts.clock)  # type: ignore[arg-type]
    assert corrections.adopt(legacy) is StepResult.SETTLED
    assert racing.saves == 2
    line = parts.ledger.line_by_id(parts.line(more[0]))
    assert (line.transactions, line.billed) == (3, 300)


def test_an_adoption_that_keeps_losing_races_gives_up_after_20_tries() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy")

    def charge_failed_meanwhile() -> None:  # the transaction, saved by another writer
        txn = parts.ledger.transaction(legacy)
        txn.record_charge_failure("http_503", "down", retryable=True, next_attempt_at=NOW)
        parts.ledger.save(txn)

    racing = Racing(parts.ledger, charge_failed_meanwhile, races=100)
    corrections = Corrections(racing, parts.gateway, clock=parts.clock)  # type: ignore[arg-type]
    assert corrections.adopt(legacy) is StepResult.RACED
    assert racing.saves == 20
    assert parts.ledger.transaction(legacy).line_id is None


def test_a_transaction_of_a_meter_new_to_its_invoice_opens_a_line_on_it() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy", meter="gpt-4o.input_tokens")
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.adopt(legacy) is StepResult.SETTLED
    line_id = parts.ledger.transaction(legacy).line_id
    assert line_id is not None
    line = parts.ledger.line_by_id(line_id)
    invoice = parts.ledger.invoice("acme", "USD", DECEMBER)
    assert invoice is not None and line_id in invoice.lines and len(invoice.lines) == 2
    assert (line.invoice_id, line.meter, line.late_of_start) == (
        invoice.id, "gpt-4o.input_tokens", None,
    )  # fmt: skip


def test_a_transaction_whose_invoice_has_closed_joins_a_late_line_of_the_open_period() -> None:
    parts = Parts()
    legacy = _legacy(parts, "legacy", meter="gpt-4o.input_tokens")
    december = parts.ledger.invoice("acme", "USD", DECEMBER)
    assert december is not None
    december.close("deadline")
    parts.ledger.save(december)
    january = PeriodPolicy().next(DECEMBER)
    february = PeriodPolicy().next(january)
    parts.clock.now = february.start + timedelta(days=3)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.adopt(legacy) is StepResult.SETTLED
    line_id = parts.ledger.transaction(legacy).line_id
    assert line_id is not None
    line = parts.ledger.line_by_id(line_id)
    assert line.late_of_start == DECEMBER.start
    invoice = parts.ledger.invoice("acme", "USD", february)
    assert invoice is not None and invoice.lines == [line_id]
