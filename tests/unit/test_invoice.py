"""``domain.invoice.Invoice``: each command's decision, state by state, without services
(the pushers and the closer drive it in ``tests/fast/test_invoices_through_ports.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from domain.errors import IllegalTransition
from domain.ids import invoice_id
from domain.invoice import Invoice
from domain.invoice_states import ALLOWED_FROM, InvoiceState, StripeInvoiceView
from domain.periods import Period

S = InvoiceState
START = datetime(2026, 12, 1, tzinfo=UTC)
PERIOD = Period(START, datetime(2027, 1, 1, tzinfo=UTC))
L1, L2, L3 = UUID(int=1), UUID(int=2), UUID(int=3)
T1, T2 = UUID(int=0x71), UUID(int=0x72)
AT = datetime(2027, 1, 2, tzinfo=UTC)


def _events(invoice: Invoice) -> list[str]:
    return [type(e).__name__ for e in invoice.collect_events()]


def _open() -> Invoice:
    invoice = Invoice.open("acme", "USD", PERIOD, L1)
    invoice.collect_events()
    return invoice


def _closed(*extra: UUID) -> Invoice:
    invoice = _open()
    for line in extra:
        invoice.add_line(line)
    invoice.close("period ended")
    invoice.collect_events()
    return invoice


def _finalizing(total: int = 700) -> Invoice:
    invoice = _closed(L2)
    invoice.start_finalizing([(L1, 4, total - 200), (L2, 2, 200)])
    invoice.collect_events()
    return invoice


def _view(status: str, **changes: object) -> StripeInvoiceView:
    fields: dict[str, object] = {
        "status": status,
        "number": "INV-7",
        "total": 700,
        "amount_paid": 0,
        "attempt_count": 0,
        "next_payment_attempt": None,
        "at": AT,
        "source": "evt_1",
    }
    fields.update(changes)
    return StripeInvoiceView(**fields)  # type: ignore[arg-type]


def _final(state: InvoiceState = S.FINALIZED) -> Invoice:
    invoice = _finalizing()
    invoice.observe(_view("open"))
    if state is S.PAYMENT_FAILED:
        invoice.observe(_view("open", attempt_count=1))
    elif state is S.UNCOLLECTIBLE:
        invoice.observe(_view("uncollectible"))
    invoice.collect_events()
    assert invoice.state is state
    return invoice


def test_opening_names_the_invoice_after_its_customer_currency_and_period() -> None:
    invoice = Invoice.open("acme", "USD", PERIOD, L1)
    assert invoice.id == invoice_id("acme", "USD", PERIOD.key)
    assert invoice.id != Invoice.open("acme", "EUR", PERIOD, L1).id
    assert (invoice.customer_id, invoice.currency, invoice.period, invoice.lines) == (
        "acme",
        "USD",
        PERIOD,
        [L1],
    )
    assert (invoice.state, invoice.is_closed, invoice.is_final) == (S.OPEN, False, False)
    assert _events(invoice) == ["Opened"]


def test_a_line_is_added_once() -> None:
    invoice = _open()
    invoice.add_line(L2)
    invoice.add_line(L2)
    invoice.add_line(L1)
    assert (invoice.lines, _events(invoice)) == ([L1, L2], ["LineAdded"])


def test_no_line_joins_a_closed_invoice() -> None:
    invoice = _closed()
    with pytest.raises(IllegalTransition, match="is closed: cannot add a line"):
        invoice.add_line(L2)
    invoice.add_line(L1)  # one it has: nothing to do
    assert invoice.lines == [L1]


def test_the_draft_is_recorded_once_and_never_once_final() -> None:
    invoice = _open()
    invoice.record_draft("in_1", "cus_1")
    invoice.record_draft("in_2", "cus_2")
    assert (invoice.stripe_invoice_id, invoice.stripe_customer_id) == ("in_1", "cus_1")
    assert _events(invoice) == ["DraftCreated"]
    closed = _closed()
    closed.record_draft("in_3", "cus_3")
    assert closed.stripe_invoice_id == "in_3"
    finalizing = _finalizing()
    with pytest.raises(IllegalTransition, match="cannot record its draft"):
        finalizing.record_draft("in_4", "cus_4")


def test_closing_freezes_the_list_of_lines_and_happens_once() -> None:
    invoice = _open()
    invoice.add_line(L2)
    invoice.collect_events()
    invoice.close("by hand")
    (closed,) = invoice.collect_events()
    assert isinstance(closed, Invoice.Closed)
    assert (closed.lines, closed.reason) == ([str(L1), str(L2)], "by hand")
    assert (invoice.state, invoice.is_closed, invoice.is_final) == (S.CLOSED, True, False)
    with pytest.raises(IllegalTransition, match="cannot close"):
        invoice.close("again")


def test_a_closed_invoice_records_adjustments_until_it_finalizes() -> None:
    invoice = _closed()
    invoice.adjust(L1, [T1, T2], "refund")
    (adjusted,) = invoice.collect_events()
    assert isinstance(adjusted, Invoice.Adjusted)
    assert (adjusted.line_id, adjusted.transaction_ids, adjusted.reason) == (
        L1,
        [str(T1), str(T2)],
        "refund",
    )
    with pytest.raises(IllegalTransition, match="cannot adjust a line"):
        _open().adjust(L1, [T1], "refund")


def test_nothing_due_only_from_closed() -> None:
    invoice = _closed()
    invoice.nothing_due()
    assert (invoice.state, _events(invoice)) == (S.NOTHING_DUE, ["NothingDue"])
    with pytest.raises(IllegalTransition, match="cannot close with nothing due"):
        _open().nothing_due()


def test_finalizing_needs_every_lines_final_total_and_records_their_sum() -> None:
    invoice = _closed(L2)
    with pytest.raises(ValueError, match="needs every line's final total"):
        invoice.start_finalizing([(L1, 4, 500)])
    with pytest.raises(ValueError, match="needs every line's final total"):
        invoice.start_finalizing([(L1, 4, 500), (L2, 2, 200), (L3, 1, 1)])
    invoice.start_finalizing([(L2, 2, 200), (L1, 4, 503)])
    (started,) = invoice.collect_events()
    assert isinstance(started, Invoice.FinalizeStarted)
    assert (started.lines, started.sequences, started.expected_total) == (
        [str(L2), str(L1)],
        [2, 4],
        703,
    )
    assert (invoice.state, invoice.final_sequences, invoice.expected_total) == (
        S.FINALIZING,
        {str(L2): 2, str(L1): 4},
        703,
    )
    assert (invoice.is_closed, invoice.is_final) == (True, False)
    with pytest.raises(IllegalTransition, match="cannot start finalizing"):
        _open().start_finalizing([(L1, 1, 0)])


def test_failed_finalizes_count_from_one_with_the_last_error_and_due_time() -> None:
    invoice = _finalizing()
    invoice.record_finalize_failure("Timeout", "slow", AT, call="finalize", may_have_landed=True)
    invoice.record_finalize_failure(
        "RateLimited", "busy", AT + timedelta(minutes=5), call="finalize", may_have_landed=False
    )
    first, second = invoice.collect_events()
    assert isinstance(first, Invoice.FinalizeFailed)
    assert isinstance(second, Invoice.FinalizeFailed)
    assert (first.attempt, second.attempt) == (1, 2)
    assert (second.error_class, second.message) == ("RateLimited", "busy")
    assert (invoice.finalize_attempts, invoice.last_error, invoice.next_attempt_at) == (
        2,
        "RateLimited: busy",
        AT + timedelta(minutes=5),
    )
    with pytest.raises(IllegalTransition, match="cannot record a failed finalize"):
        _closed().record_finalize_failure(
            "Timeout", "slow", AT, call="finalize", may_have_landed=True
        )


@pytest.mark.parametrize(
    ("failures", "in_doubt"),
    [
        ([], False),
        ([("read back", True)], False),  # a read that timed out changed nothing
        ([("repair", True)], False),  # a repair in doubt has its own landing window
        ([("finalize", False)], False),  # refused (a 429): it will never finalize
        ([("finalize", True)], True),  # a timeout: it may have finalized, answer lost
        ([("finalize", True), ("finalize", False)], True),  # a later refusal clears nothing
        ([("read back", False), ("finalize", True), ("read back", True)], True),
    ],
)
def test_only_a_finalize_that_may_have_landed_makes_the_next_one_look_first(
    failures: list[tuple[str, bool]], in_doubt: bool
) -> None:
    invoice = Invoice.open("acme", "USD", PERIOD, L1)
    invoice.close("period ended")
    invoice.start_finalizing([(L1, 4, 700)])
    for call, landed in failures:
        invoice.record_finalize_failure("E", "m", AT, call=call, may_have_landed=landed)
    assert invoice.finalize_in_doubt is in_doubt
    replayed = None
    for recorded in invoice.collect_events():  # what a reload of its history finds
        replayed = recorded.mutate(replayed)
    assert isinstance(replayed, Invoice)
    assert (replayed.finalize_in_doubt, replayed.finalize_attempts) == (in_doubt, len(failures))


# -- what Stripe says ---------------------------------------------------------------------


def test_an_open_view_finalizes_with_stripes_number_and_total() -> None:
    invoice = _finalizing()
    invoice.record_finalize_failure("Timeout", "slow", AT, call="finalize", may_have_landed=True)
    invoice.collect_events()
    assert invoice.observe(_view("open", number="INV-9", total=700)) is True
    (finalized,) = invoice.collect_events()
    assert isinstance(finalized, Invoice.Finalized)
    assert (finalized.number, finalized.total, invoice.mismatch, invoice.attention) == (
        "INV-9", 700, None, None,
    )  # fmt: skip


def test_a_finalized_total_other_than_expected_is_a_recorded_mismatch_needing_attention() -> None:
    invoice = _finalizing()
    invoice.record_finalize_failure("Timeout", "slow", AT, call="finalize", may_have_landed=True)
    invoice.collect_events()
    assert invoice.observe(_view("open", number="INV-9", total=703)) is True
    finalized, mismatch = invoice.collect_events()
    assert isinstance(mismatch, Invoice.MismatchFound)
    assert (mismatch.expected_total, mismatch.stripe_total, mismatch.source) == (700, 703, "evt_1")
    assert invoice.mismatch == (700, 703)
    assert invoice.attention == "Stripe finalized 7.03 USD where the ledger expected 7.00 USD"
    assert isinstance(finalized, Invoice.Finalized)
    assert (finalized.number, finalized.total, finalized.finalized_at, finalized.source) == (
        "INV-9",
        703,
        AT,
        "evt_1",
    )
    assert (invoice.state, invoice.number, invoice.total, invoice.next_attempt_at) == (
        S.FINALIZED,
        "INV-9",
        703,
        None,
    )
    assert invoice.is_final is True
    assert invoice.observe(_view("open", number="INV-9", total=703)) is False


def test_a_view_without_a_number_finalizes_with_an_empty_one() -> None:
    invoice = _finalizing()
    invoice.observe(_view("open", number=None))
    assert invoice.number == ""


@pytest.mark.parametrize("state", [S.OPEN, S.CLOSED, S.NOTHING_DUE, S.VOID, S.PAID])
def test_views_of_an_invoice_not_being_finalized_or_done_record_nothing(
    state: InvoiceState,
) -> None:
    invoice = _closed()
    invoice.state = state
    for status in ("open", "paid", "void", "uncollectible"):
        assert invoice.observe(_view(status, attempt_count=3, amount_paid=700)) is False
    assert invoice.collect_events() == []


def test_a_draft_view_records_nothing() -> None:
    invoice = _finalizing()
    assert invoice.observe(_view("draft")) is False
    assert invoice.state is S.FINALIZING


def test_payment_failures_are_recorded_when_stripe_counts_more_attempts() -> None:
    invoice = _final()
    assert invoice.observe(_view("open", attempt_count=2, next_payment_attempt=AT)) is True
    (failed,) = invoice.collect_events()
    assert isinstance(failed, Invoice.PaymentFailed)
    assert (failed.attempt, failed.next_payment_attempt, failed.source) == (2, AT, "evt_1")
    assert (invoice.state, invoice.payment_attempts) == (S.PAYMENT_FAILED, 2)
    assert invoice.observe(_view("open", attempt_count=2)) is False
    assert invoice.observe(_view("open", attempt_count=1)) is False
    assert invoice.observe(_view("open", attempt_count=3)) is True


def test_paid_records_the_amount_from_a_final_state() -> None:
    for state in (S.FINALIZED, S.PAYMENT_FAILED, S.UNCOLLECTIBLE):
        invoice = _final(state)
        assert invoice.observe(_view("paid", amount_paid=650)) is True
        assert _events(invoice) == ["Paid"]
        assert (invoice.state, invoice.amount_paid) == (S.PAID, 650)
        assert invoice.is_final is True


def test_paid_before_finalized_records_both_in_order() -> None:
    invoice = _finalizing()
    assert invoice.observe(_view("paid", amount_paid=700)) is True
    assert _events(invoice) == ["Finalized", "Paid"]


def test_uncollectible_then_void() -> None:
    invoice = _final(S.PAYMENT_FAILED)
    assert invoice.observe(_view("uncollectible")) is True
    assert invoice.observe(_view("uncollectible")) is False
    assert invoice.observe(_view("void")) is True
    assert _events(invoice) == ["MarkedUncollectible", "Voided"]
    assert (invoice.state, invoice.is_final) == (S.VOID, True)


def test_an_unknown_status_records_only_the_finalize_it_implies() -> None:
    invoice = _finalizing()
    assert invoice.observe(_view("deleted")) is True
    assert _events(invoice) == ["Finalized"]
    assert invoice.observe(_view("deleted")) is False


# -- credits --------------------------------------------------------------------------


def test_credits_are_requested_once_per_transaction_up_to_the_total() -> None:
    invoice = _final()
    invoice.request_credit(T1, 300, "refund")
    with pytest.raises(IllegalTransition, match="is credited already"):
        invoice.request_credit(T1, 1, "again")
    with pytest.raises(
        ValueError, match=r"credits of 7\.01 USD would exceed its total of 7\.00 USD$"
    ):
        invoice.request_credit(T2, 401, "too much")
    invoice.request_credit(T2, 400, "the rest")
    assert invoice.credit_total_requested == 700
    assert invoice.credits_requested == {str(T1): 300, str(T2): 400}
    assert invoice.credit_reasons == {str(T1): "refund", str(T2): "the rest"}
    assert invoice.credits_pending() == [(T1, 300), (T2, 400)]
    requested = invoice.collect_events()
    assert [(e.transaction_id, e.amount, e.reason) for e in requested] == [  # type: ignore[attr-defined]
        (T1, 300, "refund"),
        (T2, 400, "the rest"),
    ]


def test_a_credit_cannot_be_negative_and_zero_is_allowed() -> None:
    invoice = _final()
    with pytest.raises(ValueError, match="cannot be negative: -1"):
        invoice.request_credit(T1, -1, "refund")
    invoice.request_credit(T1, 0, "nothing billed")
    assert invoice.credits_requested == {str(T1): 0}


def test_credits_are_requested_from_finalizing_on_not_before() -> None:
    _finalizing().request_credit(T1, 5, "refund")
    for invoice in (_open(), _closed()):
        with pytest.raises(IllegalTransition, match="cannot request a credit"):
            invoice.request_credit(T1, 5, "refund")


def test_a_credit_note_is_recorded_once_and_settles_its_request() -> None:
    invoice = _final()
    invoice.request_credit(T1, 300, "refund")
    invoice.request_credit(T2, 100, "refund")
    assert invoice.record_credit(T1, "cn_1", 300, "evt_9") is True
    assert invoice.record_credit(T1, "cn_1", 300, "evt_9") is False
    assert invoice.record_credit(None, "cn_x", 50, "evt_10") is True  # made outside
    assert invoice.credited == {"cn_1": str(T1), "cn_x": ""}
    assert invoice.credited_amount == 350
    assert invoice.credits_pending() == [(T2, 100)]
    events = invoice.collect_events()
    assert [type(e).__name__ for e in events] == [
        "CreditRequested",
        "CreditRequested",
        "Credited",
        "Credited",
    ]
    note = events[2]
    assert isinstance(note, Invoice.Credited)
    assert (note.transaction_id, note.credit_note_id, note.amount, note.source) == (
        T1,
        "cn_1",
        300,
        "evt_9",
    )


def test_credit_notes_are_recorded_only_once_final() -> None:
    with pytest.raises(IllegalTransition, match="cannot record a credit note"):
        _finalizing().record_credit(T1, "cn_1", 5, "evt")


def test_the_transition_table_is_what_the_commands_enforce() -> None:
    assert ALLOWED_FROM["Credited"] == (S.FINALIZED, S.PAYMENT_FAILED, S.PAID, S.UNCOLLECTIBLE)
    assert ALLOWED_FROM["CreditRequested"] == (
        S.FINALIZING,
        S.FINALIZED,
        S.PAYMENT_FAILED,
        S.PAID,
        S.UNCOLLECTIBLE,
    )


def test_the_final_states_record_when_and_from_which_stripe_event() -> None:
    paid_at = AT + timedelta(hours=5)
    paid = _final()
    paid.observe(_view("paid", amount_paid=650, at=paid_at, source="evt_paid"))
    [event] = paid.collect_events()
    assert isinstance(event, Invoice.Paid)
    assert (event.amount_paid, event.paid_at, event.source) == (650, paid_at, "evt_paid")
    lost = _final()
    lost.observe(_view("uncollectible", source="evt_lost"))
    lost.observe(_view("void", source="evt_void"))
    marked, voided = lost.collect_events()
    assert isinstance(marked, Invoice.MarkedUncollectible) and marked.source == "evt_lost"
    assert isinstance(voided, Invoice.Voided) and voided.source == "evt_void"


def test_drift_is_recorded_with_its_repair_and_the_repair_ends_when_answered() -> None:
    invoice = _finalizing()
    lands_by = AT + timedelta(seconds=60)
    repair = invoice.record_drift([["l", "0", "4", "ii_1", "500", "400"]], 600, lands_by)
    assert (repair, invoice.repairs, invoice.in_doubt_until(AT)) == (1, 1, lands_by)
    assert invoice.in_doubt_until(lands_by) is None
    invoice.record_repaired(2)  # not the newest repair: nothing
    assert invoice.repair_lands_by == lands_by
    invoice.record_repaired(1)
    assert invoice.in_doubt_until(AT) is None
    drift, repaired = invoice.collect_events()
    assert isinstance(drift, Invoice.DriftFound) and isinstance(repaired, Invoice.Repaired)
    assert (drift.expected_total, drift.stripe_total, drift.drifts) == (
        700, 600, [["l", "0", "4", "ii_1", "500", "400"]],
    )  # fmt: skip
    assert invoice.record_drift([["l", "0", "4", "ii_1", "500", "450"]], 650, lands_by) == 2
    with pytest.raises(ValueError, match="at least one item"):
        invoice.record_drift([], 650, lands_by)


def test_a_repair_not_sent_ends_its_doubt_and_is_no_repair_but_keeps_its_number() -> None:
    invoice = Invoice.open("acme", "USD", PERIOD, L1)
    invoice.close("period ended")
    invoice.start_finalizing([(L1, 4, 700)])
    lands_by = AT + timedelta(seconds=60)
    first = invoice.record_drift([["l", "0", "4", "ii_1", "500", "400"]], 600, lands_by)
    invoice.record_repair_not_sent(2)  # not the newest repair: nothing
    assert invoice.repair_lands_by == lands_by
    invoice.record_repair_not_sent(first)
    invoice.record_repair_not_sent(first)  # once
    assert (invoice.repairs, invoice.repairs_sent, invoice.in_doubt_until(AT)) == (1, 0, None)
    second = invoice.record_drift([["l", "0", "4", "ii_1", "500", "400"]], 600, lands_by)
    invoice.record_repaired(second)
    assert (second, invoice.repairs_sent) == (2, 1)  # a key of its own; one repair sent
    history = invoice.collect_events()
    assert [type(e) for e in history[-4:]] == [
        Invoice.DriftFound, Invoice.RepairNotSent, Invoice.DriftFound, Invoice.Repaired,
    ]  # fmt: skip
    replayed = None
    for recorded in history:  # what a reload of its history finds
        replayed = recorded.mutate(replayed)
    assert isinstance(replayed, Invoice)
    assert (replayed.repairs, replayed.repairs_sent) == (2, 1)
    with pytest.raises(IllegalTransition, match=r"is closed: cannot record a repair not sent$"):
        _closed(L2).record_repair_not_sent(1)


def test_only_a_draft_equal_to_the_expected_total_is_verified_and_only_while_finalizing() -> None:
    invoice = _finalizing()
    with pytest.raises(ValueError, match=r": verified 6\.99 USD, expected 7\.00 USD$"):
        invoice.record_verified(699, 2)
    invoice.record_verified(700, 2)
    assert invoice.verified is True
    invoice.record_drift([["l", "0", "4", "ii_1", "500", "400"]], 600, AT)
    assert invoice.verified is False  # drift found since: read again before finalizing
    with pytest.raises(IllegalTransition):
        _closed(L2).record_verified(0, 0)


def test_attention_stops_the_invoice_until_settled_by_someone_saying_how() -> None:
    invoice = _finalizing()
    invoice.record_verified(700, 2)
    invoice.collect_events()
    invoice.need_attention("an item the ledger did not make")
    invoice.need_attention("an item the ledger did not make")  # once per reason
    assert (invoice.attention, invoice.verified) == ("an item the ledger did not make", False)
    with pytest.raises(ValueError, match="how and who"):
        invoice.settle_attention("", "ops")
    invoice.settle_attention("deleted it by hand", "ops@example.com")
    assert invoice.attention is None
    needed, settled = invoice.collect_events()
    assert isinstance(needed, Invoice.AttentionNeeded)
    assert isinstance(settled, Invoice.AttentionSettled)
    assert (settled.how, settled.by) == ("deleted it by hand", "ops@example.com")
    with pytest.raises(IllegalTransition, match="needs no attention"):
        invoice.settle_attention("again", "ops")
    with pytest.raises(ValueError, match="needs a reason"):
        invoice.need_attention("  ")


def test_the_read_back_events_carry_their_fields_and_refuse_with_their_reasons() -> None:
    invoice = _finalizing()
    invoice.record_verified(700, 2)
    repair = invoice.record_drift([["l", "0", "4", "ii_1", "500", "400"]], 600, AT)
    invoice.record_repaired(repair)
    verified, drift, repaired = invoice.collect_events()
    assert isinstance(verified, Invoice.Verified) and (verified.total, verified.items) == (700, 2)
    assert isinstance(drift, Invoice.DriftFound) and (drift.repair, drift.lands_by) == (1, AT)
    assert isinstance(repaired, Invoice.Repaired) and repaired.repair == 1
    opened = _closed(L2)
    with pytest.raises(IllegalTransition, match=r"is closed: cannot record a verified draft$"):
        opened.record_verified(0, 0)
    with pytest.raises(IllegalTransition, match=r"is closed: cannot record drift$"):
        opened.record_drift([["x"]], 0, AT)
    with pytest.raises(IllegalTransition, match=r"is closed: cannot record a repair$"):
        opened.record_repaired(1)
    with pytest.raises(ValueError, match=r"^drift needs at least one item that differs$"):
        invoice.record_drift([], 0, AT)
    with pytest.raises(ValueError, match=r"^attention needs a reason$"):
        invoice.need_attention("")
    invoice.need_attention("why")
    with pytest.raises(ValueError, match=r"^settling needs how and who$"):
        invoice.settle_attention("how", " ")


def test_a_checked_open_draft_is_recorded_with_its_total_items_and_drifted_lines() -> None:
    invoice = _closed(L2)
    invoice.collect_events()
    invoice.record_checked(650, 3, [L1])
    (checked,) = invoice.collect_events()
    assert isinstance(checked, Invoice.DraftChecked)
    assert (checked.total, checked.items, checked.drifted) == (650, 3, [str(L1)])
    with pytest.raises(IllegalTransition, match=r"is finalizing: cannot record a checked draft$"):
        _finalizing().record_checked(0, 0, [])


def test_a_failed_credit_note_is_recorded_with_its_transaction_and_refused_before_final() -> None:
    invoice = _finalizing()
    invoice.observe(_view("open", total=700))
    invoice.collect_events()
    txn = UUID(int=77)
    invoice.record_credit_failure(txn, "http_503", "down", AT)
    (failed,) = invoice.collect_events()
    assert isinstance(failed, Invoice.CreditFailed)
    assert (failed.transaction_id, failed.attempt, failed.error_class, failed.message) == (
        txn, 1, "http_503", "down",
    )  # fmt: skip
    assert (invoice.credit_attempts, invoice.credit_due) == (1, AT)
    with pytest.raises(IllegalTransition, match=r"cannot record a failed credit note$"):
        _finalizing().record_credit_failure(txn, "x", "y", AT)


def test_a_lost_draft_is_replaced_only_on_a_stopped_invoice_with_a_draft_not_final() -> None:
    fresh = _open()
    fresh.need_attention("x")
    assert (
        fresh.draft_kept()
        == f"invoice {fresh.id} has no draft in Stripe yet: its next push makes one"
    )
    invoice = _closed(L2)
    invoice.record_draft("in_1", "cus_1")
    invoice.start_finalizing([(L1, 4, 500), (L2, 2, 200)])
    assert invoice.draft_kept() is not None and "needs no attention" in invoice.draft_kept()  # type: ignore[operator]
    with pytest.raises(IllegalTransition, match="needs no attention"):
        invoice.replace_draft("http_404: gone", "deleted", "ops")
    invoice.record_verified(700, 2)
    invoice.need_attention("Stripe refused the read back: http_404: No such invoice")
    with pytest.raises(ValueError, match="Stripe's answer, how and who"):
        invoice.replace_draft("http_404: gone", "deleted", " ")
    invoice.collect_events()
    assert invoice.replace_draft("http_404: gone", "deleted by mistake", "ops") == 2
    [replaced] = invoice.collect_events()
    assert isinstance(replaced, Invoice.DraftReplaced)
    assert (replaced.lost, replaced.why, replaced.draft) == ("in_1", "http_404: gone", 2)
    assert (replaced.how, replaced.by) == ("deleted by mistake", "ops")
    # Closed again, its draft forgotten, nothing of the lost draft's read back kept.
    assert invoice.state is S.CLOSED and invoice.stripe_invoice_id is None
    assert (invoice.attention, invoice.verified, invoice.final_sequences) == (None, False, {})
    assert (invoice.repairs, invoice.finalize_attempts, invoice.finalize_in_doubt) == (0, 0, False)
    invoice.record_draft("in_2", "cus_1")  # the next push's draft is recorded
    assert invoice.stripe_invoice_id == "in_2" and invoice.draft == 2
    final = _final()
    final.need_attention("looked wrong")
    with pytest.raises(IllegalTransition, match="is finalized: cannot replace its draft"):
        final.replace_draft("http_404: gone", "x", "y")


def test_an_open_invoice_keeps_taking_usage_after_its_draft_is_replaced() -> None:
    invoice = _open()
    invoice.record_draft("in_1", "cus_1")
    invoice.need_attention("its invoice cannot be read")
    invoice.replace_draft("http_404: No such invoice", "deleted", "ops")
    assert invoice.state is S.OPEN and invoice.draft == 2
    invoice.add_line(L2)
    assert invoice.lines == [L1, L2]
