"""Review of ``invoices redraft``: races and keys the first tests did not reach."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from adapters.charging.redraft import RedraftRefused, redraft
from domain.ports import LineItems
from domain.saga import ChargeFailure
from domain.transaction import TxnState
from tests.fast.fakes import reserve
from tests.fast.test_closer_pinned import Parts


def _deleted_and_stopped(parts: Parts, *, items_to_pending: bool = False) -> str:
    """The invoice's draft deleted in the dashboard and the invoice stopped for it, as
    the pushers, the closer or the webhook record; the lost draft's id."""
    lost = parts.invoice().stripe_invoice_id
    assert lost is not None
    parts.stripe.delete_draft(lost, items_to_pending=items_to_pending)
    stopped = parts.invoice()
    stopped.need_attention("Stripe's draft answered 404")
    parts.ledger.save(stopped)
    return lost


def test_a_new_line_whose_push_read_the_lost_draft_before_the_redraft_is_never_compensated() -> (
    None
):
    parts = Parts().bill()
    _deleted_and_stopped(parts)
    # A new meter's first usage: its line has no push yet when the operator redrafts.
    [txn] = reserve(parts.ledger, 1, quantity=100000, meter="gpt-4o.input_tokens", prefix="n")
    line = parts.ledger.transaction(txn).line_id
    assert line is not None and parts.ledger.line_push(line) is None
    # The pusher read the invoice (the lost draft's id); the redraft records just before
    # the push records its planned item, and the item goes to the lost draft.
    parts.ledger.before_save = [
        lambda: redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops") and None
    ]
    parts.pusher.push(line)
    assert parts.invoice().draft == 2
    assert parts.ledger.transaction(txn).state is not TxnState.COMPENSATED  # owed all along
    parts.clock.now += parts.pusher.policy.max_delay
    parts.pusher.push(line)
    assert parts.ledger.transaction(txn).state is TxnState.CHARGED
    assert parts.stripe.held(line) == [25]


def test_new_lines_added_together_to_the_lost_draft_around_the_redraft_are_never_compensated() -> (
    None
):
    parts = Parts().bill()
    _deleted_and_stopped(parts)
    new = [
        *reserve(parts.ledger, 1, quantity=100000, meter="gpt-4o.input_tokens", prefix="i"),
        *reserve(parts.ledger, 1, quantity=100000, meter="gpt-4o.output_tokens", prefix="o"),
    ]
    lines = [parts.ledger.transaction(t).line_id for t in new]
    # The batch of the two new lines is recorded just after the redraft, and sent to the
    # lost draft the pusher read before it.
    parts.ledger.before_save = [
        lambda: redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops") and None
    ]
    parts.pusher.push(lines[0])  # type: ignore[arg-type]
    assert parts.invoice().draft == 2
    assert [parts.ledger.transaction(t).state for t in new] == [TxnState.RESERVED] * 2
    parts.clock.now += parts.pusher.policy.max_delay
    for line in [*lines, parts.lines[0]]:
        parts.pusher.push(line)  # type: ignore[arg-type]
    assert [parts.ledger.transaction(t).state for t in [*new, *parts.txns]] == [
        TxnState.CHARGED
    ] * 3
    assert [parts.stripe.held(line) for line in lines] == [[25], [100]]  # type: ignore[arg-type]


def test_an_add_looked_first_on_a_later_draft_keeps_that_drafts_key() -> None:
    from uuid import UUID

    from domain.ports import LinesAdd
    from domain.pushing import LineAdd, add_key
    from tests.unit.test_stripe_client_keys import _gateway

    line, invoice = UUID(int=11), UUID(int=22)

    def answer(method: str, path: str) -> dict[str, Any]:
        if method == "GET":  # the draft's items, looked for first: none made yet
            return {"object": "list", "data": [], "has_more": False, "url": "/v1/invoiceitems"}
        made = {
            "id": "il_1", "object": "line_item", "amount": 50, "invoice_item": "ii_1",
            "metadata": {"line_id": str(line), "chunk": "0", "sequence": "7"},
        }  # fmt: skip
        return {
            "id": "in_2", "object": "invoice", "status": "draft",
            "lines": {"object": "list", "data": [made], "has_more": False, "url": "/x"},
        }  # fmt: skip

    gateway, sent = _gateway(answer)
    adds = (LineAdd(line, "api.requests", "2026-12", ((0, 7, 50),)),)
    add = LinesAdd(invoice, "in_2", "cus_1", "USD", adds, look_first=True, draft=2)
    assert gateway.add_lines(add) == {(line, 0): ("ii_1", "il_1")}
    [(_, path, key, _)] = [s for s in sent.sent if s[0] == "POST"]
    assert path == "/v1/invoices/in_2/add_lines"
    assert key == f"{add_key(invoice, adds)}:d2" == add.key  # never the lost draft's key


def test_the_fake_stripe_never_reuses_an_item_id_after_a_draft_is_deleted() -> None:
    parts = Parts().bill(two_lines=True)
    [other] = reserve(parts.ledger, 1, "globex", quantity=1000, prefix="g")
    other_line = parts.ledger.transaction(other).line_id
    assert other_line is not None
    parts.pusher.push(other_line)
    _deleted_and_stopped(parts)
    redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")
    for line in parts.lines:
        parts.pusher.push(line)
    assert parts.stripe.held(other_line) == [100]  # globex's item is still its own
    assert [parts.stripe.held(line) for line in parts.lines] == [[100], [25]]


def test_a_refusal_to_make_the_replacement_draft_stops_the_invoice_and_compensates_nothing() -> (
    None
):
    from domain.saga import ChargeFailure

    parts = Parts().bill()
    _deleted_and_stopped(parts)
    redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")
    [late] = reserve(parts.ledger, 1, quantity=1000, prefix="late")
    # Stripe will not make the new draft (its customer deleted in the dashboard too, say).
    parts.stripe.failures.append(
        ChargeFailure("http_400", "No such customer: 'cus_acme'", retryable=False)
    )
    parts.pusher.push(parts.lines[0])
    assert parts.ledger.transaction(late).state is TxnState.RESERVED  # owed, never dropped
    assert parts.ledger.transaction(parts.txns[0]).state is TxnState.CHARGED
    attention = parts.invoice().attention
    assert attention is not None and "No such customer" in attention, attention


def test_a_refusal_of_the_lost_draft_recorded_after_the_redraft_does_not_stop_the_new_draft() -> (
    None
):
    parts = Parts().bill()
    _deleted_and_stopped(parts)
    reserve(parts.ledger, 1, quantity=1000, prefix="late")
    saves: list[str] = []

    def noop() -> None:
        saves.append("push")

    def redrafted() -> None:
        saves.append("redraft")
        redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")

    # The push's attempt, then its failure, are recorded; the operator's redraft lands
    # just before the pusher records on the invoice that the (lost) draft cannot be read.
    parts.ledger.before_save = [noop, noop, redrafted]
    parts.pusher.push(parts.lines[0])
    assert saves == ["push", "push", "redraft"]
    again = parts.invoice()
    assert again.draft == 2
    assert again.attention is None, again.attention  # the lost draft's refusal is history


def test_items_a_deleted_draft_left_pending_are_deleted_before_the_redraft_records() -> None:
    parts = Parts().bill(two_lines=True)
    _deleted_and_stopped(parts, items_to_pending=True)  # Stripe kept them, on no invoice
    left = sorted(i for i, item in parts.stripe.items.items() if item["invoice"] is None)
    assert len(left) == 2
    done = redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")
    assert done.pending_deleted == 2
    assert sorted(parts.stripe.deleted) == left
    for line in parts.lines:
        parts.pusher.push(line)
    # Each line is held once, on the new draft: nothing pending another invoice could take.
    assert parts.stripe.held(parts.lines[0]) == [100] and parts.stripe.held(parts.lines[1]) == [25]
    assert not [i for i in parts.stripe.items.values() if i["invoice"] is None]


def test_a_404_from_an_account_that_does_not_know_the_customer_replaces_nothing() -> None:
    parts = Parts().bill()
    lost = parts.invoice().stripe_invoice_id
    assert lost is not None
    stopped = parts.invoice()
    stopped.need_attention("Stripe's draft answered 404")
    parts.ledger.save(stopped)
    # A test key asked about live ids: every object answers 404, the customer too.
    parts.stripe.drafts.clear()
    parts.stripe.stripe_customers.clear()
    with pytest.raises(RedraftRefused, match=r"cannot read its customer .* account and mode"):
        redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")
    assert parts.invoice().draft == 1 and parts.invoice().stripe_invoice_id == lost


def test_how_and_who_are_checked_before_stripe_is_asked_and_a_passing_failure_says_so() -> None:
    parts = Parts().bill()
    calls = len(parts.stripe.calls)
    with pytest.raises(RedraftRefused, match="--how and --by"):
        redraft(parts.ledger, parts.stripe, parts.id, "deleted", " ")
    assert len(parts.stripe.calls) == calls
    stopped = parts.invoice()
    stopped.need_attention("Stripe's draft answered 404")
    parts.ledger.save(stopped)
    parts.stripe.failures.append(ChargeFailure("connection", "reset", retryable=True))
    with pytest.raises(RedraftRefused) as refused:
        redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops")
    assert refused.value.passing


def test_a_redrafted_lines_first_push_uses_fresh_keys_without_looking_first() -> None:
    parts = Parts().bill()
    parts.clock.now += timedelta(days=2)  # the first draft's keys are long expired
    _deleted_and_stopped(parts)
    redraft(parts.ledger, parts.stripe, parts.id, "deleted", "ops", clock=parts.clock)
    sent: list[bool] = []
    original = parts.stripe.set_line_items

    def recording(items: LineItems) -> Any:
        sent.append(items.look_first)
        return original(items)

    parts.stripe.set_line_items = recording  # type: ignore[method-assign]
    parts.pusher.push(parts.lines[0])
    assert sent == [False]  # the new draft's keys were first used just now
    assert parts.stripe.held(parts.lines[0]) == [100]
