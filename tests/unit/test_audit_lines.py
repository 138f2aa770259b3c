"""``domain.audit_lines``: the folds of invoice lines and their pushes, and the checks
that tie them to the transactions and to Stripe's items (the line reconciliation).

Stripe's side is a plain list of ``InvoiceItem`` values (what the audit's Stripe port
reads), so every check runs here without services. The data is asymmetric on
purpose: amounts whose sum rounds differently from their parts, findings that are not
the first thing checked, values on both sides of every boundary.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from domain.audit import Finding, InvoiceItem, TxnAudit
from domain.audit_lines import LineAudit, PushAudit, check_line_items, check_lines
from domain.transaction import TxnState

LINE = "00000000-0000-0000-0000-00000000000a"
LINE_B = "00000000-0000-0000-0000-00000000000b"


def _line(line_id: str = LINE) -> LineAudit:
    return LineAudit.opened(
        line_id,
        {
            "customer_id": "acme",
            "currency": "USD",
            "meter": "api.requests",
            "period_start": "2026-12-01T00:00:00+00:00",
        },
    )


def _settled(ids: list[str], amounts: list[str], total: str, billed: int, n: int) -> dict[str, Any]:
    return {
        "transaction_ids": ids,
        "amounts": amounts,
        "exact_total": total,
        "billed": billed,
        "transactions": n,
    }


def _held_line() -> LineAudit:
    """t1 (0.3) and t2 (0.25) at v2, t3 (1.2) at v3: 1.75 exact, billed 2."""
    line = _line()
    line.apply("Settled", _settled(["t1", "t2"], ["0.3", "0.25"], "0.55", 1, 2), 2)
    line.apply("Settled", _settled(["t3"], ["1.2"], "1.75", 2, 3), 3)
    return line


def _push(line_id: str = LINE) -> PushAudit:
    return PushAudit("push-" + line_id, line_id, "USD")


def _pushed(sequence: int, billed: int, amounts: list[int], items: list[str]) -> dict[str, Any]:
    return {
        "sequence": sequence,
        "billed": billed,
        "amounts": amounts,
        "item_ids": items,
        "stripe_invoice_id": "in_1",
    }


def _txn(txn_id: str, amount: str, line: str | None = LINE, version: int | None = 2) -> TxnAudit:
    txn = TxnAudit(txn_id, "acme", "u", "api.requests", "1", Decimal(amount), "USD", "t")
    txn.state, txn.line_id, txn.line_version = TxnState.RESERVED, line, version
    return txn


# -- the line's fold ----------------------------------------------------------------------


def test_opened_keeps_the_lines_identity_and_starts_empty_at_version_one() -> None:
    line = _line()
    assert (line.line_id, line.customer_id, line.currency, line.meter, line.period_start) == (
        LINE,
        "acme",
        "USD",
        "api.requests",
        "2026-12-01T00:00:00+00:00",
    )
    assert (line.exact_total, line.billed, line.transactions, line.sequence) == (0, 0, 0, 1)
    assert (line.members, line.billed_at, line.problems) == ({}, {1: 0}, [])


def test_settled_adds_members_and_rounds_the_exact_total_once_half_up() -> None:
    line = _held_line()
    assert line.members == {
        "t1": (Decimal("0.3"), 2),
        "t2": (Decimal("0.25"), 2),
        "t3": (Decimal("1.2"), 3),
    }
    assert (line.exact_total, line.billed, line.transactions, line.sequence) == (
        Decimal("1.75"),
        2,
        3,
        3,
    )
    assert line.billed_at == {1: 0, 2: 1, 3: 2}
    assert line.problems == []


def test_a_line_sums_exactly_beyond_the_default_precision() -> None:
    big, tiny = "1" + "0" * 30, "0." + "0" * 30 + "1"
    total = "1" + "0" * 30 + tiny[1:]
    line = _line()
    line.apply("Settled", _settled(["a", "b"], [big, tiny], total, int(big), 2), 2)
    assert line.exact_total == Decimal(total)
    assert line.problems == []


def test_frozen_starts_a_new_sequence_at_the_same_total_and_reads_no_amounts() -> None:
    line = _held_line()
    line.apply("Frozen", {}, 5)  # Frozen carries no transactions, amounts or totals
    assert (line.exact_total, line.billed, line.transactions, line.sequence) == (
        Decimal("1.75"),
        2,
        3,
        5,
    )
    assert line.billed_at == {1: 0, 2: 1, 3: 2, 5: 2}
    assert set(line.members) == {"t1", "t2", "t3"}
    assert line.problems == []


def test_removed_takes_the_transaction_out_at_its_amount() -> None:
    line = _held_line()
    line.apply("Removed", _settled(["t3"], ["1.2"], "0.55", 1, 2) | {"reason": "refund"}, 4)
    assert set(line.members) == {"t1", "t2"}
    assert (line.exact_total, line.billed, line.transactions, line.sequence) == (
        Decimal("0.55"),
        1,
        2,
        4,
    )
    assert line.billed_at[4] == 1
    assert line.problems == []


@pytest.mark.parametrize(
    ("txn", "amount", "removed", "held"),
    [("t3", "1.1", "0.011 USD", "0.012 USD"), ("t9", "1.2", "0.012 USD", "nothing")],
)
def test_removing_what_the_line_does_not_hold_is_a_problem(
    txn: str, amount: str, removed: str, held: str
) -> None:
    line = _held_line()
    total = Decimal("1.75") - Decimal(amount)
    n = 2 if txn == "t3" else 3
    line.apply("Removed", _settled([txn], [amount], str(total), round(total), n), 4)
    assert line.problems == [f"v4: removes {txn} ({removed}), which the line holds as {held}"]


def test_settling_a_transaction_twice_is_a_problem() -> None:
    line = _held_line()
    line.apply("Settled", _settled(["t2"], ["0.25"], "2.00", 2, 3), 4)
    assert line.problems == ["v4: t2 settled twice"]


@pytest.mark.parametrize(
    ("recorded", "shown"),
    [
        (("1.76", 2, 3), "total 0.0176 USD, billed 0.02 USD, 3 transactions"),
        (("1.75", 1, 3), "total 0.0175 USD, billed 0.01 USD, 3 transactions"),
        (("1.75", 2, 2), "total 0.0175 USD, billed 0.02 USD, 2 transactions"),
    ],
    ids=["exact total", "billed", "transactions"],
)
def test_a_change_that_records_other_totals_than_its_amounts_make_is_a_problem(
    recorded: tuple[str, int, int], shown: str
) -> None:
    line = _line()
    line.apply("Settled", _settled(["t1", "t2"], ["0.3", "0.25"], "0.55", 1, 2), 2)
    total, billed, n = recorded
    line.apply("Settled", _settled(["t3"], ["1.2"], total, billed, n), 3)
    assert line.problems == [
        f"v3: records {shown}; its amounts make 0.0175 USD, 0.02 USD, 3 transactions"
    ]


def test_ids_and_amounts_of_different_lengths_are_a_problem() -> None:
    line = _line()
    line.apply("Settled", _settled(["t1", "t2"], ["0.3"], "0.3", 0, 1), 2)
    assert line.problems == ["v2: 2 transactions, 1 amounts"]
    assert line.members == {"t1": (Decimal("0.3"), 2)}


# -- the push's fold ----------------------------------------------------------------------


def test_a_push_records_what_stripe_acknowledged() -> None:
    push = _push()
    push.apply("PushFailed", {"sequence": 2, "retryable": True}, 2)
    push.apply("Pushed", _pushed(3, 7, [5, 2], ["ii_a", "ii_b"]), 3)
    assert (push.pushed_sequence, push.pushed_billed, push.amounts, push.item_ids) == (
        3,
        7,
        [5, 2],
        ["ii_a", "ii_b"],
    )
    assert (push.stripe_invoice_id, push.acknowledged) == ("in_1", {3: 7})
    assert (push.failing, push.unknown, push.problems) == (False, [], [])


def test_a_redrafted_push_holds_nothing_until_pushed_again_and_keeps_its_charges() -> None:
    push = _push()
    push.apply("Pushed", _pushed(3, 7, [7], ["ii_a"]), 2)
    push.apply("ChargesRecorded", {"through": 3}, 3)
    push.apply("PushFailed", {"sequence": 4, "retryable": True}, 4)
    push.apply("Redrafted", {"draft": 2}, 5)
    assert (push.pushed_sequence, push.amounts, push.item_ids) == (0, [], [])
    assert (push.stripe_invoice_id, push.failing, push.unknown) == (None, False, [])
    assert (push.charged_through, push.acknowledged) == (3, {3: 7})
    push.apply("Pushed", _pushed(4, 9, [9], ["ii_b"]), 6)  # the new draft's item
    push.apply("ChargesRecorded", {"through": 4}, 7)
    assert (push.item_ids, push.charged_through, push.problems) == (["ii_b"], 4, [])


def test_a_push_of_an_older_sequence_or_of_items_not_adding_up_is_a_problem() -> None:
    push = _push()
    push.apply("Pushed", _pushed(5, 7, [7], ["ii_a"]), 2)
    push.apply("Pushed", _pushed(5, 7, [7], ["ii_a"]), 3)  # the same again: fine
    push.apply("Pushed", _pushed(4, 9, [5, 3], ["ii_a", "ii_b"]), 4)
    assert push.problems == [
        "v4: acknowledges sequence 4 after 5",
        "v4: items 0.05 USD + 0.03 USD are not 0.09 USD",
    ]
    assert push.acknowledged == {5: 7, 4: 9}


def test_a_failed_push_without_an_answer_may_have_set_its_total() -> None:
    push = _push()
    push.apply("PushFailed", {"sequence": 2, "retryable": False}, 2)
    assert (push.failing, push.unknown) == (True, [])
    push.apply("PushFailed", {"sequence": 3, "retryable": True}, 3)
    push.apply("PushFailed", {"sequence": 4, "retryable": True}, 4)
    assert (push.failing, push.unknown) == (True, [3, 4])


@pytest.mark.parametrize(("through", "ok"), [(2, False), (3, True), (5, True), (6, False)])
def test_charges_are_recorded_after_the_last_and_never_past_the_push(
    through: int, ok: bool
) -> None:
    push = _push()
    push.apply("Pushed", _pushed(5, 7, [7], ["ii_a"]), 2)
    push.apply("ChargesRecorded", {"through": 2}, 3)
    push.apply("ChargesRecorded", {"through": through}, 4)
    expected = [] if ok else [f"v4: charges through {through}, pushed 5, charged through 2"]
    assert push.problems == expected
    assert push.charged_through == through


def test_other_events_of_a_push_change_nothing() -> None:
    push = _push()
    push.apply("ItemPlanned", {"chunk": 0, "sequence": 2, "amount": 9}, 2)
    assert push == _push()


# -- lines, pushes and transactions together ----------------------------------------------


def _agreeing() -> tuple[dict[str, LineAudit], dict[str, PushAudit], dict[str, TxnAudit]]:
    line = _held_line()
    push = _push()
    push.apply("Pushed", _pushed(2, 1, [1], ["ii_a"]), 2)
    push.apply("Pushed", _pushed(3, 2, [2], ["ii_a"]), 3)
    txns = {"t1": _txn("t1", "0.3"), "t2": _txn("t2", "0.25"), "t3": _txn("t3", "1.2", version=3)}
    txns["t1"].state, txns["t1"].line_sequence = TxnState.CHARGED, 3
    return {LINE: line}, {push.push_id: push}, txns


def test_lines_pushes_and_transactions_that_agree_have_no_findings() -> None:
    assert check_lines(*_agreeing()) == []


def test_the_folds_own_problems_are_findings_of_their_line() -> None:
    lines, pushes, txns = _agreeing()
    lines[LINE].problems.append("v9: line trouble")
    next(iter(pushes.values())).problems.append("v9: push trouble")
    assert check_lines(lines, pushes, txns) == [
        Finding("line", LINE, "v9: line trouble"),
        Finding("line", LINE, "v9: push trouble"),
    ]


def test_a_push_must_acknowledge_what_its_line_billed_at_that_sequence() -> None:
    lines, pushes, txns = _agreeing()
    orphan = _push(LINE_B)
    wrong = next(iter(pushes.values()))
    wrong.acknowledged[2] = 5
    wrong.acknowledged[7] = 2
    found = check_lines(lines, {orphan.push_id: orphan, wrong.push_id: wrong}, txns)
    assert found == [
        Finding("line", LINE_B, "pushed, but no such line"),
        Finding(
            "line",
            LINE,
            "Stripe acknowledged 0.05 USD at sequence 2; the line billed 0.01 USD then",
        ),
        Finding(
            "line", LINE, "Stripe acknowledged 0.02 USD at sequence 7; the line billed none then"
        ),
    ]


def test_a_transaction_held_by_two_lines_is_found() -> None:
    lines, pushes, txns = _agreeing()
    other = _line(LINE_B)
    other.apply("Settled", _settled(["t2"], ["0.25"], "0.25", 0, 1), 2)
    found = check_lines({LINE: lines[LINE], LINE_B: other}, pushes, txns)
    assert found == [
        Finding("line", "t2", f"in lines {LINE} and {LINE_B}"),
        Finding("line", "t2", f"line {LINE_B} took it at v2; the transaction says {LINE} at v2"),
    ]


def test_a_line_must_hold_only_transactions_that_say_they_joined_it_then() -> None:
    lines, pushes, txns = _agreeing()
    txns["t2"].line_version = 3
    txns["t3"].amount = Decimal("1.21")
    del txns["t1"]
    found = check_lines(lines, pushes, txns)
    assert found == [
        Finding("line", LINE, "holds t1, no such transaction"),
        Finding("line", "t2", f"line {LINE} took it at v2; the transaction says {LINE} at v3"),
        Finding("line", "t3", "in its line as 0.012 USD, metered 0.0121 USD"),
    ]


def test_a_compensated_transaction_must_have_left_its_line() -> None:
    lines, pushes, txns = _agreeing()
    txns["t3"].state = TxnState.COMPENSATED
    assert check_lines(lines, pushes, txns) == [
        Finding("line", "t3", f"compensated, but still in line {LINE}")
    ]
    del lines[LINE].members["t3"]
    assert check_lines(lines, pushes, txns) == []


def test_a_transaction_credited_after_finalizing_stays_in_its_final_line() -> None:
    lines, pushes, txns = _agreeing()
    txns["t2"].state = txns["t3"].state = TxnState.COMPENSATED
    # t2 was reversed by a credit note (its line is final); t3 was compensated otherwise
    assert check_lines(lines, pushes, txns, credited={"t2", "elsewhere"}) == [
        Finding("line", "t3", f"compensated, but still in line {LINE}")
    ]
    assert check_lines(lines, pushes, txns, credited=frozenset({"t2", "t3"})) == []
    assert check_lines(lines, pushes, txns) == [
        Finding("line", "t2", f"compensated, but still in line {LINE}"),
        Finding("line", "t3", f"compensated, but still in line {LINE}"),
    ]


def test_a_transaction_must_be_in_the_line_it_names() -> None:
    lines, pushes, txns = _agreeing()
    txns["x"] = _txn("x", "1", line=LINE_B)
    txns["y"] = _txn("y", "1")
    txns["z"] = _txn("z", "1", line=None, version=None)  # from before lines: not here
    assert check_lines(lines, pushes, txns) == [
        Finding("line", "x", f"names line {LINE_B}, no such line"),
        Finding("line", "y", f"not in its line {LINE}"),
    ]


@pytest.mark.parametrize(("sequence", "ok"), [(None, False), (2, True), (3, True), (4, False)])
def test_a_charged_transaction_was_charged_at_a_sequence_stripe_acknowledged(
    sequence: int | None, ok: bool
) -> None:
    lines, pushes, txns = _agreeing()
    txns["t2"].state, txns["t2"].line_sequence = TxnState.CHARGED, sequence
    expected = [f"charged at line sequence {sequence}; Stripe acknowledged 3"]
    assert [f.detail for f in check_lines(lines, pushes, txns)] == ([] if ok else expected)


def test_a_charged_transaction_of_a_line_never_pushed_is_found() -> None:
    lines, _, txns = _agreeing()
    assert check_lines(lines, {}, txns) == [
        Finding("line", "t1", "charged at line sequence 3; Stripe acknowledged 0")
    ]


# -- the line reconciliation with Stripe's items ------------------------------------------


def _item(item_id: str, amount: int, line: str | None = LINE) -> InvoiceItem:
    return InvoiceItem(item_id, None, amount, "usd", line_id=line)


def _stripe_side() -> tuple[dict[str, PushAudit], dict[str, LineAudit]]:
    lines, pushes, _ = _agreeing()
    push = next(iter(pushes.values()))
    push.apply("Pushed", _pushed(3, 150_000_001, [99_999_999, 50_000_002], ["ii_a", "ii_b"]), 4)
    lines[LINE].billed_at[3] = 150_000_001
    return pushes, lines


def test_stripe_holding_exactly_the_newest_push_agrees() -> None:
    pushes, lines = _stripe_side()
    items = [_item("ii_b", 50_000_002), _item("ii_a", 99_999_999), _item("old", 3, None)]
    assert check_line_items(items, pushes, lines) == []


@pytest.mark.parametrize(
    ("items", "held"),
    [
        ([_item("ii_a", 99_999_999)], "ii_a 999999.99 USD"),
        (
            [_item("ii_a", 99_999_999), _item("ii_b", 50_000_003)],
            "ii_a 999999.99 USD, ii_b 500000.03 USD",
        ),
        (
            [_item("ii_a", 99_999_999), _item("ii_c", 50_000_002)],
            "ii_a 999999.99 USD, ii_c 500000.02 USD",
        ),
        (
            [_item("ii_a", 99_999_999), _item("ii_b", 50_000_002), _item("ii_c", 0)],
            "ii_a 999999.99 USD, ii_b 500000.02 USD, ii_c 0.00 USD",
        ),
    ],
    ids=["missing", "amount", "other id", "extra"],
)
def test_stripe_holding_anything_else_is_a_finding(items: list[InvoiceItem], held: str) -> None:
    pushes, lines = _stripe_side()
    assert check_line_items(items, pushes, lines) == [
        Finding(
            "stripe",
            LINE,
            f"Stripe holds {held}; the newest acknowledged push (sequence 3) is"
            " ii_a 999999.99 USD, ii_b 500000.02 USD",
        )
    ]


def test_items_of_a_line_stripe_never_acknowledged_are_compared_with_nothing() -> None:
    lines, _, _ = _agreeing()
    push = _push()
    push.apply("PushFailed", {"sequence": 3, "retryable": False}, 2)
    found = check_line_items([_item("ii_a", 2)], {push.push_id: push}, lines)
    assert found == [
        Finding(
            "stripe",
            LINE,
            "Stripe holds ii_a 0.02 USD; the newest acknowledged push (sequence 0) is nothing",
        )
    ]


def test_a_push_without_an_answer_may_have_set_the_total_it_sent() -> None:
    pushes, lines = _stripe_side()
    push = next(iter(pushes.values()))
    lines[LINE].billed_at[4] = 150_000_004
    sent = [_item("ii_a", 99_999_999), _item("ii_b", 50_000_005)]  # sequence 4's total
    assert [f.subject for f in check_line_items(sent, pushes, lines)] == [LINE]
    push.apply("PushFailed", {"sequence": 4, "retryable": False}, 5)  # answered: not set
    assert [f.subject for f in check_line_items(sent, pushes, lines)] == [LINE]
    push.apply("PushFailed", {"sequence": 4, "retryable": True}, 6)
    assert check_line_items(sent, pushes, lines) == []
    assert check_line_items(sent, pushes, {}) != []  # no line: no total to compare with


def test_items_of_an_unknown_line_are_foreign_unless_told_otherwise() -> None:
    pushes, lines = _stripe_side()
    items = [
        _item("ii_z", 4, LINE_B),
        _item("ii_a", 99_999_999),
        _item("ii_b", 50_000_002),
        _item("ii_y", 5, LINE_B),
    ]
    assert check_line_items(items, pushes, lines) == [
        Finding("stripe", LINE_B, "Stripe holds ii_z, ii_y for no known line")
    ]
    assert check_line_items(items, pushes, lines, foreign_items=False) == []


def test_an_acknowledged_push_that_stripe_does_not_hold_is_found_unless_it_is_zero() -> None:
    pushes, lines = _stripe_side()
    zero = _push(LINE_B)
    zero.apply("Pushed", _pushed(2, 0, [0], ["ii_0"]), 2)
    pushes[zero.push_id] = zero
    assert check_line_items([], pushes, lines) == [
        Finding(
            "stripe",
            LINE,
            "acknowledged 1500000.01 USD in ii_a, ii_b; Stripe holds nothing",
        )
    ]


def test_line_items_are_reported_in_line_order() -> None:
    pushes, lines = _stripe_side()
    first = "00000000-0000-0000-0000-000000000001"
    items = [_item("ii_a", 1), _item("ii_q", 2, first)]
    found = check_line_items(items, pushes, lines)
    assert [f.subject for f in found] == [first, LINE]


def test_a_push_whose_items_and_amounts_disagree_is_not_compared_in_part() -> None:
    """Read in part, {"ii_a": 99_999_999} would agree with Stripe's one item."""
    pushes, lines = _stripe_side()
    push = next(iter(pushes.values()))
    push.amounts = [99_999_999]
    with pytest.raises(ValueError, match="shorter"):
        check_line_items([_item("ii_a", 99_999_999)], pushes, lines)


def test_a_transaction_charged_on_a_lost_draft_is_no_finding_before_its_line_is_pushed_again() -> (
    None
):
    lines, pushes, txns = _agreeing()
    push = next(iter(pushes.values()))
    push.apply("ChargesRecorded", {"through": 3}, 4)
    push.apply("Redrafted", {"draft": 2}, 5)  # Stripe acknowledged it, then lost the draft
    assert check_lines(lines, pushes, txns) == []
