"""The closer's every step pinned through its ports: the in-memory ledger, the strict
fake Stripe, a fixed clock and a fixed jitter, so each answer (result, state, requests,
due time) and each record it leaves is asserted exactly.

Each test builds one invoice of one customer (a line of 100 per record, a second line
of 25 where two lines matter), pushed to Stripe before its close deadline, and drives
it with ``InvoiceCloser.step`` as the reconciler and the CLI do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.persistence import IntegrityError

from adapters.charging.closer import MAX_REPAIRS, CloseResult, CloseStep, InvoiceCloser
from adapters.charging.corrections import Corrections
from adapters.charging.pusher import LinePusher
from adapters.settings import Settings
from domain.invoice import Invoice
from domain.invoice_line import LinePush
from domain.invoice_states import InvoiceState, StripeInvoiceView
from domain.periods import PeriodPolicy
from domain.ports import ItemRepair
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.verification import LandingWindow
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))
GRACE = timedelta(hours=1)
DEADLINE = PeriodPolicy().period_of(T0).end + GRACE
LANDING = LandingWindow(per_call=timedelta(seconds=20), margin=timedelta(seconds=7))
HALF_S = timedelta(milliseconds=500)  # backoff of attempt 1 at jitter 0.5 (base 1 s)
ONE_S = timedelta(seconds=1)  # ... of attempt 2
FIN = InvoiceState.FINALIZING
S = CloseResult

_PRICES = Settings().load_prices()


class Ledger(BillingLedger):
    """The in-memory ledger, able to lose the version race the way a second writer
    makes it lose: ``before_save`` runs just before each save it is set for
    (another closer's step, say); past ``saves_left`` saves every save loses."""

    def __init__(self) -> None:
        super().__init__(_PRICES, env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
        self.before_save: list[Any] = []
        self.saves_left: int | None = None
        self.refused = 0

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        if self.saves_left is not None:
            if self.saves_left == 0:
                self.refused += 1
                raise IntegrityError("another writer recorded first")
            self.saves_left -= 1
        if self.before_save:
            self.before_save.pop(0)()
        return super().save(*objs, **kwargs)


@dataclass
class Stripe(FakeGateway):
    """The strict fake Stripe, also keeping what the closer asked of it: whether each
    finalize looked first, and the repairs it was sent. ``undo_repairs``: Stripe
    acknowledges each repair and keeps the old amount (a process of the customer's
    that keeps setting it back). ``finalize_failures``, ``repair_failures``: answer
    the next finalize, the next repair call only (the read before it succeeds)."""

    looked_first: list[bool] = field(default_factory=list)
    repairs_sent: list[ItemRepair] = field(default_factory=list)
    undo_repairs: bool = False
    finalize_failures: list[ChargeFailure] = field(default_factory=list)
    repair_failures: list[ChargeFailure] = field(default_factory=list)

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool, draft: int = 1
    ) -> StripeInvoiceView | ChargeFailure:
        self.looked_first.append(look_first)
        if self.finalize_failures:
            self.calls.append("finalize")
            return self.finalize_failures.pop(0)
        return super().finalize_invoice(
            stripe_invoice_id, invoice_id, look_first=look_first, draft=draft
        )

    def repair_items(self, repairs: Sequence[ItemRepair]) -> ChargeFailure | None:
        self.repairs_sent += repairs
        if self.repair_failures:
            self.calls.append("repair")
            return self.repair_failures.pop(0)
        if self.undo_repairs:
            self.calls += ["repair"] * len(repairs)
            return None
        return super().repair_items(repairs)


class Parts:
    """One ledger, one Stripe, a pusher and a closer sharing a clock at the deadline."""

    def __init__(self, *, verify: bool = True, hand_over: bool = True) -> None:
        self.ledger = Ledger()
        self.clock = Clock(DEADLINE - timedelta(hours=2))
        self.stripe = Stripe(clock=self.clock)
        self.pusher = LinePusher(
            self.ledger, self.stripe, POLICY, clock=self.clock, jitter=lambda: 0.5, landing=LANDING
        )
        self.handed: list[tuple[UUID, str]] = []
        self.closer = InvoiceCloser(
            self.ledger, self.stripe, self._hand_over if hand_over else None, POLICY, GRACE,
            clock=self.clock, jitter=lambda: 0.5, landing=LANDING, verify=verify,
        )  # fmt: skip
        self.lines: list[UUID] = []
        self.txns: list[UUID] = []

    def _hand_over(self, line: UUID, customer: str) -> None:
        self.handed.append((line, customer))

    def bill(self, *, two_lines: bool = False, records: int = 1) -> Parts:
        """A line of 100 per record (and one of 25), pushed to Stripe while the invoice
        is open."""
        self.txns = reserve(self.ledger, records, quantity=1000, prefix="r")  # 100 each
        if two_lines:
            self.txns += reserve(
                self.ledger, 1, quantity=100000, meter="gpt-4o.input_tokens", prefix="t"
            )  # 25
        self.lines = [self.ledger.transaction(t).line_id for t in self.txns]  # type: ignore[misc]
        for line in self.lines:
            self.pusher.push(line)
        return self

    @property
    def id(self) -> UUID:
        return self.ledger.line_by_id(self.lines[0]).invoice_id

    def invoice(self) -> Invoice:
        found = self.ledger.invoice_by_id(self.id)
        assert found is not None
        return found

    def step(self, **kwargs: Any) -> CloseStep:
        return self.closer.step(self.id, **kwargs)

    def closed(self) -> Parts:
        """At the deadline: closed, its frozen lines pushed again (nothing sent)."""
        self.clock.now = DEADLINE
        assert self.step() == CloseStep(S.WAITING, InvoiceState.CLOSED)
        for line in self.lines:
            self.pusher.push(line)
        return self

    def events(self, kind: type) -> list[Any]:
        return [e for e in self.ledger.events.get(self.id) if isinstance(e, kind)]

    def item(self, line: UUID) -> str:
        push = self.ledger.line_push(line)
        assert push is not None
        [item] = push.item_ids
        return item

    def edit(self, line: UUID, amount: int) -> None:
        """The item's amount changed in Stripe behind the ledger's back."""
        self.stripe.items[self.item(line)]["amount"] = amount

    def sequence(self, line: UUID) -> int:
        return self.ledger.line_by_id(line).sequence

    def final(self) -> Parts:
        """Closed, verified and finalized at the deadline."""
        self.closed()
        assert self.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)
        return self


def _failure(**kwargs: Any) -> ChargeFailure:
    """Stripe's 503: retryable, and (unless ``answered``) maybe applied later."""
    return ChargeFailure("http_503", "down", retryable=True, **kwargs)


# -- the answer's shape -------------------------------------------------------------------


def test_an_invoice_the_ledger_does_not_hold_is_done_with_nothing_sent() -> None:
    parts = Parts()
    assert parts.closer.step(uuid4()) == CloseStep(S.DONE, None, 0, None)
    assert parts.stripe.calls == []


def test_the_results_read_as_the_cli_prints_them() -> None:
    assert [str(r) for r in CloseResult] == [
        "not_due", "waiting", "progressed", "failed", "attention", "done", "raced",
    ]  # fmt: skip


# -- closing ------------------------------------------------------------------------------


def test_an_open_invoice_is_not_due_before_its_deadline_and_closes_exactly_at_it() -> None:
    parts = Parts().bill()
    parts.clock.now = DEADLINE - timedelta(microseconds=1)
    assert parts.step() == CloseStep(S.NOT_DUE, InvoiceState.OPEN, 0, DEADLINE)
    assert parts.invoice().state is InvoiceState.OPEN
    assert not parts.ledger.line_by_id(parts.lines[0]).frozen

    parts.clock.now = DEADLINE
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.CLOSED, 0, None)
    [closed] = parts.events(Invoice.Closed)
    assert (closed.reason, closed.lines) == ("period ended", [str(parts.lines[0])])
    assert parts.ledger.line_by_id(parts.lines[0]).frozen
    assert parts.stripe.calls.count("finalize") == 0


def test_an_operator_closes_an_invoice_before_its_deadline_with_their_reason() -> None:
    parts = Parts().bill(two_lines=True)
    assert parts.step(close_now="customer churned") == CloseStep(S.WAITING, InvoiceState.CLOSED)
    [closed] = parts.events(Invoice.Closed)
    assert closed.reason == "customer churned"
    assert all(parts.ledger.line_by_id(line).frozen for line in parts.lines)


def test_a_closed_invoice_hands_each_line_not_final_in_stripe_over_with_its_customer() -> None:
    parts = Parts().bill(two_lines=True)
    parts.clock.now = DEADLINE
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.CLOSED)
    assert parts.handed == [(line, "acme") for line in parts.lines]
    parts.pusher.push(parts.lines[0])
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.CLOSED)
    assert parts.handed[2:] == [(parts.lines[1], "acme")]  # only the line still waiting


def test_a_closer_with_nobody_to_hand_lines_to_waits_for_them() -> None:
    parts = Parts(hand_over=False).bill()
    parts.clock.now = DEADLINE
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.CLOSED)
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.CLOSED)
    parts.pusher.push(parts.lines[0])
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)


def test_finalizing_starts_with_every_lines_final_total_and_seals_every_push() -> None:
    parts = Parts().bill(two_lines=True).closed()
    parts.stripe.failures.append(_failure())  # the read back fails: stops at finalizing
    assert parts.step() == CloseStep(S.FAILED, FIN, 1, DEADLINE + HALF_S)
    invoice = parts.invoice()
    assert invoice.expected_total == 125
    assert invoice.final_sequences == {str(line): parts.sequence(line) for line in parts.lines}
    for line in parts.lines:
        push = parts.ledger.line_push(line)
        assert push is not None and push.sealed
        [sealed] = [e for e in parts.ledger.events.get(push.id) if isinstance(e, LinePush.Sealed)]
        assert sealed.invoice_id == parts.id
    assert len(parts.events(Invoice.FinalizeStarted)) == 1


def test_an_invoice_with_nothing_billed_and_no_draft_closes_as_nothing_due() -> None:
    parts = Parts()
    parts.txns = reserve(parts.ledger, 1, quantity=1, meter="gpt-4o.input_tokens")
    parts.lines = [parts.ledger.transaction(parts.txns[0]).line_id]  # type: ignore[list-item]
    parts.pusher.push(parts.lines[0])
    parts.closed()
    assert parts.step() == CloseStep(S.DONE, InvoiceState.NOTHING_DUE)
    assert parts.stripe.calls == []


def test_an_invoice_billed_without_a_recorded_draft_is_never_closed_as_nothing_due() -> None:
    parts = Parts()
    parts.txns = reserve(parts.ledger, 1, quantity=1000)  # 100
    parts.txns += reserve(parts.ledger, 1, quantity=1, meter="gpt-4o.input_tokens", prefix="t")
    billed, nothing = parts.lines = [parts.ledger.transaction(t).line_id for t in parts.txns]  # type: ignore[misc]
    parts.clock.now = DEADLINE
    parts.step()  # closed
    parts.pusher.push(nothing)  # bills 0: no draft needed
    frozen = parts.ledger.line_by_id(billed)
    push = LinePush(line_id=billed)  # Stripe holds it, but the draft was never recorded
    push.record_pushed(frozen.sequence, 100, [100], ["ii_lost"], "in_lost")
    push.record_charges(frozen.sequence, 1)
    parts.ledger.save(push)
    assert parts.step() == CloseStep(S.RACED)
    assert parts.invoice().state is InvoiceState.CLOSED
    assert parts.stripe.calls == []


# -- racing another writer ----------------------------------------------------------------


def test_a_step_that_loses_the_race_to_another_closer_reloads_and_records_nothing_twice() -> None:
    parts = Parts().bill().closed()
    other = InvoiceCloser(
        parts.ledger, parts.stripe, None, POLICY, GRACE, clock=parts.clock, jitter=lambda: 0.5
    )
    parts.ledger.before_save.append(lambda: other.step(parts.id))  # finalizes it meanwhile
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 0)
    assert len(parts.events(Invoice.FinalizeStarted)) == 1
    assert len(parts.events(Invoice.Finalized)) == 1
    assert parts.stripe.calls.count("finalize") == 1


def test_a_step_that_loses_every_race_gives_up_after_twenty_tries_counting_what_it_recorded() -> (
    None
):
    parts = Parts().bill().closed()
    parts.ledger.saves_left = 1  # FinalizeStarted is recorded, then every save loses
    assert parts.step() == CloseStep(S.RACED, None, 0, None)
    assert parts.ledger.refused == 19
    assert parts.invoice().state is FIN

    parts.ledger.saves_left = 1  # Verified is recorded, then every save loses
    # The read it recorded, and 19 finalizes whose record lost (each after the first
    # read the invoice first: the one before may have landed).
    assert parts.step() == CloseStep(S.RACED, None, 20, None)
    assert parts.ledger.refused == 19 + 19
    assert parts.invoice().verified
    assert parts.stripe.looked_first == [False] + [True] * 18

    parts.ledger.saves_left = None  # the finalize Stripe did is recorded from its answer
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1)
    assert len(parts.events(Invoice.Finalized)) == 1
    assert parts.stripe.executed.count(f"invoice-finalize:{parts.id}") == 1


# -- reading Stripe back --------------------------------------------------------------------


def test_a_draft_equal_to_the_ledger_is_verified_then_finalized_in_one_step() -> None:
    parts = Parts().bill(two_lines=True).closed()
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2, None)
    assert parts.stripe.calls.count("read") == 1
    [verified] = parts.events(Invoice.Verified)
    assert (verified.total, verified.items) == (125, 2)
    invoice = parts.invoice()
    assert (invoice.total, invoice.number, invoice.mismatch) == (125, "FAKE-0001", None)
    assert parts.stripe.looked_first == [False]
    assert f"invoice-finalize:{parts.id}" in parts.stripe.keys  # keyed by the ledger's invoice


def test_without_reading_back_the_draft_is_finalized_unread() -> None:
    parts = Parts(verify=False).bill().closed()
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1, None)
    assert "read" not in parts.stripe.calls
    assert parts.events(Invoice.Verified) == []


def test_the_read_back_waits_until_the_latest_request_that_may_still_land_cannot() -> None:
    parts = Parts().bill(two_lines=True).closed()
    latest = DEADLINE + 9 * ONE_S
    for line, lands_by in zip(parts.lines, (DEADLINE + 2 * ONE_S, latest), strict=True):
        push = parts.ledger.line_push(line)  # a pusher recorded an attempt, then died
        assert push is not None
        push.start_attempt(push.pushed_sequence, DEADLINE, lands_by)
        parts.ledger.save(push)
    assert parts.step() == CloseStep(S.WAITING, FIN, 0, DEADLINE + 9 * ONE_S)
    parts.clock.now = DEADLINE + 9 * ONE_S - timedelta(microseconds=1)
    assert parts.step() == CloseStep(S.WAITING, FIN, 0, DEADLINE + 9 * ONE_S)
    assert "read" not in parts.stripe.calls
    parts.clock.now = DEADLINE + 9 * ONE_S
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)


def test_a_failed_read_back_is_retried_after_a_backoff_growing_with_each_attempt() -> None:
    parts = Parts().bill().closed()
    parts.stripe.failures += [_failure(), _failure(), _failure(retry_after=timedelta(seconds=9))]
    assert parts.step() == CloseStep(S.FAILED, FIN, 1, DEADLINE + HALF_S)
    failing = parts.invoice()
    assert (failing.finalize_attempts, failing.last_error) == (1, "http_503: down")
    assert failing.next_attempt_at == DEADLINE + HALF_S
    parts.clock.now = DEADLINE + HALF_S - timedelta(microseconds=1)
    assert parts.step() == CloseStep(S.WAITING, FIN, 0, DEADLINE + HALF_S)
    parts.clock.now = DEADLINE + HALF_S
    assert parts.step() == CloseStep(S.FAILED, FIN, 1, DEADLINE + HALF_S + ONE_S)
    parts.clock.now += ONE_S
    # Stripe's Retry-After is later than the backoff (2 s): it wins
    assert parts.step() == CloseStep(S.FAILED, FIN, 1, parts.clock.now + timedelta(seconds=9))
    assert parts.invoice().finalize_attempts == 3
    parts.clock.now += timedelta(seconds=9)
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)
    assert parts.stripe.calls.count("read") == 4


def test_a_draft_finalized_already_is_recorded_from_stripes_answer_without_verifying() -> None:
    parts = Parts().bill().closed()
    invoice = parts.invoice()
    assert invoice.stripe_invoice_id is not None
    parts.stripe.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)  # the read counts
    assert parts.events(Invoice.Verified) == []
    final = parts.invoice()
    assert (final.total, final.mismatch, final.attention) == (100, None, None)


def test_drift_is_recorded_then_repaired_under_its_own_key_and_read_again() -> None:
    parts = Parts().bill(two_lines=True).closed()
    first, second = parts.lines
    parts.edit(first, 90)
    parts.edit(second, 20)
    assert parts.step() == CloseStep(S.WAITING, FIN, 3, DEADLINE)  # read, two repairs
    [drift] = parts.events(Invoice.DriftFound)
    rows = [
        [str(line), "0", str(parts.sequence(line)), parts.item(line), str(want), str(found)]
        for line, want, found in ((first, 100, 90), (second, 25, 20))
    ]
    assert (drift.repair, drift.drifts, drift.expected_total, drift.stripe_total) == (
        1, rows, 125, 110,
    )  # fmt: skip
    # two requests one after another: each may take per_call, then the margin
    assert drift.lands_by == DEADLINE + 2 * LANDING.per_call + LANDING.margin
    assert parts.stripe.repairs_sent == [
        ItemRepair(
            parts.item(line), want, parts.sequence(line),
            f"line-repair:{line}:0:{parts.sequence(line)}:1",
        )
        for line, want in ((first, 100), (second, 25))
    ]  # fmt: skip
    assert (parts.stripe.held(first), parts.stripe.held(second)) == ([100], [25])
    repaired = parts.invoice()
    assert (repaired.repairs, repaired.repair_lands_by, repaired.verified) == (1, None, False)
    assert [e.repair for e in parts.events(Invoice.Repaired)] == [1]
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)
    assert parts.invoice().total == 125


def test_one_drifted_item_may_land_until_one_call_and_the_margin() -> None:
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    parts.stripe.repair_failures.append(_failure())  # the repair's answer is lost
    assert parts.step() == CloseStep(S.FAILED, FIN, 2, DEADLINE + HALF_S)
    [failed] = parts.events(Invoice.FinalizeFailed)
    assert (failed.call, failed.may_have_landed) == ("repair", True)
    assert parts.invoice().finalize_in_doubt is False  # a repair is not a finalize
    lands_by = DEADLINE + LANDING.per_call + LANDING.margin
    [drift] = parts.events(Invoice.DriftFound)
    assert drift.lands_by == lands_by
    assert parts.invoice().repair_lands_by == lands_by
    assert parts.events(Invoice.Repaired) == []
    parts.clock.now = DEADLINE + HALF_S
    assert parts.step() == CloseStep(S.WAITING, FIN, 0, lands_by)
    parts.clock.now = lands_by
    assert parts.step() == CloseStep(S.WAITING, FIN, 2, lands_by)  # read again, repaired
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)


class Killed(BaseException):
    """The worker process killed mid-request (nothing below it catches this)."""


def test_a_closer_killed_while_its_repair_is_in_flight_leaves_it_recorded_to_wait_for() -> None:
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    send = parts.stripe.repair_items

    def killed_after_sending(repairs: Sequence[ItemRepair]) -> ChargeFailure | None:
        send(repairs)  # Stripe has it; the worker never learns the answer
        raise Killed

    parts.stripe.repair_items = killed_after_sending  # type: ignore[method-assign]
    with pytest.raises(Killed):
        parts.step()
    lands_by = DEADLINE + LANDING.per_call + LANDING.margin
    recorded = parts.invoice()  # the drift and its repair were saved before sending it
    assert (recorded.repairs, recorded.repair_lands_by) == (1, lands_by)
    parts.stripe.repair_items = send  # type: ignore[method-assign]
    assert parts.step() == CloseStep(S.WAITING, FIN, 0, lands_by)  # it may still land
    parts.clock.now = lands_by
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)  # it did: verified
    assert len(parts.events(Invoice.DriftFound)) == 1


def test_a_repair_stripe_answered_with_a_failure_cannot_land_and_is_read_again_at_its_retry() -> (
    None
):
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    # a 503 Stripe answered: the repair was not applied and cannot be later
    parts.stripe.repair_failures.append(_failure(answered=True))
    assert parts.step() == CloseStep(S.FAILED, FIN, 2, DEADLINE + HALF_S)
    failing = parts.invoice()
    assert (failing.repairs, failing.repair_lands_by, failing.finalize_attempts) == (1, None, 1)
    assert failing.last_error == "http_503: down"
    parts.clock.now = DEADLINE + HALF_S
    assert parts.step() == CloseStep(S.WAITING, FIN, 2, DEADLINE + HALF_S)  # read, repaired
    assert parts.stripe.repairs_sent[-1].key.endswith(":2")  # the second repair's own key


def test_a_repair_stripe_refuses_stops_the_invoice_with_stripes_reason() -> None:
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    parts.stripe.repair_failures.append(
        ChargeFailure("http_400", "item is locked", retryable=False)
    )
    assert parts.step() == CloseStep(S.ATTENTION, FIN, 2)
    stopped = parts.invoice()
    assert stopped.attention == "Stripe refused repair 1: http_400: item is locked"
    assert stopped.finalize_attempts == 0
    assert len(parts.events(Invoice.AttentionNeeded)) == 1
    assert parts.step() == CloseStep(S.ATTENTION, FIN)  # stopped: nothing read or sent
    assert parts.stripe.calls.count("read") == 1


@pytest.mark.parametrize("where", ["read back", "finalize"])
def test_a_read_or_finalize_stripe_refuses_for_good_stops_the_invoice_until_settled(
    where: str,
) -> None:
    parts = Parts().bill().closed()
    refusal = ChargeFailure("http_400", "no such customer", retryable=False)
    if where == "finalize":
        parts.stripe.finalize_failures.append(refusal)
    else:
        parts.stripe.failures.append(refusal)
    assert parts.step().result is S.ATTENTION
    stopped = parts.invoice()
    assert stopped.attention == f"Stripe refused the {where}: http_400: no such customer"
    assert parts.events(Invoice.FinalizeFailed) == []  # no retry due: an operator's
    sent = list(parts.stripe.calls)
    parts.clock.now += timedelta(days=1)
    assert parts.step() == CloseStep(S.ATTENTION, FIN)  # nothing sent while stopped
    assert parts.stripe.calls == sent
    stopped.settle_attention("customer restored", "ops")
    parts.ledger.save(stopped)
    assert parts.step().state is InvoiceState.FINALIZED  # read back again, then final


def test_a_finalize_stripe_says_not_to_retry_that_may_have_landed_is_read_first_not_stopped() -> (
    None
):
    parts = Parts().bill().closed()
    # A 500 with Stripe-Should-Retry: false: not retryable, and its outcome unknown.
    parts.stripe.finalize_failures.append(
        ChargeFailure("http_500", "boom", retryable=False, answered=False)
    )
    assert parts.step().result is S.FAILED
    assert parts.invoice().attention is None and parts.invoice().finalize_in_doubt
    parts.clock.now += timedelta(hours=1)
    assert parts.step().state is InvoiceState.FINALIZED
    assert parts.stripe.looked_first == [False, True]


def test_drift_found_again_after_the_last_repair_stops_the_invoice_for_an_operator() -> None:
    parts = Parts().bill().closed()
    parts.edit(parts.lines[0], 90)
    parts.stripe.undo_repairs = True
    for repair in range(1, MAX_REPAIRS + 1):
        assert parts.step() == CloseStep(S.WAITING, FIN, 2, DEADLINE)
        assert parts.invoice().repairs == repair
    assert parts.step() == CloseStep(S.ATTENTION, FIN, 1)
    stopped = parts.invoice()
    assert stopped.attention == (
        "Stripe's draft still differs from the ledger after 3 repairs"
        " (expected 1.00 USD, Stripe 0.90 USD)"
    )
    assert stopped.repairs == MAX_REPAIRS == 3
    assert "finalize" not in parts.stripe.calls


def test_a_draft_setting_amounts_cannot_repair_stops_the_invoice_once_per_reason() -> None:
    parts = Parts().bill().closed()
    invoice = parts.invoice()
    parts.stripe.items["ii_by_hand"] = {
        "amount": 7, "line": None, "invoice": invoice.stripe_invoice_id,
    }  # fmt: skip
    reason = "the draft holds 1 item(s) the ledger did not make: ii_by_hand (0.07 USD)"
    assert parts.step() == CloseStep(S.ATTENTION, FIN, 1)
    assert parts.invoice().attention == reason
    assert parts.events(Invoice.DriftFound) == []
    stopped = parts.invoice()
    stopped.settle_attention("looked", "ops")
    parts.ledger.save(stopped)
    assert parts.step() == CloseStep(S.ATTENTION, FIN, 1)  # read again: the same reason
    assert [e.reason for e in parts.events(Invoice.AttentionNeeded)] == [reason, reason]


# -- finalizing -------------------------------------------------------------------------


def test_a_failed_finalize_is_retried_when_due_looking_first_and_without_reading_again() -> None:
    parts = Parts().bill().closed()
    parts.stripe.finalize_failures.append(_failure())
    assert parts.step() == CloseStep(S.FAILED, FIN, 2, DEADLINE + HALF_S)
    failing = parts.invoice()
    assert failing.verified and failing.finalize_attempts == 1
    assert failing.finalize_in_doubt  # a 503: it may have finalized, the answer lost
    parts.clock.now = DEADLINE + HALF_S
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1)
    assert parts.stripe.looked_first == [False, True]
    assert parts.stripe.calls.count("read") == 1


@pytest.mark.parametrize(
    ("where", "failure", "looked_first"),
    [
        # A 429 is answered before Stripe does anything: the retry finalizes unread.
        ("finalize", _failure(answered=True), [False, False]),
        # A read that failed changed nothing: the read again, then a finalize unread.
        ("read", _failure(), [False]),
    ],
)
def test_a_failure_that_cannot_have_finalized_costs_no_read_before_the_next_finalize(
    where: str, failure: ChargeFailure, looked_first: list[bool]
) -> None:
    parts = Parts().bill().closed()
    if where == "finalize":
        parts.stripe.finalize_failures.append(failure)
    else:
        parts.stripe.failures.append(failure)
    step = parts.step()
    assert (step.result, step.retry_at) == (S.FAILED, DEADLINE + HALF_S)
    [failed] = parts.events(Invoice.FinalizeFailed)
    call = "finalize" if where == "finalize" else "read back"
    assert (failed.call, failed.may_have_landed) == (call, where == "read")
    assert parts.invoice().finalize_in_doubt is False
    parts.clock.now = DEADLINE + HALF_S
    assert parts.step().state is InvoiceState.FINALIZED
    assert parts.stripe.looked_first == looked_first
    assert parts.stripe.calls.count("read") == (1 if where == "finalize" else 2)


@pytest.mark.parametrize("where", ["read", "finalize"])
def test_a_call_our_own_breaker_refused_is_no_attempt_recorded_and_raises_no_backoff(
    where: str,
) -> None:
    parts = Parts().bill().closed()
    refused = ChargeFailure("circuit_open", "open", retryable=True, sent=False)
    answers = parts.stripe.finalize_failures if where == "finalize" else parts.stripe.failures
    for attempt in range(3):  # the breaker stays open for three passes
        answers.append(refused)
        step = parts.step()
        assert step.result is S.WAITING  # not FAILED: nothing reached Stripe
        assert step.retry_at == parts.clock.now + POLICY.base_delay  # never any longer
        # the refused call is not counted; the first finalize's read back was sent
        assert step.requests == (1 if where == "finalize" and attempt == 0 else 0)
        parts.clock.now += POLICY.base_delay
    assert parts.events(Invoice.FinalizeFailed) == []
    assert parts.invoice().finalize_attempts == 0
    assert parts.step().state is InvoiceState.FINALIZED


def test_a_worker_killed_after_stripe_finalized_records_it_once_from_the_keys_replay() -> None:
    parts = Parts().bill().closed()
    send = parts.stripe.finalize_invoice

    def killed_after_sending(
        stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool, draft: int = 1
    ) -> StripeInvoiceView | ChargeFailure:
        send(stripe_invoice_id, invoice_id, look_first=look_first, draft=draft)  # finalized
        raise Killed

    parts.stripe.finalize_invoice = killed_after_sending  # type: ignore[method-assign]
    with pytest.raises(Killed):
        parts.step()
    parts.stripe.finalize_invoice = send  # type: ignore[method-assign]
    assert parts.invoice().state is InvoiceState.FINALIZING  # nothing recorded
    assert parts.step().state is InvoiceState.FINALIZED
    # Nothing recorded says it is in doubt: the same key answers the first finalize.
    assert parts.stripe.looked_first == [False, False]
    assert parts.stripe.executed.count(f"invoice-finalize:{parts.id}") == 1
    assert len(parts.events(Invoice.Finalized)) == 1


def test_a_finalize_whose_record_lost_a_race_is_read_first_when_sent_again() -> None:
    parts = Parts().bill().closed()
    parts.stripe.finalize_failures.append(_failure())  # a 503: it may have finalized

    def reversal_meanwhile() -> None:  # corrections: a credit requested while finalizing
        invoice = parts.invoice()
        invoice.request_credit(uuid4(), 1, "reversed meanwhile")
        parts.ledger.save(invoice)

    # saves: FinalizeStarted, Verified, then FinalizeFailed (loses to the reversal)
    parts.ledger.before_save += [lambda: None, lambda: None, reversal_meanwhile]
    step = parts.step()
    assert parts.events(Invoice.CreditRequested)  # the other writer recorded first
    assert parts.events(Invoice.FinalizeFailed) == []  # lost with its save
    assert parts.stripe.looked_first == [False, True]  # the step's second finalize read
    assert step.state is InvoiceState.FINALIZED
    # the read back, the lost finalize, the finalize that read first, the credit note
    assert step.requests == 4


def test_a_draft_found_finalized_by_the_read_back_is_recorded_from_one_more_read() -> None:
    parts = Parts().bill().closed()
    stripe_id = parts.invoice().stripe_invoice_id
    assert stripe_id is not None
    parts.stripe.finalized[stripe_id] = _view("open", total=100)  # finalized by hand
    step = parts.step()
    assert step.state is InvoiceState.FINALIZED
    # Looking first costs one read; a finalize Stripe refuses would cost a read more.
    assert parts.stripe.looked_first == [True]
    assert step.requests == 2  # the read back, and the finalize step's read
    assert parts.events(Invoice.MismatchFound) == []


def test_stripe_finalizing_another_total_is_recorded_as_a_mismatch() -> None:
    parts = Parts(verify=False).bill().closed()
    parts.edit(parts.lines[0], 80)
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1)
    final = parts.invoice()
    assert (final.total, final.mismatch) == (80, (100, 80))
    assert len(parts.events(Invoice.MismatchFound)) == 1


# -- credits ----------------------------------------------------------------------------


def _reverse(parts: Parts, txn: UUID, reason: str = "goodwill") -> None:
    corrections = Corrections(parts.ledger, parts.stripe, clock=parts.clock)
    assert corrections.reverse(txn, reason) is StepResult.REVERSED


def _view(status: str, **changes: Any) -> StripeInvoiceView:
    fields: dict[str, Any] = {
        "status": status, "number": "FAKE-0001", "total": 200, "amount_paid": 0,
        "attempt_count": 0, "next_payment_attempt": None, "at": DEADLINE, "source": "evt",
    }  # fmt: skip
    return StripeInvoiceView(**{**fields, **changes})


def _observed(parts: Parts, view: StripeInvoiceView) -> None:
    invoice = parts.invoice()
    assert invoice.observe(view)
    parts.ledger.save(invoice)


def test_each_pending_credit_is_issued_in_one_step_with_its_memo_and_recorded() -> None:
    parts = Parts().bill(records=2).final()
    _reverse(parts, parts.txns[0], "duplicate usage")
    _reverse(parts, parts.txns[1], "goodwill")
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 2)
    notes = list(parts.stripe.credit_notes.values())
    assert [(n.transaction_id, n.amount, n.after_payment) for n in notes] == [
        (parts.txns[0], 100, False), (parts.txns[1], 100, False),
    ]  # fmt: skip
    assert [n.memo for n in notes] == [
        f"reversal of {parts.txns[0]}: duplicate usage", f"reversal of {parts.txns[1]}: goodwill",
    ]  # fmt: skip
    assert all(n.invoice_id == parts.id and n.stripe_invoice_id == "in_1" for n in notes)
    credited = parts.events(Invoice.Credited)
    assert [(e.credit_note_id, e.amount, e.source) for e in credited] == [
        ("cn_1", 100, "credit"), ("cn_2", 100, "credit"),
    ]  # fmt: skip
    credits = parts.invoice()
    assert (credits.credited_amount, credits.attention) == (200, None)


def test_a_credit_on_a_paid_invoice_is_issued_as_after_payment() -> None:
    parts = Parts().bill(records=2).final()
    _observed(parts, _view("paid", amount_paid=200))
    _reverse(parts, parts.txns[1])
    assert parts.step() == CloseStep(S.DONE, InvoiceState.PAID, 1)
    [note] = parts.stripe.credit_notes.values()
    assert (note.amount, note.after_payment) == (100, True)


def test_a_credit_on_an_invoice_whose_payment_failed_is_issued() -> None:
    parts = Parts().bill(records=2).final()
    _observed(parts, _view("open", attempt_count=1))
    _reverse(parts, parts.txns[1])
    assert parts.step() == CloseStep(S.DONE, InvoiceState.PAYMENT_FAILED, 1)
    [note] = parts.stripe.credit_notes.values()
    assert (note.amount, note.after_payment) == (100, False)


def test_a_failed_credit_note_waits_exactly_until_its_backoff_growing_with_each_attempt() -> None:
    parts = Parts().bill().final()
    _reverse(parts, parts.txns[0])
    parts.stripe.failures += [_failure(), _failure()]
    assert parts.step() == CloseStep(S.FAILED, InvoiceState.FINALIZED, 1, DEADLINE + HALF_S)
    [failed] = parts.events(Invoice.CreditFailed)
    assert (failed.transaction_id, failed.attempt) == (parts.txns[0], 1)
    assert parts.invoice().last_error == "http_503: down"
    parts.clock.now = DEADLINE + HALF_S - timedelta(microseconds=1)
    assert parts.step() == CloseStep(S.WAITING, InvoiceState.FINALIZED, 0, DEADLINE + HALF_S)
    parts.clock.now = DEADLINE + HALF_S
    due = DEADLINE + HALF_S + ONE_S
    assert parts.step() == CloseStep(S.FAILED, InvoiceState.FINALIZED, 1, due)
    parts.clock.now = due
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1)
    done = parts.invoice()
    assert (done.credited_amount, done.credit_attempts, done.credit_due) == (100, 0, None)


def test_a_credit_stripe_cannot_hold_in_full_is_cut_to_what_is_left_and_stops_the_rest() -> None:
    parts = Parts().bill(records=2).final()
    final = parts.invoice()
    final.record_credit(None, "cn_dashboard", 110, "evt_by_hand")  # 90 left to credit
    parts.ledger.save(final)
    _reverse(parts, parts.txns[1])  # owes 100
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED, 1)
    [note] = parts.stripe.credit_notes.values()
    assert note.amount == 90
    first = (
        f"reversal of {parts.txns[1]} owes 1.00 USD, but the invoice can only be credited"
        " 0.90 USD more: settle the remainder with the customer"
    )
    assert parts.invoice().attention == first
    _reverse(parts, parts.txns[0])  # owes 100: nothing left
    assert parts.step() == CloseStep(S.ATTENTION, InvoiceState.FINALIZED)
    stopped = parts.invoice()
    assert stopped.attention is not None and f"reversal of {parts.txns[0]} owes 1.00 USD" in (
        stopped.attention
    )
    assert stopped.attention.endswith(
        "credited 0.00 USD more: settle the remainder with the customer"
    )
    assert len(parts.stripe.credit_notes) == 1


def test_a_final_invoice_without_credits_pending_is_done() -> None:
    parts = Parts().bill().final()
    calls = len(parts.stripe.calls)
    assert parts.step() == CloseStep(S.DONE, InvoiceState.FINALIZED)
    assert len(parts.stripe.calls) == calls
