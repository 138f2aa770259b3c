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
from domain.ports import (
    AddedItems,
    CreditNote,
    DraftInvoice,
    LineItems,
    LinesAdd,
    LinesUpdate,
    PaymentGateway,
)
from domain.pushing import (
    MAX_LINES_PER_UPDATE,
    ItemStep,
    LineAdd,
    LinePart,
    LineSet,
    PushPlan,
)
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

    def lines(self, count: int) -> tuple[str, list[tuple[UUID, str]]]:
        """A draft with ``count`` lines of one item each (100, 101, ...): the draft and
        each line with its item."""
        customer = self.customer()
        invoice = self.draft(customer)
        made: list[tuple[UUID, str]] = []
        for n in range(count):
            line = uuid4()
            step = ItemStep(0, 100 + n, None, 1, 100 + n)
            plan = PushPlan(1, 100 + n, (step,), ((0, 1, 100 + n),))
            items = LineItems(line, "api.requests", PERIOD, customer, invoice, "USD", plan, False)
            [item] = self.gateway.set_line_items(items)  # type: ignore[misc]
            made.append((line, item))
        return invoice, made

    def update(
        self, invoice: str, sets: list[tuple[UUID, str, int]], sequence: int = 2
    ) -> ChargeFailure | None:
        """One bulk update: each (line, line item, amount) at ``sequence``."""
        parts = tuple(
            LinePart(line, PushPlan(sequence, amount, (), ()),
                     (LineSet(line, 0, named, amount, sequence),))
            for line, named, amount in sets
        )  # fmt: skip
        return self.gateway.update_lines(LinesUpdate(self.invoice_id, invoice, parts))

    def add(
        self, customer: str, invoice: str, adds: tuple[LineAdd, ...], *, look_first: bool = False
    ) -> AddedItems | ChargeFailure:
        """One ``add_lines`` request of new lines."""
        add = LinesAdd(self.invoice_id, invoice, customer, "USD", adds, look_first)
        return self.gateway.add_lines(add)

    def total(self, invoice: str) -> int:
        view = self.gateway.read_draft(invoice)
        assert isinstance(view, DraftView), view
        return view.total


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


# -- a draft's lines set together (update_lines) ---------------------------------------


def _named(stripe: Stripe, invoice: str) -> dict[str, str]:
    named = stripe.gateway.line_items(invoice)
    assert isinstance(named, dict), named
    return named


def test_a_drafts_lines_are_set_together_by_the_line_items_stripe_named(stripe: Stripe) -> None:
    invoice, made = stripe.lines(3)
    named = _named(stripe, invoice)
    assert set(named) == {item for _, item in made}
    # Stripe's own ids: not the items', and nothing a client could derive from them
    assert all(v.startswith("il_") and v[3:] != k[3:] for k, v in named.items())
    sets = [(line, named[item], 500 + n) for n, (line, item) in enumerate(made)]
    assert stripe.update(invoice, sets) is None
    assert stripe.total(invoice) == 500 + 501 + 502
    assert stripe.update(invoice, sets) is None  # the same request, replayed by its key
    assert stripe.total(invoice) == 1503


def test_a_bulk_update_naming_an_item_or_an_unknown_line_sets_nothing(stripe: Stripe) -> None:
    invoice, made = stripe.lines(2)
    named = _named(stripe, invoice)
    (a, item_a), (b, item_b) = made
    assert _refused(stripe.update(invoice, [(a, named[item_a], 900), (b, item_b, 900)]))
    assert _refused(stripe.update(invoice, [(a, named[item_a], 900), (b, "il_nope", 900)], 3))
    assert stripe.total(invoice) == 201  # neither line was set


def test_a_bulk_update_of_a_finalized_invoice_is_refused(stripe: Stripe) -> None:
    invoice, made = stripe.lines(1)
    [(line, item)] = made
    named = _named(stripe, invoice)
    stripe.gateway.finalize_invoice(invoice, stripe.invoice_id, look_first=False)
    assert _refused(stripe.update(invoice, [(line, named[item], 700)]))
    assert stripe.total(invoice) == 100


def test_a_bulk_update_of_more_lines_than_the_bound_is_refused(stripe: Stripe) -> None:
    invoice, made = stripe.lines(MAX_LINES_PER_UPDATE + 1)
    named = _named(stripe, invoice)
    sets = [(line, named[item], 1) for line, item in made]
    assert _refused(stripe.update(invoice, sets))
    assert stripe.update(invoice, sets[:MAX_LINES_PER_UPDATE]) is None
    assert stripe.total(invoice) == MAX_LINES_PER_UPDATE + (100 + MAX_LINES_PER_UPDATE)


# -- a draft's new lines made together (add_lines) -------------------------------------


def _new(count: int) -> tuple[LineAdd, ...]:
    """``count`` new lines of one item each (100, 101, ...), planned at sequence 1."""
    return tuple(
        LineAdd(uuid4(), "api.requests", str(PERIOD), ((0, 1, 100 + n),)) for n in range(count)
    )


def _made(stripe: Stripe, count: int) -> tuple[str, str, tuple[LineAdd, ...], AddedItems]:
    """A draft with ``count`` new lines made together: its customer, the draft, the lines
    and what was made."""
    customer = stripe.customer()
    invoice = stripe.draft(customer)
    adds = _new(count)
    made = stripe.add(customer, invoice, adds)
    assert isinstance(made, dict), made
    return customer, invoice, adds, made


def test_new_lines_are_made_together_named_as_update_lines_takes_them_and_replayed(
    stripe: Stripe,
) -> None:
    customer, invoice, adds, made = _made(stripe, 3)
    assert set(made) == {(a.line_id, 0) for a in adds}
    assert stripe.total(invoice) == 100 + 101 + 102
    assert _named(stripe, invoice) == {item: named for item, named in made.values()}
    assert stripe.add(customer, invoice, adds) == made  # the same request, replayed
    assert stripe.total(invoice) == 303
    sets = [(a.line_id, str(made[a.line_id, 0][1]), 7) for a in adds]
    assert stripe.update(invoice, sets) is None and stripe.total(invoice) == 21


def test_new_lines_on_a_finalized_invoice_are_refused_and_none_is_made(stripe: Stripe) -> None:
    customer, invoice, _, _ = _made(stripe, 1)
    stripe.gateway.finalize_invoice(invoice, stripe.invoice_id, look_first=False)
    assert _refused(stripe.add(customer, invoice, _new(2)))
    assert stripe.total(invoice) == 100


def test_new_lines_repeated_past_their_key_are_found_when_looked_for_first(
    stripe: Stripe,
) -> None:
    customer, invoice, adds, made = _made(stripe, 2)
    stripe.forget_keys()
    found = stripe.add(customer, invoice, adds, look_first=True)
    assert isinstance(found, dict), found
    assert {k: item for k, (item, _) in found.items()} == {k: i for k, (i, _) in made.items()}
    assert stripe.total(invoice) == 201  # nothing made twice
    more = (*adds, *_new(1))
    grown = stripe.add(customer, invoice, more, look_first=True)  # the rest made, once
    assert isinstance(grown, dict) and len(grown) == 3
    assert stripe.total(invoice) == 301
