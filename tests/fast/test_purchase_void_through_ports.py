"""The purchaser's steps through its port, on the real ledger in memory: the draft, its
item and the finalize, each sent with what the steps before recorded, backing off longer
after each failure and looking first after one, a refusal for good making the purchase
unpaid, a step another writer recorded first reloaded; a started top-up bought once.
And the void step: a grant voided while its purchase awaits payment makes the void of
its invoice the next step, sent under the purchase's id; any failure of it (even one
Stripe calls final) is retried with backoff; Stripe's answer ends the purchase unpaid,
or in ``needs attention`` when the invoice was paid, which ``reinstate_purchase``
settles once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from adapters.charging.purchases import Purchaser, PurchaseResult
from domain.account import CustomerAccount
from domain.credits import GrantState
from domain.invoice_states import StripeInvoiceView
from domain.ports import PurchaseInvoice
from domain.purchase import CreditPurchase, PurchaseState, PurchaseStep
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


def _bought(ledger: BillingLedger, clock: Clock) -> UUID:
    """acme's purchased grant ``pack`` (10.00 USD for 9.00), nothing sent yet."""
    ledger.change_account("acme", "USD", lambda a: a.grant_credit(
        "seed", 1, effective_at=clock.now, source="manual", reason="seed"))  # fmt: skip
    bought = ledger.start_purchase("acme", "USD", lambda a: a.purchase_credit(
        "pack", 1000, 900, effective_at=clock.now, reason="pack"))  # fmt: skip
    assert bought is not None
    return bought


def _finalized(ledger: BillingLedger, clock: Clock) -> UUID:
    """acme's purchased grant ``pack`` (10.00 USD for 9.00), its invoice in_1 final."""
    bought = _bought(ledger, clock)
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


# -- the steps before the payment: draft, item, finalize ------------------------------------


class PurchaseStripe:
    """The purchase port scripted step by step: each method answers its next scripted
    answer, and every call is kept with what it was given (``before``: something another
    writer does first, when the named step is called)."""

    def __init__(self, **answers: list[object]) -> None:
        self.answers = answers
        self.calls: list[tuple[object, ...]] = []
        self.before: dict[str, Callable[[], None]] = {}

    def _answer(self, step: str, *call: object) -> object:
        self.calls.append((step, *call))
        if step in self.before:
            self.before.pop(step)()
        return self.answers[step].pop(0)

    def customer(self, customer_id: str, *, look_first: bool) -> object:
        return self._answer("customer", customer_id, look_first)

    def purchase_draft(self, purchase: PurchaseInvoice, *, look_first: bool) -> object:
        return self._answer("draft", purchase, look_first)

    def purchase_item(
        self, purchase: PurchaseInvoice, stripe_invoice_id: str, *, look_first: bool
    ) -> object:
        return self._answer("item", purchase, stripe_invoice_id, look_first)

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool
    ) -> object:
        return self._answer("finalize", stripe_invoice_id, invoice_id, look_first)


def _steps(ledger: BillingLedger, stripe: PurchaseStripe, clock: Clock) -> Purchaser:
    """A purchaser whose backoff doubles from 10 s, half of each drawn (5 s, then 10 s)."""
    policy = RetryPolicy(base_delay=timedelta(seconds=10), max_delay=timedelta(seconds=100))
    return Purchaser(ledger, stripe, policy, clock=clock, jitter=lambda: 0.5)  # type: ignore[arg-type]


def _call(bought: UUID, step: str, *, look_first: bool) -> tuple[object, ...]:
    """The call of ``step`` for acme's ``pack``, made by Stripe's ``cus_1`` and ``in_1``:
    the invoice each sends carries the customer the draft step recorded."""
    invoice = PurchaseInvoice(bought, "acme", "cus_1", "USD", "pack", 1000, 900)
    args = {"customer": ("acme",), "draft": (invoice,), "item": (invoice, "in_1"),
            "finalize": ("in_1", bought)}[step]  # fmt: skip
    return (step, *args, look_first)


def _events(ledger: BillingLedger, bought: UUID, kind: type) -> list[dict[str, object]]:
    skip = {"originator_id", "originator_version", "timestamp"}
    return [
        {k: v for k, v in e.__dict__.items() if k not in skip}
        for e in ledger.events.get(bought)
        if isinstance(e, kind)
    ]


def test_each_step_is_sent_with_what_the_steps_before_recorded_then_it_waits() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _bought(ledger, clock)
    stripe = PurchaseStripe(
        customer=["cus_1"], draft=["in_1"], item=["ii_1"], finalize=[_view("open")]
    )
    assert _steps(ledger, stripe, clock).step(bought) is PurchaseResult.WAITING
    steps = ("customer", "draft", "item", "finalize")
    assert stripe.calls == [_call(bought, step, look_first=False) for step in steps]
    assert _state(ledger, bought) == (S.FINALIZED, PurchaseStep.NONE, 0)


def test_each_failed_step_backs_off_longer_each_time_then_is_sent_looking_first() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _bought(ledger, clock)
    down = ChargeFailure("http_502", "bad gateway", retryable=True)
    stripe = PurchaseStripe(
        customer=[down, "cus_1", "cus_1"], draft=[down, "in_1"], item=[down, "ii_1"],
        finalize=[down, _view("open")],
    )  # fmt: skip
    purchaser = _steps(ledger, stripe, clock)
    due = []
    for step in ("customer", "draft", "item", "finalize"):
        assert purchaser.step(bought) is PurchaseResult.FAILED
        purchase = ledger.purchase_by_id(bought)
        assert purchase is not None and purchase.next_attempt_at is not None
        assert purchase.reason.startswith(f"{'draft' if step == 'customer' else step}: http_502")
        due.append((purchase.next_attempt_at - clock.now).total_seconds())
        clock.now = purchase.next_attempt_at
    assert due == [5, 10, 20, 40]  # attempts 1 to 4: half of 10 s doubled each time
    assert purchaser.step(bought) is PurchaseResult.WAITING
    first, *then = ["customer", "customer", "draft", "customer", "draft", *["item"] * 2,
                    *["finalize"] * 2]  # fmt: skip
    assert stripe.calls == [
        _call(bought, first, look_first=False),
        *(_call(bought, step, look_first=True) for step in then),  # after a failure
    ]
    assert _state(ledger, bought) == (S.FINALIZED, PurchaseStep.NONE, 4)


def test_a_step_stripe_refuses_for_good_makes_the_purchase_unpaid_and_voids_its_grant() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _bought(ledger, clock)
    refused = ChargeFailure("http_400", "no such price", retryable=False)
    stripe = PurchaseStripe(customer=["cus_1"], draft=["in_1"], item=[refused])
    assert _steps(ledger, stripe, clock).step(bought) is PurchaseResult.DONE
    assert _state(ledger, bought) == (S.UNPAID, PurchaseStep.NONE, 0)
    assert _events(ledger, bought, CreditPurchase.Unpaid) == [
        {"status": "refused", "reason": "Stripe refused its item: http_400: no such price",
         "source": "purchaser"},
    ]  # fmt: skip
    account = ledger.account("acme", "USD")
    assert account is not None and account.grants["pack"].state is GrantState.UNPAID


def test_a_step_another_writer_recorded_first_is_reloaded_and_the_next_one_sent() -> None:
    ledger, clock = memory_ledger(), Clock()
    bought = _bought(ledger, clock)
    stripe = PurchaseStripe(
        customer=["cus_1"], draft=["in_1"], item=["ii_1"], finalize=[_view("open")]
    )

    def the_other_purchaser() -> None:
        purchase = ledger.purchase_by_id(bought)
        assert purchase is not None
        purchase.record_draft("in_1", "cus_1")
        ledger.save_purchase(purchase)

    stripe.before["draft"] = the_other_purchaser
    assert _steps(ledger, stripe, clock).step(bought) is PurchaseResult.WAITING
    assert [call[0] for call in stripe.calls] == ["customer", "draft", "item", "finalize"]
    assert len(_events(ledger, bought, CreditPurchase.DraftCreated)) == 1


def test_a_started_top_up_is_bought_once_effective_when_the_worker_records_it() -> None:
    ledger, clock = memory_ledger(), Clock()
    ledger.change_account("acme", "USD", lambda a: a.grant_credit(
        "seed", 100, effective_at=clock.now, source="manual", reason="seed"))  # fmt: skip

    def start(account: CustomerAccount) -> UUID | None:
        account.set_top_up(500, 2000, 1800)  # armed, and 100 is below 500
        return account.check_top_up(account.live_credit(clock.now), clock.now)

    started = ledger.change_account("acme", "USD", start)
    assert started is not None
    (grant_id,) = ledger.account("acme", "USD").top_up_requests  # type: ignore[union-attr]
    clock.now += timedelta(minutes=1)
    purchaser = _steps(ledger, PurchaseStripe(), clock)
    assert purchaser.start_top_up("acme", "USD", grant_id) == started
    assert purchaser.start_top_up("acme", "USD", grant_id) is None  # bought already
    purchase = ledger.purchase_by_id(started)
    assert purchase is not None
    assert (purchase.grant_id, purchase.amount, purchase.price) == (grant_id, 2000, 1800)
    account = ledger.account("acme", "USD")
    assert account is not None
    grant = account.grants[grant_id]
    assert (grant.amount, grant.effective_at, grant.purchase_id) == (2000, clock.now, str(started))
