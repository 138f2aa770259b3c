"""Reading Stripe back (``domain.verification``): the comparison of a draft with the
ledger's decisions, the repair keys and the landing window, without Stripe."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from domain.errors import IllegalTransition
from domain.invoice_line import LinePush
from domain.saga import ChargeFailure
from domain.verification import (
    DraftItem,
    DraftView,
    ExpectedItem,
    LandingWindow,
    draft_lost,
    expected_items,
    repair_key,
    verify_draft,
)

L1, L2 = UUID(int=1), UUID(int=2)
AT = datetime(2026, 12, 4, tzinfo=UTC)
EXPECTED = [ExpectedItem(L1, 0, 7, "ii_1", 300), ExpectedItem(L2, 0, 3, "ii_2", 50)]


def _view(*items: tuple[str, int], total: int | None = None, status: str = "draft") -> DraftView:
    drafted = tuple(DraftItem(i, a) for i, a in items)
    return DraftView(status, sum(a for _, a in items) if total is None else total, drafted)


def test_a_draft_holding_exactly_the_ledgers_items_and_total_is_equal() -> None:
    verdict = verify_draft(EXPECTED, 350, _view(("ii_2", 50), ("ii_1", 300)), "USD")
    assert verdict.equal and verdict.attention is None


def test_a_stale_item_is_drift_with_both_amounts_and_repairable() -> None:
    verdict = verify_draft(EXPECTED, 350, _view(("ii_1", 200), ("ii_2", 50)), "USD")
    assert not verdict.equal and verdict.attention is None
    [drift] = verdict.drifts
    assert (drift.line_id, drift.chunk, drift.sequence, drift.expected, drift.found) == (
        L1, 0, 7, 300, 200,
    )  # fmt: skip
    assert drift.as_row() == [str(L1), "0", "7", "ii_1", "300", "200"]


def test_an_item_the_ledger_did_not_make_needs_attention() -> None:
    verdict = verify_draft(EXPECTED, 350, _view(("ii_1", 300), ("ii_2", 50), ("ii_x", 9)), "USD")
    assert not verdict.equal
    assert verdict.attention == "the draft holds 1 item(s) the ledger did not make: ii_x (0.09 USD)"


def test_a_missing_item_needs_attention_unless_it_was_to_hold_nothing() -> None:
    verdict = verify_draft(EXPECTED, 350, _view(("ii_1", 300)), "USD")
    assert verdict.attention == "1 item(s) of the ledger are not on the draft: ii_2"
    zero = [ExpectedItem(L1, 0, 7, "ii_1", 300), ExpectedItem(L2, 0, 3, "ii_2", 0)]
    assert verify_draft(zero, 300, _view(("ii_1", 300)), "USD").equal


def test_a_total_other_than_its_matching_items_needs_attention() -> None:
    verdict = verify_draft(EXPECTED, 350, _view(("ii_1", 300), ("ii_2", 50), total=340), "USD")
    assert not verdict.equal and not verdict.drifts
    assert verdict.attention == (
        "Stripe's draft total is 3.40 USD where its items and the ledger say 3.50 USD"
    )


def test_expected_items_are_each_lines_newest_acknowledged_push() -> None:
    push = LinePush(line_id=L1)
    push.record_pushed(4, 300, [200, 100], ["ii_a", "ii_b"], "in_1")
    assert expected_items([(L1, push), (L2, None)]) == [
        ExpectedItem(L1, 0, 4, "ii_a", 200),
        ExpectedItem(L1, 1, 4, "ii_b", 100),
    ]


def test_repair_keys_are_distinct_per_repair_and_never_a_push_key() -> None:
    keys = {repair_key(L1, 0, 7, n) for n in (1, 2)}
    assert keys == {f"line-repair:{L1}:0:7:1", f"line-repair:{L1}:0:7:2"}


def test_the_landing_window_grows_with_the_calls_sent_one_after_another() -> None:
    window = LandingWindow(per_call=timedelta(seconds=30), margin=timedelta(seconds=5))
    assert window.deadline(AT, 1) == AT + timedelta(seconds=35)
    assert window.deadline(AT, 3) == AT + timedelta(seconds=95)
    assert window.deadline(AT, 0) == AT + timedelta(seconds=35)


def test_an_attempt_is_in_doubt_until_answered_or_past_its_landing_deadline() -> None:
    push = LinePush(line_id=L1)
    first = push.start_attempt(1, AT, AT + timedelta(seconds=60))
    second = push.start_attempt(2, AT, AT + timedelta(seconds=30))
    assert (first, second, push.attempts_started) == (1, 2, 2)
    assert push.in_doubt_until(AT) == AT + timedelta(seconds=60)
    push.end_attempt(first, "answered")
    assert push.in_doubt_until(AT) == AT + timedelta(seconds=30)
    assert push.in_doubt_until(AT + timedelta(seconds=30)) is None
    push.end_attempt(first, "answered")  # ended once: a second end records nothing
    ended = [e for e in push.collect_events() if isinstance(e, LinePush.AttemptEnded)]
    assert len(ended) == 1


def test_a_sealed_push_starts_no_attempt() -> None:
    push = LinePush(line_id=L1)
    push.seal(UUID(int=9))
    push.seal(UUID(int=9))
    assert len([e for e in push.collect_events() if isinstance(e, LinePush.Sealed)]) == 1
    with pytest.raises(IllegalTransition):
        push.start_attempt(1, AT, AT)


def test_attempts_survive_a_reload_from_events() -> None:
    push = LinePush(line_id=L1)
    push.start_attempt(1, AT, AT + timedelta(seconds=60))
    events = push.collect_events()
    copy = None
    for event in events:
        copy = event.mutate(copy)
    assert isinstance(copy, LinePush)
    assert copy.in_doubt_until(AT) == AT + timedelta(seconds=60)


def test_a_permanent_failure_answered_and_a_timeout_not() -> None:
    assert not ChargeFailure("http_400", "no", retryable=False).may_land_later
    assert ChargeFailure("connection", "reset", retryable=True).may_land_later
    assert not ChargeFailure("circuit_open", "open", retryable=True, sent=False).may_land_later


def test_attempts_that_could_no_longer_land_are_forgotten_when_the_next_is_sent() -> None:
    push = LinePush(line_id=L1)
    push.start_attempt(1, AT, AT + timedelta(seconds=60))  # timed out, never answered
    push.start_attempt(2, AT + timedelta(seconds=10), AT + timedelta(seconds=70))
    assert set(push.open_attempts) == {"1", "2"}  # the first may still land
    push.start_attempt(3, AT + timedelta(seconds=61), AT + timedelta(seconds=121))
    assert set(push.open_attempts) == {"2", "3"}
    with pytest.raises(ValueError, match="before it is sent"):
        push.start_attempt(4, AT, AT - timedelta(seconds=1))


def test_attempt_and_seal_events_carry_their_fields_and_refusals_their_reasons() -> None:
    push = LinePush(line_id=L1)
    push.collect_events()
    attempt = push.start_attempt(7, AT, AT + timedelta(seconds=5))
    push.end_attempt(attempt, "answered")
    push.seal(UUID(int=9))
    started, ended, sealed = push.collect_events()
    assert isinstance(started, LinePush.AttemptStarted)
    assert (started.attempt, started.sequence, started.sent_at) == (1, 7, AT)
    assert isinstance(ended, LinePush.AttemptEnded) and ended.outcome == "answered"
    assert isinstance(sealed, LinePush.Sealed) and sealed.invoice_id == UUID(int=9)
    with pytest.raises(IllegalTransition, match=r"is sealed: its invoice is finalizing$"):
        push.start_attempt(8, AT, AT)
    with pytest.raises(IllegalTransition, match=r"is sealed: the closer repairs it$"):
        push.record_drift([1])


def test_drift_on_an_open_line_is_a_repair_and_what_it_holds_is_not_drift() -> None:
    push = LinePush(line_id=L1)
    push.record_pushed(4, 300, [300], ["ii_1"], "in_1")
    with pytest.raises(ValueError, match=r"\[300\] is what it holds, not drift$"):
        push.record_drift([300])
    assert push.record_drift([200]) == 1
    assert (push.drifted, push.repairs) == (True, 1)
    push.record_pushed(4, 300, [300], ["ii_1"], "in_1")
    assert (push.drifted, push.repairs) == (False, 1)


def test_a_push_from_a_snapshot_taken_before_attempts_existed_starts_them() -> None:
    push = LinePush(line_id=L1)
    del push.__dict__["open_attempts"]  # as an older snapshot loads it
    assert push.in_doubt_until(AT) is None
    push.start_attempt(1, AT, AT + timedelta(seconds=5))
    assert push.in_doubt_until(AT) == AT + timedelta(seconds=5)


def test_expected_items_skip_lines_with_no_push_and_refuse_a_push_whose_lists_disagree() -> None:
    push = LinePush(line_id=L1)
    push.record_pushed(4, 300, [300], ["ii_1"], "in_1")
    assert expected_items([(L2, None), (L1, push)]) == [ExpectedItem(L1, 0, 4, "ii_1", 300)]
    push.amounts = [300, 0]  # never recorded so: the lists always have one entry an item
    with pytest.raises(ValueError):
        expected_items([(L1, push)])


def test_a_draft_is_lost_only_when_stripe_answers_404_for_it() -> None:
    gone = ChargeFailure("http_404", "No such invoice: 'in_1'", retryable=False)
    assert draft_lost(gone) == "http_404: No such invoice: 'in_1'"
    assert draft_lost(_view(("ii_1", 300))) is None  # still there
    assert draft_lost(_view(status="open")) is None  # finalized by hand: not lost
    assert draft_lost(ChargeFailure("http_400", "No such invoice", retryable=False)) is None
    assert draft_lost(ChargeFailure("connection", "reset", retryable=True)) is None
    assert draft_lost(ChargeFailure("http_404", "odd", retryable=True)) is None  # may pass


def test_a_redrafted_push_holds_nothing_on_the_new_draft_and_keeps_its_charges() -> None:
    push = LinePush(line_id=L1)
    push.plan_item(0, 3, 300)
    push.start_attempt(3, AT, AT + timedelta(seconds=60))
    push.record_pushed(3, 300, [300], ["ii_1"], "in_1", requests=1)
    push.record_charges(3, 2)
    push.seal(UUID(int=9))
    push.redraft(2, AT)
    assert (push.draft, push.pushed_sequence, push.pushed_billed) == (2, 0, 0)
    assert (push.item_ids, push.amounts, push.planned, push.stripe_invoice_id) == ([], [], [], None)
    assert not push.sealed and push.in_doubt_until(AT) is None
    assert push.charged_through == 3  # the usage stays charged: it is owed on the new draft
    with pytest.raises(ValueError, match="on draft 2, not before 2"):
        push.redraft(2, AT)
    copy = None
    for event in push.collect_events():
        copy = event.mutate(copy)
    assert isinstance(copy, LinePush) and copy.draft == 2 and copy.item_ids == []
    push.start_attempt(4, AT, AT + timedelta(seconds=60))  # unsealed: pushes go on
