"""The purchaser's void step through its port, on the real ledger in memory: a grant
voided while its purchase awaits payment makes the void of its invoice the next step,
sent under the purchase's id; any failure of it (even one Stripe calls final) is retried
with backoff; Stripe's answer ends the purchase unpaid, or in ``needs attention`` when
the invoice was paid, which ``reinstate_purchase`` settles once."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from adapters.charging.purchases import Purchaser, PurchaseResult
from domain.credits import GrantState
from domain.invoice_states import StripeInvoiceView
from domain.purchase import PurchaseState, PurchaseStep
from domain.saga import ChargeFailure, RetryPolicy
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, memory_ledger

S = PurchaseState


class VoidingStripe:
    """The purchase port with only the void scripted (the invoice exists already)."""

    def __init__(self, *answers: StripeInvoiceView | ChargeFailure) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, UUID]] = []

    def void_purchase_invoice(
        self, stripe_invoice_id: str, purchase_id: UUID
    ) -> StripeInvoiceView | ChargeFailure:
        self.calls.append((stripe_invoice_id, purchase_id))
        return self.answers.pop(0)

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the void step sends nothing but the void ({name})")


def _view(status: str, paid: int = 0) -> StripeInvoiceView:
    return StripeInvoiceView(status, "N-1", 900, paid, 1, None, T0, "void")


def _finalized(ledger: BillingLedger, clock: Clock) -> UUID:
    """acme's purchased grant ``pack`` (10.00 USD for 9.00), its invoice in_1 final."""
    ledger.change_account("acme", "USD", lambda a: a.grant_credit(
        "seed", 1, effective_at=clock.now, source="manual", reason="seed"))  # fmt: skip
    bought = ledger.start_purchase("acme", "USD", lambda a: a.purchase_credit(
        "pack", 1000, 900, effective_at=clock.now, reason="pack"))  # fmt: skip
    assert bought is not None
    purchase = ledger.purchase_by_id(bought)
    assert purchase is not None
    purchase.record_draft("in_1", "cus_1")
    purchase.record_item("ii_1")
    purchase.observe(_view("open"))
    ledger.save_purchase(purchase)
    return bought


def _purchaser(ledger: BillingLedger, stripe: VoidingStripe, clock: Clock) -> Purchaser:
    policy = RetryPolicy(base_delay=timedelta(seconds=10), max_delay=timedelta(seconds=10))
    return Purchaser(ledger, stripe, policy, clock=clock, jitter=lambda: 0.0)  # type: ignore[arg-type]


def _state(ledger: BillingLedger, bought: UUID) -> tuple[PurchaseState, PurchaseStep, int]:
    purchase = ledger.purchase_by_id(bought)
    assert purchase is not None
    return purchase.state, purchase.next_step, purchase.attempts


@pytest.mark.parametrize("retryable", [True, False])
def test_the_void_is_retried_with_backoff_whatever_the_failure_then_recorded(
    retryable: bool,
) -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _finalized(ledger, clock)
    assert ledger.void_grant("acme", "USD", "pack", "sold in error") == (Decimal(1000), bought)
    assert _state(ledger, bought) == (S.VOIDING, PurchaseStep.VOID, 0)
    failure = ChargeFailure("http_400" if not retryable else "http_502", "no", retryable)
    stripe = VoidingStripe(failure, _view("void"))
    purchaser = _purchaser(ledger, stripe, clock)
    assert purchaser.step(bought) is PurchaseResult.FAILED
    purchase = ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is S.VOIDING
    assert purchase.attempts == 1 and purchase.reason == f"void: {failure.error_class}: no"
    assert purchase.next_attempt_at is not None and purchase.next_attempt_at > clock.now
    assert purchaser.step(bought) is PurchaseResult.WAITING  # not due yet: nothing sent
    assert stripe.calls == [("in_1", bought)]
    clock.now = purchase.next_attempt_at
    assert purchaser.step(bought) is PurchaseResult.DONE
    assert stripe.calls == [("in_1", bought)] * 2
    assert _state(ledger, bought)[0] is S.UNPAID
    account = ledger.account("acme", "USD")
    assert account is not None and account.grants["pack"].state is GrantState.UNPAID


def test_a_paid_answer_needs_attention_and_reinstating_settles_it_once() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _finalized(ledger, clock)
    ledger.void_grant("acme", "USD", "pack", "sold in error")
    stripe = VoidingStripe(_view("paid", paid=900))
    assert _purchaser(ledger, stripe, clock).step(bought) is PurchaseResult.DONE
    assert _state(ledger, bought)[:2] == (S.NEEDS_ATTENTION, PurchaseStep.NONE)
    assert ledger.reinstate_purchase("acme", "USD", "pack", "paid", clock.now) == (
        "pack-reinstated", True,
    )  # fmt: skip
    assert ledger.reinstate_purchase("acme", "USD", "pack", "again", clock.now) == (
        "pack-reinstated", False,
    )  # fmt: skip
    account = ledger.account("acme", "USD")
    assert account is not None and account.live_credit(clock.now + timedelta(seconds=1)) == 1001
    with pytest.raises(ValueError, match="no purchased grant seed"):
        ledger.reinstate_purchase("acme", "USD", "seed", "r", clock.now)
    with pytest.raises(ValueError, match="no purchased grant pack for nobody"):
        ledger.reinstate_purchase("nobody", "USD", "pack", "r", clock.now)


def test_voiding_a_grant_without_a_pending_purchase_drives_nothing() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _finalized(ledger, clock)
    assert ledger.void_grant("acme", "USD", "seed", "r") == (Decimal(1), None)
    assert _state(ledger, bought)[0] is S.FINALIZED
    with pytest.raises(ValueError, match="no grant pack for nobody in USD"):
        ledger.void_grant("nobody", "USD", "pack", "r")
