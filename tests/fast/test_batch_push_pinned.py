"""A draft's new lines made together (``add_lines``) and an invoice's lines set together
(``update_lines``), pinned through the ports: which lines a request takes and which it
leaves to wait, the exact request Stripe gets, the exact events each line records (its
planned items, the batch, its attempt and deadline, ``Pushed``, ``PushFailed``, the line
items learned), the report ``push`` returns, and where a refusal sends each line.

The fakes are those of ``test_pusher_pinned`` (a strict Stripe that keeps each request
and fails a named call once; a ledger in which another writer records first), with the
``add_lines`` requests, the drafts read and the line item lists kept too. The clock and
the jitter are fixed: every time is asserted exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from adapters.charging.pusher import LinePusher, PushReport, invoice_of
from adapters.settings import Settings
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.money import split_for_items
from domain.ownership import Claim
from domain.ports import AddedItems, LinesAdd
from domain.pushing import LineAdd
from domain.saga import ChargeFailure, StepResult, backoff
from domain.transaction import TxnState
from domain.verification import DraftView
from tests.fast.fakes import T0, Clock, reserve
from tests.fast.test_pusher_pinned import (
    DOWN,
    LANDING,
    POLICY,
    REFUSED,
    Ledger,
    Stripe,
    _lose_the_race,
    _recording,
)

USD = (
    "api.requests",
    "gpu.a100.seconds",
    "gpt-4o.input_tokens",
    "gpt-4o.output_tokens",
    "gpt-4o-mini.input_tokens",
    "gpt-4o-mini.output_tokens",
    "embeddings.tokens",
)  # every USD meter of the default price book: one line each on one draft
PRICES = Settings().load_prices()
DUE = T0 + backoff(1, POLICY, 0.5)  # a first failure's due time at the fixed jitter
ONE_CALL = LANDING.per_call + LANDING.margin
DUE_MAX = T0 + POLICY.max_delay  # a refusal kept for an operator: looked at now and then


class Crash(Exception):
    """The process died while the request was on its way: nothing after it ran."""


def _crash() -> None:
    raise Crash


@dataclass
class Batching(Stripe):
    """The pinned Stripe, also keeping every ``add_lines`` request (``fail["add"]``
    answers the next one with a failure, executing nothing), every draft read and every
    list of an invoice's line items asked for."""

    add_requests: list[LinesAdd] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)

    def add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        self.add_requests.append(add)
        failed = self._arrives("add")
        if failed is not None:
            self.calls.append("add_lines")
            return failed
        return super().add_lines(add)

    def read_draft(self, stripe_invoice_id: str) -> DraftView | ChargeFailure:
        self.reads.append(stripe_invoice_id)
        return super().read_draft(stripe_invoice_id)

    def line_items(self, stripe_invoice_id: str) -> dict[str, str] | ChargeFailure:
        self.listed.append(stripe_invoice_id)
        return super().line_items(stripe_invoice_id)


class Book:
    """One customer's lines on one draft, pushed by a pusher holding ``claim``."""

    def __init__(self, claim: Claim | None = None) -> None:
        self.clock = Clock(T0)
        self.gateway = Batching(clock=self.clock)
        self.ledger = Ledger()
        self.pusher = LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5,
            landing=LANDING, claims=lambda customer: claim,
        )  # fmt: skip
        self.txns: list[UUID] = []

    def usage(self, meter: str, cents: int | Decimal = 100) -> UUID:
        """Usage on the meter's line worth ``cents``; the line."""
        price = PRICES.price_of(meter)
        quantity = Decimal(cents) * price.per / (price.unit_price * 100)
        [txn] = reserve(
            self.ledger, 1, quantity=str(quantity), meter=meter, prefix=f"u{len(self.txns)}"
        )
        self.txns.append(txn)
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def line(self, line: UUID) -> InvoiceLine:
        return self.ledger.line_by_id(line)

    def seq(self, line: UUID) -> int:
        return self.line(line).sequence

    def push_of(self, line: UUID) -> LinePush:
        push = self.ledger.line_push(line)
        assert push is not None
        return push

    def events(self, line: UUID, kind: type) -> list[Any]:
        push = self.ledger.line_push(line)
        if push is None:
            return []
        return [e for e in self.ledger.history(push.id) if isinstance(e, kind)]

    def invoice(self, line: UUID) -> Invoice:
        return invoice_of(self.ledger, self.line(line))

    def items_of(self, line: UUID) -> list[str]:
        return [k for k, i in self.gateway.items.items() if i["line"] == line]

    def held(self, line: UUID) -> int:
        return sum(self.gateway.held(line))

    def add(self, *lines: UUID) -> LineAdd:
        """What a request making ``lines``' items sends for the first of them: its items
        as planned (the first push's sequence and amounts)."""
        push = self.push_of(lines[0])
        line = self.line(lines[0])
        items = tuple((c, s, a) for c, (s, a) in enumerate(push.planned))
        return LineAdd(line.id, line.meter, str(line.period), items)

    def states(self) -> set[TxnState]:
        return {self.ledger.transaction(t).state for t in self.txns}


def _ids(adds: tuple[LineAdd, ...]) -> list[UUID]:
    return [a.line_id for a in adds]


def _sorted(lines: list[UUID]) -> list[UUID]:
    return sorted(lines, key=str)


# -- which new lines a batch takes ---------------------------------------------------


def test_a_batch_sends_each_lines_planned_items_in_line_order_and_records_each_push() -> None:
    b = Book()
    lines = [b.usage(meter, cents) for meter, cents in zip(USD[:3], (100, 220, 330), strict=True)]
    first, *others = lines
    report = b.pusher.push(first)
    invoice = b.invoice(first)
    [add] = b.gateway.add_requests
    assert add == LinesAdd(
        invoice.id, "in_1", "cus_acme", "USD", tuple(b.add(x) for x in _sorted(lines)), False
    )
    assert [a.items for a in add.adds] == [
        ((0, b.seq(x), b.line(x).billed),) for x in _sorted(lines)
    ]
    # every line set by the request: the others' intervals run from it
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 3, 3, lines=tuple(others))
    for line in lines:
        seq, billed = b.seq(line), b.line(line).billed
        [item] = b.items_of(line)
        [planned] = b.events(line, LinePush.ItemPlanned)
        assert (planned.chunk, planned.sequence, planned.amount) == (0, seq, billed)
        [batched] = b.events(line, LinePush.AddBatched)
        assert (batched.lines, batched.chunks, batched.at) == ([str(x) for x in lines], [1] * 3, T0)
        [started] = b.events(line, LinePush.AttemptStarted)
        assert (started.attempt, started.sequence, started.sent_at, started.lands_by) == (
            1, seq, T0, T0 + ONE_CALL,
        )  # fmt: skip
        [ended] = b.events(line, LinePush.AttemptEnded)
        assert (ended.attempt, ended.outcome) == (1, "answered")
        [pushed] = b.events(line, LinePush.Pushed)
        assert (pushed.sequence, pushed.billed, pushed.amounts, pushed.item_ids) == (
            seq, billed, [billed], [item],
        )  # fmt: skip
        assert (pushed.stripe_invoice_id, pushed.requests) == ("in_1", 3 if line == first else 0)
        [learned] = b.events(line, LinePush.LineItemsLearned)
        assert (learned.item_ids, learned.line_item_ids) == ([item], [b.gateway.items[item]["il"]])
        [charges] = b.events(line, LinePush.ChargesRecorded)
        assert (charges.through, charges.transactions) == (seq, 1)
        assert b.held(line) == billed
    assert b.states() == {TxnState.CHARGED}


def test_two_new_lines_are_made_by_one_request() -> None:
    b = Book()
    first, second = b.usage(USD[0]), b.usage(USD[1])
    report = b.pusher.push(first)
    assert b.gateway.calls == ["customer", "invoice", "add_lines"]
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 3, 2, lines=(second,))


def test_a_batch_takes_new_lines_up_to_ten_items_skipping_one_that_does_not_fit() -> None:
    b = Book()
    first = b.usage(USD[0])  # one item
    pairs = [b.usage(meter, 150_000_000) for meter in USD[1:6]]  # two items each
    last = b.usage(USD[6])  # one item: fits after the pair that did not
    report = b.pusher.push(first)
    [add] = b.gateway.add_requests
    taken = [first, *pairs[:4], last]
    assert _ids(add.adds) == _sorted(taken)
    assert sum(len(a.items) for a in add.adds) == 10
    for a in add.adds:
        split = split_for_items(b.line(a.line_id).billed)
        assert len(split) == (2 if a.line_id in pairs else 1)
        assert a.items == tuple((c, b.seq(a.line_id), m) for c, m in enumerate(split))
    assert report.lines == tuple(taken[1:])
    [batched] = b.events(first, LinePush.AddBatched)
    assert (batched.lines, batched.chunks) == ([str(x) for x in taken], [1, 2, 2, 2, 2, 1])
    assert b.events(pairs[4], LinePush.AddBatched) == []  # not in it: nothing recorded
    report = b.pusher.push(pairs[4])  # alone now: made on its own
    assert report == PushReport(StepResult.CHARGED, b.seq(pairs[4]), 2, 1)  # an item each
    assert [i.line_id for i in b.gateway.item_requests] == [pairs[4]]
    assert all(b.held(x) == b.line(x).billed for x in [*taken, pairs[4]])


def test_a_first_line_of_more_than_ten_items_is_made_on_its_own() -> None:
    b = Book()
    big = b.usage(USD[0], 11 * 99_999_999 + 1)  # twelve items
    other = b.usage(USD[1])
    report = b.pusher.push(big)
    assert b.gateway.add_requests == []
    assert report == PushReport(StepResult.CHARGED, b.seq(big), 2 + 12, 1)  # one request an item
    assert len(b.items_of(big)) == 12 and b.held(big) == b.line(big).billed
    assert b.ledger.line_push(other) is None  # untouched: its own push makes it


@pytest.mark.parametrize(
    ("early", "joins"), [(timedelta(microseconds=1), False), (timedelta(0), True)]
)
def test_a_new_line_backing_off_joins_a_batch_only_once_due(early: timedelta, joins: bool) -> None:
    b = Book()
    waiting = b.usage(USD[0])
    b.gateway.fail["customer"] = DOWN
    assert b.pusher.push(waiting) == PushReport(StepResult.RETRY, b.seq(waiting), 1, retry_at=DUE)
    first, second = b.usage(USD[1]), b.usage(USD[2])
    b.clock.now = DUE - early
    report = b.pusher.push(first)
    [add] = b.gateway.add_requests
    taken = [first, waiting, second] if joins else [first, second]
    assert _ids(add.adds) == _sorted(taken)
    assert report.lines == tuple(taken[1:])


def test_a_sealed_new_line_is_left_out_of_the_batch() -> None:
    b = Book()
    first, sealed, second = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    push = LinePush(line_id=sealed)
    push.seal(b.invoice(sealed).id)
    b.ledger.save(push)
    report = b.pusher.push(first)
    [add] = b.gateway.add_requests
    assert _ids(add.adds) == _sorted([first, second]) and report.lines == (second,)
    assert b.events(sealed, LinePush.ItemPlanned) == []


def test_a_new_line_fenced_to_a_newer_owner_is_left_out_of_the_batch() -> None:
    b = Book(claim=Claim(partition=0, epoch=1))
    first, fenced, second = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    push = LinePush(line_id=fenced)
    push.end_attempt(push.start_attempt(0, T0, T0, Claim(partition=0, epoch=2)), "answered")
    b.ledger.save(push)
    report = b.pusher.push(first)
    [add] = b.gateway.add_requests
    assert _ids(add.adds) == _sorted([first, second]) and report.lines == (second,)
    assert b.events(fenced, LinePush.ItemPlanned) == []
    for line in (first, second):  # recorded under the pusher's claim
        assert (b.push_of(line).owner_partition, b.push_of(line).owner_epoch) == (0, 1)


def test_lines_made_before_changed_or_not_are_left_out_of_the_batch() -> None:
    b = Book()
    steady = b.usage(USD[0])
    assert b.pusher.push(steady).result is StepResult.CHARGED  # alone: made on its own
    changed = b.usage(USD[1])
    assert b.pusher.push(changed).result is StepResult.CHARGED
    b.usage(USD[1])
    first, second = b.usage(USD[2]), b.usage(USD[3])
    report = b.pusher.push(first)
    [add] = b.gateway.add_requests
    assert _ids(add.adds) == _sorted([first, second]) and report.lines == (second,)


# -- a recorded batch, sent again ------------------------------------------------------


def _batched_then_crashed(b: Book, at: timedelta) -> tuple[UUID, UUID]:
    """A line pushed first at T0 (its customer request failed: nothing planned), then at
    ``T0 + at`` batched with a new line; the process dies as the request goes out."""
    first = b.usage(USD[0])
    b.gateway.fail["customer"] = DOWN
    b.pusher.push(first)
    b.clock.now = T0 + at
    second = b.usage(USD[1])
    b.gateway.meanwhile["add"] = _crash
    with pytest.raises(Crash):
        b.pusher.push(first)
    return first, second


@pytest.mark.parametrize(
    ("before", "look_first", "calls"),
    [(timedelta(microseconds=1), False, 1), (timedelta(0), True, 3)],
)
def test_a_batch_sent_again_looks_first_from_the_key_window_counted_from_the_batch(
    before: timedelta, look_first: bool, calls: int
) -> None:
    b = Book()
    first, second = _batched_then_crashed(b, timedelta(hours=1))
    [batched] = b.events(first, LinePush.AddBatched)
    assert batched.at == T0 + timedelta(hours=1)
    b.clock.now = batched.at + b.pusher.key_window - before
    report = b.pusher.push(first)
    crashed, sent = b.gateway.add_requests
    assert sent == LinesAdd(
        crashed.invoice_id, "in_1", "cus_acme", "USD", crashed.adds, look_first
    )  # fmt: skip
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 1, 2, lines=(second,))
    for line in (first, second):
        _, started = b.events(line, LinePush.AttemptStarted)
        # the creation, and when looking first the list of the invoice's items (two pages)
        assert (started.sent_at, started.lands_by) == (
            b.clock.now, b.clock.now + calls * LANDING.per_call + LANDING.margin,
        )  # fmt: skip
        assert b.held(line) == b.line(line).billed


def test_a_line_whose_push_lost_its_save_sends_the_whole_batch_again_and_records_only_its_own() -> (
    None
):
    b = Book()
    first, lost, third = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    b.ledger.before.append((_recording(LinePush.Pushed), _lose_the_race))  # the others first
    report = b.pusher.push(first)
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 3, 2, lines=(third,))
    assert b.events(lost, LinePush.Pushed) == [] and b.push_of(lost).batched() is not None
    again = b.pusher.push(lost)
    # the same set (the lines made already too), under the same key: replayed
    made, sent = b.gateway.add_requests
    assert sent == made and b.gateway.executed.count(made.key) == 1
    assert again == PushReport(StepResult.CHARGED, b.seq(lost), 1, 1)
    [pushed] = b.events(lost, LinePush.Pushed)
    assert (pushed.sequence, pushed.item_ids, pushed.requests) == (
        b.seq(lost), b.items_of(lost), 1,
    )  # fmt: skip
    assert b.push_of(lost).line_item_ids() == [b.gateway.items[b.items_of(lost)[0]]["il"]]
    for line in (first, third):  # made already: no second attempt, no second push
        assert len(b.events(line, LinePush.AttemptStarted)) == 1
        assert len(b.events(line, LinePush.Pushed)) == 1
    _, started = b.events(lost, LinePush.AttemptStarted)
    assert (started.attempt, started.sequence) == (2, b.seq(lost))
    assert b.states() == {TxnState.CHARGED} and len(b.gateway.items) == 3


def test_a_batch_sent_again_makes_the_planned_totals_and_the_newer_ones_wait() -> None:
    b = Book()
    first, second = _batched_then_crashed(b, timedelta(seconds=1))
    planned = {line: (b.seq(line), b.line(line).billed) for line in (first, second)}
    b.usage(USD[0], 50)
    b.usage(USD[1], 70)
    report = b.pusher.push(second)
    assert report == PushReport(
        StepResult.CHARGED, planned[second][0], 1, 2, more=True, lines=(first,)
    )  # fmt: skip
    _, sent = b.gateway.add_requests
    assert [a.items for a in sent.adds] == [((0, *planned[x]),) for x in _sorted([first, second])]
    for line in (first, second):
        [pushed] = b.events(line, LinePush.Pushed)
        assert (pushed.sequence, pushed.billed, pushed.amounts) == (
            planned[line][0], planned[line][1], [planned[line][1]],
        )  # fmt: skip
        [charges] = b.events(line, LinePush.ChargesRecorded)
        assert (charges.through, charges.transactions) == (planned[line][0], 1)
    assert b.states() == {TxnState.CHARGED, TxnState.RESERVED}


# -- a batch that fails ------------------------------------------------------------------


@pytest.mark.parametrize(("call", "requests"), [("customer", 1), ("invoice", 2)])
def test_a_batch_whose_customer_or_draft_fails_records_nothing_but_the_lines_failure(
    call: str, requests: int
) -> None:
    b = Book()
    first, second = b.usage(USD[0]), b.usage(USD[1])
    b.gateway.fail[call] = DOWN
    report = b.pusher.push(first)
    assert report == PushReport(StepResult.RETRY, b.seq(first), requests, retry_at=DUE)
    assert b.gateway.add_requests == []
    [failed] = b.events(first, LinePush.PushFailed)
    assert (failed.error_class, failed.requests, failed.next_attempt_at) == (
        "http_503", requests, DUE,
    )  # fmt: skip
    assert b.events(first, LinePush.ItemPlanned) == b.events(first, LinePush.AddBatched) == []
    assert b.ledger.line_push(second) is None


def test_a_retryable_failure_of_a_batch_is_every_lines_with_the_requests_on_the_first() -> None:
    b = Book()
    first, second, third = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    b.gateway.fail["add"] = ChargeFailure("http_503", "down", retryable=True, answered=True)
    report = b.pusher.push(first)
    assert report == PushReport(
        StepResult.RETRY, b.seq(first), 3, retry_at=DUE, lines=(second, third)
    )  # fmt: skip
    for line in (first, second, third):
        [failed] = b.events(line, LinePush.PushFailed)
        assert (failed.sequence, failed.attempt, failed.retryable) == (b.seq(line), 1, True)
        assert (failed.next_attempt_at, failed.requests) == (DUE, 3 if line == first else 0)
        [ended] = b.events(line, LinePush.AttemptEnded)  # answered: it cannot land later
        assert (ended.attempt, ended.outcome) == (1, "answered")
        assert b.push_of(line).batched() is not None  # still the batch: sent again as is


def test_a_refused_batch_on_a_draft_is_left_by_every_line_and_each_goes_alone() -> None:
    b = Book()
    first, second, third = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    b.gateway.fail["add"] = REFUSED
    report = b.pusher.push(first)
    assert b.gateway.reads == ["in_1"]  # whose refusal: the draft is read once
    # made on its own at once (the planned item: one creation); the push counts every
    # request it sent: the customer, the draft, the refused batch, the read, the creation
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 5, 1)
    assert b.events(first, LinePush.Pushed)[-1].requests == 5
    assert [i.line_id for i in b.gateway.item_requests] == [first]
    for line in (first, second, third):
        ended = b.events(line, LinePush.AttemptEnded)[0]  # the batch's (`first`: then its own)
        assert (ended.attempt, ended.outcome) == (1, "answered")
        assert len(b.events(line, LinePush.AddBatchLeft)) == 1
        assert b.events(line, LinePush.PushFailed) == []
    for line in (second, third):
        assert b.pusher.push(line) == PushReport(StepResult.CHARGED, b.seq(line), 1, 1)
    # the invoice goes line by line from now on: its next new lines too
    fourth, fifth = b.usage(USD[3]), b.usage(USD[4])
    assert b.pusher.push(fourth) == PushReport(StepResult.CHARGED, b.seq(fourth), 1, 1)
    assert len(b.gateway.add_requests) == 1 and b.ledger.line_push(fifth) is None
    assert b.pusher.push(fifth) == PushReport(StepResult.CHARGED, b.seq(fifth), 1, 1)
    assert b.states() == {TxnState.CHARGED}


def test_a_new_draft_after_a_redraft_is_batched_again_though_the_lost_one_went_line_by_line() -> (
    None
):
    from adapters.charging.redraft import redraft

    b = Book()
    first, second = b.usage(USD[0]), b.usage(USD[1])
    b.gateway.fail["add"] = REFUSED
    b.pusher.push(first)  # refused on the draft: this draft goes line by line
    b.pusher.push(second)
    invoice = b.invoice(first)
    lost = invoice.stripe_invoice_id
    assert lost is not None and len(b.gateway.add_requests) == 1
    b.gateway.delete_draft(lost)
    invoice.need_attention("Stripe says its draft was deleted")
    b.ledger.save(invoice)
    redraft(b.ledger, b.gateway, invoice.id, "deleted", "ops", clock=b.clock)
    b.pusher.push(first)  # both lines are new on the new draft: made in one request
    [add] = b.gateway.add_requests[1:]
    assert add.stripe_invoice_id != lost and sorted(_ids(add.adds)) == sorted([first, second])
    b.pusher.push(second)
    assert b.states() == {TxnState.CHARGED}
    assert b.gateway.held(first) == [100] and b.gateway.held(second) == [100]


def test_a_refused_batch_on_an_invoice_finalized_by_hand_needs_attention_compensating_none() -> (
    None
):
    b = Book()
    alone = b.usage(USD[0])
    b.pusher.push(alone)  # made on its own: the draft exists
    invoice = b.invoice(alone)
    b.gateway.finalize_invoice("in_1", invoice.id, look_first=False)
    first, second = b.usage(USD[1]), b.usage(USD[2])
    report = b.pusher.push(first)
    # the request, the read that says whose refusal, the line's own read
    assert report == PushReport(
        StepResult.DEFERRED, b.seq(first), 3, retry_at=T0 + POLICY.max_delay, lines=(second,)
    )  # fmt: skip
    assert b.gateway.reads == ["in_1"] * 3
    for line, requests in ((first, 3), (second, 1)):
        [failed] = b.events(line, LinePush.PushFailed)
        assert (failed.error_class, failed.requests) == ("http_400", requests)
        assert failed.next_attempt_at == T0 + POLICY.max_delay
        assert b.push_of(line).batched() is not None
    assert b.invoice(first).attention is not None
    assert TxnState.COMPENSATED not in b.states()


# -- an invoice's lines set together -------------------------------------------------------


def _pushed_one_by_one(b: Book, meters: tuple[str, ...] = USD[:3]) -> list[UUID]:
    """A line of each meter, each made on its own before the next exists (so Stripe's
    line items are not known yet), then each changed."""
    lines = []
    for meter in meters:
        lines.append(b.usage(meter))
        assert b.pusher.push(lines[-1]).result is StepResult.CHARGED
    for meter in meters:
        b.usage(meter, 10)
    return lines


def _charges_left_unrecorded(b: Book, line: UUID) -> None:
    """``line`` pushed with its charges saved change by change, and the process dead after
    the first of those saves: Stripe holds its total, its charges are not all recorded."""
    b.pusher.max_charges_per_save = 1
    saves: list[int] = []

    def second_charges(objs: Any) -> bool:
        saves.extend([1] if _recording(LinePush.ChargesRecorded)(objs) else [])
        return len(saves) == 2

    b.ledger.before.append((second_charges, _crash))
    with pytest.raises(Crash):
        b.pusher.push(line)


def test_an_invoices_lines_are_set_by_one_request_recording_each_lines_attempt_and_push() -> None:
    b = Book(claim=Claim(partition=0, epoch=1))
    lines = _pushed_one_by_one(b)
    first, *others = lines
    b.clock.now = T0 + timedelta(minutes=1)
    items = {x: b.push_of(x).item_ids for x in lines}
    seen: list[list[datetime | None]] = []
    b.gateway.meanwhile["items"] = lambda: seen.append(
        [b.push_of(x).in_doubt_until(b.clock.now) for x in lines]
    )  # every attempt recorded before the request
    report = b.pusher.push(first)
    assert seen == [[b.clock.now + ONE_CALL] * 3]
    assert b.gateway.listed == ["in_1"]
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 2, 3, lines=tuple(others))
    [update] = b.gateway.update_requests
    assert (update.invoice_id, update.stripe_invoice_id) == (b.invoice(first).id, "in_1")
    assert [p.line_id for p in update.parts] == lines
    for line in lines:
        [item] = items[line]
        il = b.gateway.items[item]["il"]
        [learned] = b.events(line, LinePush.LineItemsLearned)
        assert (learned.item_ids, learned.line_item_ids) == ([item], [il])
        _, started = b.events(line, LinePush.AttemptStarted)
        assert (started.attempt, started.sequence, started.sent_at, started.lands_by) == (
            2, b.seq(line), b.clock.now, b.clock.now + ONE_CALL,
        )  # fmt: skip
        _, ended = b.events(line, LinePush.AttemptEnded)
        assert (ended.attempt, ended.outcome) == (2, "answered")
        _, pushed = b.events(line, LinePush.Pushed)
        billed = b.line(line).billed
        assert (pushed.sequence, pushed.billed, pushed.amounts, pushed.item_ids) == (
            b.seq(line), billed, [billed], [item],
        )  # fmt: skip
        assert (pushed.stripe_invoice_id, pushed.requests) == ("in_1", 2 if line == first else 0)
        assert (b.push_of(line).owner_partition, b.push_of(line).owner_epoch) == (0, 1)
        assert b.held(line) == billed
    assert b.states() == {TxnState.CHARGED}
    b.usage(USD[1], 10)
    assert b.pusher.push(others[0]) == PushReport(StepResult.CHARGED, b.seq(others[0]), 1, 1)
    assert b.gateway.listed == ["in_1"]  # learned once


def test_a_line_changed_while_its_invoices_request_was_out_says_more_the_others_not() -> None:
    b = Book()
    first, second, third = _pushed_one_by_one(b)
    b.gateway.meanwhile["items"] = lambda: b.usage(USD[0], 5)
    report = b.pusher.push(first)
    assert report.more is True and report.lines == (second, third)
    b2 = Book()
    first, second, third = _pushed_one_by_one(b2)
    b2.gateway.meanwhile["items"] = lambda: b2.usage(USD[1], 5)
    report = b2.pusher.push(first)
    assert report.more is False and report.lines == (second, third)


def test_a_line_of_the_invoices_request_that_lost_its_save_is_left_for_its_own_push() -> None:
    b = Book()
    first, lost, third = _pushed_one_by_one(b)
    saves = [0]

    def second_pushed(objs: Any) -> bool:  # the second Pushed save: `lost`'s (others first)
        if _recording(LinePush.Pushed)(objs):
            saves[0] += 1
        return saves[0] == 1 and objs[0].line_id == lost

    b.ledger.before.append((second_pushed, _lose_the_race))
    report = b.pusher.push(first)
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 2, 2, lines=(third,))
    assert len(b.events(lost, LinePush.Pushed)) == 1  # its first push only
    assert b.pusher.push(lost) == PushReport(StepResult.CHARGED, b.seq(lost), 1, 1)
    assert b.states() == {TxnState.CHARGED}


def test_the_pushed_lines_save_that_loses_a_race_reloads_after_the_others_are_recorded() -> None:
    b = Book()
    first, second, third = _pushed_one_by_one(b)
    pushed: list[UUID] = []

    def first_pushed(objs: Any) -> bool:
        if _recording(LinePush.Pushed)(objs):
            pushed.append(objs[0].line_id)
        return pushed[-1:] == [first]

    b.ledger.before.append((first_pushed, _lose_the_race))
    report = b.pusher.push(first)
    assert pushed[:3] == [second, third, first]
    # reloaded: its own total set again (the others' are recorded already), then recorded
    assert (report.result, report.sequence, report.charged, report.lines) == (
        StepResult.CHARGED, b.seq(first), 1, (),
    )  # fmt: skip
    for line in (first, second, third):
        assert len(b.events(line, LinePush.Pushed)) == 2
    assert b.states() == {TxnState.CHARGED}


def test_an_invoices_request_leaves_out_lines_that_cannot_go_now() -> None:
    b = Book()
    first, unchanged, waiting, uncharged, below = _pushed_one_by_one(b, USD[:5])
    b.pusher.push(first)  # every line's line items learned; all set
    new = b.usage(USD[5])  # never pushed: made on its own
    b.usage(USD[3], 10)
    b.usage(USD[3], 10)
    _charges_left_unrecorded(b, uncharged)
    assert b.push_of(uncharged).charged_through < b.push_of(uncharged).pushed_sequence
    b.pusher.max_charges_per_save = 5000
    b.usage(USD[3], 10)  # changed again: its own push records the charges first
    b.usage(USD[2], 10)
    b.gateway.fail["items"] = DOWN  # `waiting` pushed alone: backing off
    assert b.pusher.push(waiting) == PushReport(StepResult.RETRY, b.seq(waiting), 1, retry_at=DUE)
    b.usage(USD[0], 10)
    b.usage(USD[4], Decimal("0.001"))  # below a cent: nothing to set
    report = b.pusher.push(first)
    [*_, update] = b.gateway.update_requests
    assert [p.line_id for p in update.parts] == [first] and report.lines == ()
    assert b.ledger.line_push(new) is None and len(b.events(unchanged, LinePush.Pushed)) == 2
    assert len(b.events(below, LinePush.Pushed)) == 2
    assert len(b.events(uncharged, LinePush.Pushed)) == 3
    recorded = b.pusher.push(uncharged)
    assert recorded == PushReport(StepResult.CHARGED, b.seq(uncharged) - 1, 0, 1)


@pytest.mark.parametrize(
    ("early", "joins"), [(timedelta(microseconds=1), False), (timedelta(0), True)]
)
def test_a_line_backing_off_joins_its_invoices_request_only_once_due(
    early: timedelta, joins: bool
) -> None:
    b = Book()
    first, waiting, other = _pushed_one_by_one(b)
    b.pusher.push(other)  # the line items learned, every line set
    b.usage(USD[1], 10)
    b.gateway.fail["items"] = DOWN
    assert b.pusher.push(waiting).retry_at == DUE  # alone: the only line changed
    b.usage(USD[0], 10)
    b.usage(USD[2], 10)
    b.clock.now = DUE - early
    report = b.pusher.push(first)
    taken = [first, waiting, other] if joins else [first, other]
    assert [p.line_id for p in b.gateway.update_requests[-1].parts] == taken
    assert report.lines == tuple(taken[1:])


def test_a_retryable_failure_of_an_invoices_request_backs_off_every_line_of_it() -> None:
    b = Book()
    first, second, third = _pushed_one_by_one(b)
    b.gateway.fail["items"] = ChargeFailure("http_503", "down", retryable=True, answered=True)
    report = b.pusher.push(first)
    assert report == PushReport(
        StepResult.RETRY, b.seq(first), 2, retry_at=DUE, lines=(second, third)
    )  # fmt: skip
    for line in (first, second, third):
        [failed] = b.events(line, LinePush.PushFailed)
        assert (failed.sequence, failed.next_attempt_at) == (b.seq(line), DUE)
        assert failed.requests == (2 if line == first else 0)
        _, ended = b.events(line, LinePush.AttemptEnded)
        assert (ended.attempt, ended.outcome) == (2, "answered")


def test_a_retryable_failure_to_list_the_line_items_backs_off_the_line_alone() -> None:
    b = Book()
    first, second, third = _pushed_one_by_one(b)
    b.gateway.fail["lines"] = DOWN
    report = b.pusher.push(first)
    assert report == PushReport(StepResult.RETRY, b.seq(first), 1, retry_at=DUE)
    [failed] = b.events(first, LinePush.PushFailed)
    assert (failed.error_class, failed.requests) == ("http_503", 1)
    for line in (second, third):
        assert b.events(line, LinePush.PushFailed) == []
    assert b.gateway.update_requests == []
    assert len(b.events(first, LinePush.AttemptStarted)) == 1  # nothing sent: no attempt


def test_a_refusal_to_list_the_line_items_sends_the_line_alone() -> None:
    b = Book()
    first, second, third = _pushed_one_by_one(b)
    b.gateway.fail["lines"] = REFUSED
    report = b.pusher.push(first)
    assert (report.result, report.sequence, report.charged, report.lines) == (
        StepResult.CHARGED, b.seq(first), 1, (),
    )  # fmt: skip
    assert report.requests == 2  # the refused listing counted, then its own update
    assert b.gateway.update_requests == [] and b.gateway.calls[-1] == "update"
    assert b.held(first) == b.line(first).billed
    for line in (second, third):
        assert len(b.events(line, LinePush.Pushed)) == 1


def test_a_refusal_of_an_invoices_request_of_one_line_is_the_lines_own() -> None:
    b = Book()
    [alone] = _pushed_one_by_one(b, USD[:1])
    b.pusher.push(alone)  # its line items learned (the invoice's request, of one line)
    owed = b.usage(USD[0], 10)
    assert owed == alone
    b.gateway.fail["items"] = REFUSED
    report = b.pusher.push(alone)
    assert report.result is StepResult.COMPENSATED and report.lines == ()
    assert b.gateway.reads == ["in_1"]  # the line's own read only
    assert TxnState.COMPENSATED in b.states()


def test_a_refusal_of_two_lines_on_a_draft_sends_them_one_by_one_compensating_none() -> None:
    b = Book()
    first, second = _pushed_one_by_one(b, USD[:2])
    b.gateway.fail["items"] = REFUSED
    report = b.pusher.push(first)
    assert b.gateway.reads == ["in_1"]
    assert (report.result, report.sequence, report.lines) == (StepResult.CHARGED, b.seq(first), ())
    assert b.gateway.calls[-1] == "update"  # then set on its own
    assert report.requests == 4  # line items listed, the refused request, the read, its own
    for line in (first, second):
        ended = b.events(line, LinePush.AttemptEnded)[1]  # the request's
        assert (ended.attempt, ended.outcome) == (2, "answered")
        assert b.events(line, LinePush.PushFailed) == []
    assert b.pusher.push(second) == PushReport(StepResult.CHARGED, b.seq(second), 1, 1)
    assert b.states() == {TxnState.CHARGED}


@pytest.mark.parametrize("adding", [True, False])
def test_a_refused_request_whose_draft_cannot_be_read_now_is_retried_compensating_none(
    adding: bool,
) -> None:
    b = Book()
    if adding:
        first, second = b.usage(USD[0]), b.usage(USD[1])
        b.gateway.fail["add"] = REFUSED
    else:
        first, second = _pushed_one_by_one(b, USD[:2])
        b.gateway.fail["items"] = REFUSED
    b.gateway.fail["read"] = DOWN  # whose refusal it is cannot be told now
    report = b.pusher.push(first)
    # the customer, the draft and the request, or the line items and the request; the read
    requests = 4 if adding else 3
    assert report == PushReport(
        StepResult.RETRY, b.seq(first), requests, retry_at=DUE, lines=(second,)
    )  # fmt: skip
    assert TxnState.COMPENSATED not in b.states()
    for line in (first, second):
        [failed] = b.events(line, LinePush.PushFailed)
        assert (failed.error_class, failed.retryable, failed.next_attempt_at) == (
            "http_400", True, DUE,
        )  # fmt: skip
        assert failed.requests == (requests if line == first else 0)
        assert b.push_of(line).in_doubt_until(T0) is None  # refused: it cannot land later
    b.clock.now = T0 + timedelta(minutes=10)
    assert b.pusher.push(first).result is StepResult.CHARGED  # the request again
    assert b.pusher.push(second).result in {StepResult.CHARGED, StepResult.NOTHING}
    assert b.states() == {TxnState.CHARGED}


def test_a_failure_of_an_invoices_request_whose_save_loses_a_race_leaves_that_line_due() -> None:
    b = Book()
    first, lost, third = _pushed_one_by_one(b)
    b.gateway.fail["items"] = DOWN
    failures: list[UUID] = []

    def lost_failure(objs: Any) -> bool:
        if _recording(LinePush.PushFailed)(objs):
            failures.append(objs[0].line_id)
        return failures[-1:] == [lost]

    b.ledger.before.append((lost_failure, _lose_the_race))
    report = b.pusher.push(first)
    assert failures == [first, lost]  # the line pushed first, then the others in order
    assert report == PushReport(
        StepResult.RETRY, b.seq(first), 2, retry_at=DUE, lines=(lost, third)
    )  # fmt: skip
    assert b.events(lost, LinePush.PushFailed) == []  # another writer's record stands
    assert len(b.events(third, LinePush.PushFailed)) == 1
    assert b.pusher.push(lost).result is StepResult.CHARGED  # not backing off: due now


def test_lines_left_out_of_an_invoices_request_do_not_keep_the_lines_after_them_out() -> None:
    b = Book(claim=Claim(partition=0, epoch=1))
    first, fenced, uncharged, last = _pushed_one_by_one(b, USD[:4])
    b.pusher.push(first)  # the line items learned, every line set
    push = b.push_of(fenced)
    push.end_attempt(push.start_attempt(push.pushed_sequence, T0, T0, Claim(0, 2)), "answered")
    b.ledger.save(push)
    b.usage(USD[2], 10)
    b.usage(USD[2], 10)
    _charges_left_unrecorded(b, uncharged)
    b.pusher.max_charges_per_save = 5000
    for meter in USD[:4]:
        b.usage(meter, 10)
    report = b.pusher.push(first)
    assert [p.line_id for p in b.gateway.update_requests[-1].parts] == [first, last]
    assert report.lines == (last,)


def test_an_invoices_request_lists_line_items_only_when_a_line_it_sets_needs_them() -> None:
    b = Book()
    first, second = b.usage(USD[0]), b.usage(USD[1])
    b.pusher.push(first)  # made together: their line items came with the answer
    alone = b.usage(USD[2])
    b.pusher.push(alone)  # made on its own: its line items are not known
    b.usage(USD[2], Decimal("0.001"))  # below a cent: nothing to set
    b.usage(USD[0], 10)
    b.usage(USD[1], 10)
    report = b.pusher.push(first)
    assert report == PushReport(StepResult.CHARGED, b.seq(first), 1, 2, lines=(second,))
    assert b.gateway.listed == []
    assert b.events(alone, LinePush.LineItemsLearned) == []


def test_a_line_too_big_for_an_invoices_request_goes_alone_keeping_the_line_items_learned() -> None:
    b = Book()
    big = b.usage(USD[0], 50 * 99_999_999 + 100)  # 51 items
    b.pusher.push(big)  # made on its own: one creation an item
    b.usage(USD[0], 10)
    b.gateway.fail["items"] = DOWN  # a timeout: Stripe may hold anything, every item is set
    assert b.pusher.push(big).result is StepResult.RETRY
    assert b.gateway.listed == ["in_1"]  # its line items learned
    other = b.usage(USD[1])
    b.pusher.push(other)  # made on its own: its line items not known
    b.clock.now = DUE
    b.usage(USD[0], 10)
    b.usage(USD[1], 10)
    report = b.pusher.push(big)  # 51 line items: more than one request sets
    assert b.gateway.listed == ["in_1"] * 2  # for `other`'s line items
    assert (report.result, report.lines) == (StepResult.CHARGED, ())
    assert b.gateway.calls[-1] == "update"
    [learned] = b.events(other, LinePush.LineItemsLearned)  # kept for its own push
    assert learned.item_ids == b.push_of(other).item_ids
    assert b.pusher.push(other) == PushReport(StepResult.CHARGED, b.seq(other), 1, 1)
    assert b.gateway.listed == ["in_1"] * 2  # not listed again
    assert b.held(big) == b.line(big).billed and b.held(other) == b.line(other).billed


def test_a_refused_batch_with_one_line_left_to_make_is_read_as_the_requests_refusal() -> None:
    b = Book()
    first, lost, third = b.usage(USD[0]), b.usage(USD[1]), b.usage(USD[2])
    b.ledger.before.append((_recording(LinePush.Pushed), _lose_the_race))  # `lost`'s save
    b.pusher.push(first)
    assert [len(b.events(x, LinePush.Pushed)) for x in (first, lost, third)] == [1, 0, 1]
    b.gateway.finalize_invoice("in_1", b.invoice(first).id, look_first=False)
    b.gateway.fail["add"] = REFUSED
    report = b.pusher.push(lost)
    # the request, the read that says whose refusal (a batch's), the line's own read
    assert report == PushReport(StepResult.DEFERRED, b.seq(lost), 3, retry_at=DUE_MAX)
    assert b.gateway.reads == ["in_1"] * 2
    assert TxnState.COMPENSATED not in b.states()


def test_lines_with_nothing_to_set_or_an_item_unmade_do_not_keep_the_lines_after_them_out() -> None:
    b = Book()
    first = b.usage(USD[0])
    b.pusher.push(first)
    steady = b.usage(USD[1])
    b.pusher.push(steady)
    unmade = b.usage(USD[2])
    b.gateway.meanwhile["items"] = _crash  # its creation planned, then the process died
    with pytest.raises(Crash):
        b.pusher.push(unmade)
    assert b.push_of(unmade).planned and not b.push_of(unmade).item_ids
    last = b.usage(USD[3])
    b.pusher.push(last)  # made on its own (the others are not new)
    b.usage(USD[0], 10)
    b.usage(USD[3], 10)
    report = b.pusher.push(first)
    assert [p.line_id for p in b.gateway.update_requests[-1].parts] == [first, last]
    assert report.lines == (last,)


THROTTLED = ChargeFailure("throttled", "Stripe rate limit saturated", retryable=True, sent=False)


def test_a_batch_refused_unsent_after_the_customer_and_draft_counts_those_requests() -> None:
    b = Book()
    first, _second = b.usage(USD[0]), b.usage(USD[1])
    b.gateway.fail["add"] = THROTTLED  # the limiter refused add_lines: never sent
    report = b.pusher.push(first)
    assert report.result is StepResult.WAIT
    assert b.invoice(first).stripe_invoice_id is not None  # the customer and draft were made
    assert report.requests == 2  # the customer and the draft: sent, and Stripe took them
