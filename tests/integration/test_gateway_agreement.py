"""The fake Stripe behind the ports agrees with Stripe: one table of cases, each run
through the ``PaymentGateway`` port against ``tests.fast.fakes.FakeGateway`` and against
the real ``StripeGateway`` over HTTP to the emulator. What the fast tests rely on the
fake for (keys replayed, other parameters refused, objects that must exist, items frozen
once final, credit notes bounded) is what the real client meets."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.periods import Period
from domain.ports import CreditNote, DraftInvoice, LineItems, PaymentGateway
from domain.pushing import ItemStep, PushPlan
from domain.saga import ChargeFailure
from domain.verification import DraftView
from infra.stripe_emulator import StripeEmulator
from tests.fast.fakes import Clock, FakeGateway

pytestmark = pytest.mark.integration

PERIOD = Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


@dataclass
class Stripe:
    """A gateway and the ledger ids its objects are made for."""

    gateway: PaymentGateway
    invoice_id: UUID
    line_id: UUID
    forget_keys: Callable[[], None]  # let every key used so far expire

    def customer(self) -> str:
        found = self.gateway.customer(f"agree-{self.invoice_id}", look_first=False)
        assert isinstance(found, str), found
        return found

    def draft(self, customer: str) -> str:
        draft = DraftInvoice(self.invoice_id, "acme", customer, "USD", PERIOD)
        made = self.gateway.draft_invoice(draft, look_first=False)
        assert isinstance(made, str), made
        return made

    def push(
        self, customer: str, invoice: str, sequence: int, amount: int, item: str | None = None
    ) -> list[str] | ChargeFailure:
        step = (
            ItemStep(0, amount, None, sequence, amount)
            if item is None
            else ItemStep(0, amount, item, update=True)
        )
        plan = PushPlan(sequence, amount, (step,), ((0, sequence, amount),) if item is None else ())
        items = LineItems(
            self.line_id, "api.requests", PERIOD, customer, invoice, "USD", plan, False
        )
        return self.gateway.set_line_items(items)


# Keys live this long in both (Stripe: at least 24 hours), so that a case can outlive one.
KEY_TTL_S = 1.0


@pytest.fixture(params=["fake", "emulator"])
def stripe(request: pytest.FixtureRequest) -> Iterator[Stripe]:
    if request.param == "fake":
        clock = Clock()

        def later() -> None:
            clock.now += timedelta(seconds=KEY_TTL_S + 1)

        fake = FakeGateway(key_ttl=timedelta(seconds=KEY_TTL_S), clock=clock)
        yield Stripe(fake, uuid4(), uuid4(), later)
        return
    with StripeEmulator(port=0, key_ttl_s=KEY_TTL_S) as emulator:
        gateway = StripeGateway(StripeSettings(api_base=emulator.url, timeout_s=5.0))

        def expired() -> None:
            # The emulator's keys expire on its own clock: wait it out (no condition to
            # poll that would not itself use a key).
            time.sleep(KEY_TTL_S + 0.2)

        yield Stripe(gateway, uuid4(), uuid4(), expired)


def _refused(answer: object) -> bool:
    """A permanent refusal, as both report it (never retried, never an object)."""
    return isinstance(answer, ChargeFailure) and not answer.retryable


def test_creates_are_replayed_by_their_keys(stripe: Stripe) -> None:
    customer = stripe.customer()
    assert stripe.customer() == customer
    invoice = stripe.draft(customer)
    assert stripe.draft(customer) == invoice
    [item] = stripe.push(customer, invoice, 1, 100)  # type: ignore[misc]
    assert stripe.push(customer, invoice, 1, 100) == [item]  # the same creation, replayed


def test_a_create_repeated_after_its_key_expired_makes_a_second_object(stripe: Stripe) -> None:
    # Why the pusher looks a planned item up before creating it past the key window.
    customer = stripe.customer()
    invoice = stripe.draft(customer)
    [item] = stripe.push(customer, invoice, 1, 100)  # type: ignore[misc]
    stripe.forget_keys()
    [again] = stripe.push(customer, invoice, 1, 100)  # type: ignore[misc]
    assert again != item
    view = stripe.gateway.read_draft(invoice)
    assert isinstance(view, DraftView) and view.total == 200  # Stripe holds both


def test_a_key_used_again_with_other_parameters_is_refused(stripe: Stripe) -> None:
    customer = stripe.customer()
    invoice = stripe.draft(customer)
    [item] = stripe.push(customer, invoice, 1, 100)  # type: ignore[misc]
    assert stripe.push(customer, invoice, 2, 200, item) == [item]
    assert _refused(stripe.push(customer, invoice, 2, 250, item))  # sequence 2's key, other amount
    view = stripe.gateway.read_draft(invoice)
    assert isinstance(view, DraftView) and view.total == 200


def test_a_draft_for_an_unknown_customer_is_refused(stripe: Stripe) -> None:
    draft = DraftInvoice(stripe.invoice_id, "acme", "cus_nobody", "USD", PERIOD)
    assert _refused(stripe.gateway.draft_invoice(draft, look_first=False))


def test_items_of_a_finalized_invoice_are_frozen_and_its_total_is_final(stripe: Stripe) -> None:
    customer = stripe.customer()
    invoice = stripe.draft(customer)
    [item] = stripe.push(customer, invoice, 1, 300)  # type: ignore[misc]
    final = stripe.gateway.finalize_invoice(invoice, stripe.invoice_id, look_first=False)
    assert not isinstance(final, ChargeFailure) and (final.status, final.total) == ("open", 300)
    again = stripe.gateway.finalize_invoice(invoice, stripe.invoice_id, look_first=True)
    assert not isinstance(again, ChargeFailure) and again.number == final.number
    assert _refused(stripe.push(customer, invoice, 2, 400, item))
    view = stripe.gateway.read_draft(invoice)
    assert isinstance(view, DraftView) and (view.status, view.total) == ("open", 300)


def test_credit_notes_are_bounded_by_what_the_invoice_can_still_be_credited(
    stripe: Stripe,
) -> None:
    customer = stripe.customer()
    invoice = stripe.draft(customer)
    stripe.push(customer, invoice, 1, 300)
    stripe.gateway.finalize_invoice(invoice, stripe.invoice_id, look_first=False)

    def note(amount: int) -> Callable[[], object]:
        credit = CreditNote(stripe.invoice_id, invoice, uuid4(), amount, False, "reversal")
        return lambda: stripe.gateway.credit_note(credit)

    assert isinstance(note(200)(), str)
    assert _refused(note(150)())  # only 100 left to credit
    assert isinstance(note(100)(), str)
