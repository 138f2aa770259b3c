"""``domain.audit``: what the auditor concludes, pinned case by case.

The fold's agreement with the aggregate is proved in ``test_audit_fold.py``; these
tests pin each check's verdict on its own, with asymmetric data (amounts that are no
sum or bitwise-or of each other, a finding that is not the first transaction, values
on both sides of every boundary), so a wrong auditor cannot pass them by accident.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from domain.audit import (
    Balance,
    Finding,
    InvoiceItem,
    TxnAudit,
    balances_of,
    check_balances,
    check_stripe,
    check_transactions,
    uuid_text,
)
from domain.transaction import TxnState

T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
HOUR = timedelta(hours=1)
LINE = UUID(int=0xABC)
OTHER_LINE = UUID(int=0xDEF)


def _metered(
    txn_id: str = "t1", amount: str = "12.5", customer: str = "acme", currency: str = "USD"
) -> TxnAudit:
    return TxnAudit.metered(
        txn_id,
        {
            "customer_id": customer,
            "usage_id": f"u-{txn_id}",
            "meter": "api.requests",
            "quantity": Decimal("125"),
            "amount": amount,
            "currency": currency,
            "timestamp": T0.isoformat(),
        },
    )


def _reserved(txn: TxnAudit, line: UUID | None = LINE, version: int = 3) -> TxnAudit:
    data: dict[str, Any] = {"account_id": str(UUID(int=7))}
    if line is not None:
        data |= {"line_id": {"_type_": "uuid_hex", "_data_": line.hex}, "line_version": version}
    txn.apply("Reserved", data, 2)
    return txn


def _charged(txn: TxnAudit, item: str = "ii_1", sequence: int | None = 4, v: int = 3) -> TxnAudit:
    line = txn.line_id
    txn.apply("Charged", {"stripe_object_id": item, "line_id": line, "sequence": sequence}, v)
    return txn


def _compensated(txn: TxnAudit, reason: str = "gave up", reversal: str | None = None) -> TxnAudit:
    data = {"reason": reason, "from_state": str(txn.state), "stripe_reversal_id": reversal}
    txn.apply("Compensated", data, 9)
    return txn


def _failed(txn: TxnAudit, attempt: int, *, retryable: bool = True, due: bool = True) -> TxnAudit:
    data = {
        "attempt": attempt,
        "error_class": "Timeout",
        "message": "slow",
        "retryable": retryable,
        "next_attempt_at": (T0 + HOUR).isoformat() if due else None,
    }
    txn.apply("ChargeFailed", data, 5)
    return txn


# -- the fold's record of one transaction -------------------------------------------------


def test_metered_keeps_every_field_of_its_event() -> None:
    txn = _metered("t9", amount="0.38", customer="bolt", currency="EUR")
    assert (
        txn.transaction_id,
        txn.customer_id,
        txn.usage_id,
        txn.meter,
        txn.quantity,
        txn.amount,
        txn.currency,
        txn.metered_at,
    ) == ("t9", "bolt", "u-t9", "api.requests", "125", Decimal("0.38"), "EUR", T0.isoformat())
    assert (txn.state, txn.attempts, txn.refused, txn.charges, txn.problems) == (
        TxnState.METERED,
        0,
        False,
        0,
        (),
    )


def test_reserved_records_the_line_and_version_it_joined() -> None:
    txn = _reserved(_metered(), LINE, 3)
    assert (txn.state, txn.line_id, txn.line_version) == (TxnState.RESERVED, str(LINE), 3)
    before_lines = _reserved(_metered(), None)
    assert (before_lines.line_id, before_lines.line_version) == (None, None)


def test_settled_joins_a_line_and_clears_the_due_retry() -> None:
    txn = _failed(_reserved(_metered(), None), 1)
    assert txn.next_attempt_at is not None
    txn.apply("Settled", {"line_id": LINE.hex, "line_version": 5}, 6)
    assert (txn.line_id, txn.line_version, txn.next_attempt_at) == (str(LINE), 5, None)
    assert txn.state is TxnState.RESERVED
    assert txn.problems == ()


def test_settling_into_a_second_line_is_a_problem() -> None:
    txn = _reserved(_metered(), LINE, 3)
    txn.apply("Settled", {"line_id": OTHER_LINE.hex, "line_version": 2}, 3)
    assert txn.problems == (f"v3: joins line {OTHER_LINE}, but is in line {LINE} already",)


def test_charge_failures_must_count_their_attempts_from_one() -> None:
    good = _failed(_failed(_reserved(_metered()), 1), 2)
    assert (good.problems, good.attempts, good.last_error) == ((), 2, "Timeout: slow")
    assert good.state is TxnState.CHARGE_FAILED
    skipped = _failed(_reserved(_metered()), 2)
    assert skipped.problems == ("v5: ChargeFailed attempt 2 after 0 attempts",)
    repeated = _failed(_failed(_reserved(_metered()), 1), 1)
    assert repeated.problems == ("v5: ChargeFailed attempt 1 after 1 attempts",)


def test_a_retryable_failure_must_say_when_it_is_retried() -> None:
    undated = _failed(_reserved(_metered()), 1, retryable=True, due=False)
    assert undated.problems == ("v5: a retryable ChargeFailed without next_attempt_at",)
    final = _failed(_reserved(_metered()), 1, retryable=False, due=False)
    assert (final.problems, final.next_attempt_at) == ((), None)


def test_charged_records_its_item_and_sequence_and_clears_the_due_retry() -> None:
    txn = _charged(_failed(_reserved(_metered()), 1), "ii_7", sequence=4)
    assert (txn.state, txn.charges, txn.stripe_object_id, txn.line_sequence) == (
        TxnState.CHARGED,
        1,
        "ii_7",
        4,
    )
    assert (txn.next_attempt_at, txn.problems) == (None, ())


def test_charged_must_name_the_line_the_transaction_is_in() -> None:
    txn = _reserved(_metered(), LINE, 3)
    txn.apply("Charged", {"stripe_object_id": "ii", "line_id": str(OTHER_LINE), "sequence": 4}, 3)
    assert txn.problems == (
        f"v3: Charged names line {OTHER_LINE}, the transaction is in line {LINE}",
    )


@pytest.mark.parametrize(("sequence", "ok"), [(2, False), (3, True), (4, True), (None, False)])
def test_charged_must_be_acknowledged_at_or_after_the_version_it_joined(
    sequence: int | None, ok: bool
) -> None:
    txn = _charged(_reserved(_metered(), LINE, 3), sequence=sequence)
    expected = () if ok else (f"v3: Charged at line sequence {sequence}, before it joined at 3",)
    assert txn.problems == expected


def test_a_charge_without_a_line_needs_no_sequence() -> None:
    txn = _charged(_reserved(_metered(), None), sequence=None)
    assert txn.problems == ()


def test_a_second_charge_is_charged_twice() -> None:
    txn = _charged(_charged(_reserved(_metered())), "ii_2", v=4)
    assert txn.problems[-1] == "v4: charged twice"
    assert txn.charges == 2


def test_a_reversed_charge_needs_the_id_of_its_stripe_reversal() -> None:
    bare = _compensated(_charged(_reserved(_metered())), "refund", None)
    assert bare.problems == ("v9: a reversed charge without the id of its Stripe reversal",)
    reversed_ = _compensated(_charged(_reserved(_metered())), "refund", "cn_1")
    assert reversed_.problems == ()
    unpaid = _compensated(_reserved(_metered()), "gave up", None)
    assert unpaid.problems == ()


def test_compensated_records_its_reason_and_whether_the_limit_refused_it() -> None:
    refused = _compensated(_metered(), "spend limit")
    assert (refused.state, refused.compensation_reason, refused.refused) == (
        TxnState.COMPENSATED,
        "spend limit",
        True,
    )
    given_up = _compensated(_failed(_reserved(_metered()), 1), "gave up")
    assert (given_up.refused, given_up.next_attempt_at) == (False, None)


def test_an_event_in_an_illegal_state_is_a_problem_and_still_applied() -> None:
    txn = _metered()
    txn.apply("Charged", {"stripe_object_id": "ii_1"}, 2)
    assert txn.problems == ("v2: Charged after metered (illegal transition)",)
    assert (txn.state, txn.charges) == (TxnState.CHARGED, 1)


# -- overdue ------------------------------------------------------------------------


def _stuck(txn_id: str) -> TxnAudit:
    return _reserved(_metered(txn_id), None)


def test_every_overdue_transaction_is_found_wherever_it_stands() -> None:
    done = _charged(_reserved(_metered("done"), None), sequence=None)
    failing = _failed(_reserved(_metered("failing"), None), 1)
    in_failing_line = _reserved(_metered("in-failing-line"), LINE)
    txns = [done, failing, in_failing_line, _stuck("a"), done, _stuck("b")]
    found = check_transactions(txns, now=T0 + 2 * HOUR, horizon=HOUR, failing_lines={str(LINE)})
    assert [(f.kind, f.subject) for f in found] == [("overdue", "a"), ("overdue", "b")]


def test_a_transaction_in_a_line_that_is_not_failing_is_overdue() -> None:
    txn = _reserved(_metered("x"), LINE)
    found = check_transactions([txn], now=T0 + 2 * HOUR, horizon=HOUR, failing_lines={"other"})
    assert [f.subject for f in found] == ["x"]


def test_overdue_starts_just_after_the_deadline() -> None:
    txn = _stuck("s")
    at_deadline = check_transactions([txn], now=T0 + HOUR, horizon=HOUR)
    just_after = check_transactions([txn], now=T0 + HOUR + timedelta(microseconds=1), horizon=HOUR)
    assert at_deadline == []
    assert just_after == [
        Finding(
            "overdue",
            "s",
            f"reserved since {T0.isoformat()}, past its deadline {(T0 + HOUR).isoformat()}"
            " with no failure or reason recorded",
        )
    ]


def test_a_compensated_transaction_is_never_overdue() -> None:
    txn = _compensated(_stuck("c"))
    assert check_transactions([txn], now=T0 + 9 * HOUR, horizon=HOUR) == []


def test_problems_are_reported_as_sequence_or_double_charge_findings() -> None:
    twice = _charged(_charged(_reserved(_metered("twice"))), "ii_2", v=4)
    skipped = _failed(_reserved(_metered("skipped")), 3)
    found = check_transactions([twice, skipped], now=T0, horizon=HOUR)
    assert found == [
        Finding("sequence", "twice", "v4: Charged after charged (illegal transition)"),
        Finding("double_charge", "twice", "v4: charged twice"),
        Finding("sequence", "skipped", "v5: ChargeFailed attempt 3 after 0 attempts"),
    ]


# -- balances -------------------------------------------------------------------------


def test_balances_sum_every_transaction_of_each_customer_and_currency() -> None:
    txns = [
        _charged(_reserved(_metered("c1", "100.25"))),
        _charged(_reserved(_metered("c2", "7"))),
        _compensated(_metered("r1", "30")),  # refused by the limit
        _compensated(_metered("r2", "0.5")),
        _compensated(_reserved(_metered("g1", "1000"))),  # given up: not a refusal
        _reserved(_metered("f1", "3")),
        _failed(_reserved(_metered("f2", "40")), 1),
        _reserved(_metered("e1", "9", currency="EUR")),
        _compensated(_metered("b1", "11", customer="bolt")),
    ]
    got = balances_of(txns, {("acme", "USD"): 5000, ("zed", "JPY"): None})
    assert got == {
        ("acme", "USD"): Balance(
            metered=Decimal("1180.75"),
            charged=Decimal("107.25"),
            compensated=Decimal("1030.5"),
            in_flight=Decimal("43"),
            transactions=7,
            refused=2,
            spend_limit=5000,
        ),
        ("acme", "EUR"): Balance(metered=Decimal(9), in_flight=Decimal(9), transactions=1),
        ("bolt", "USD"): Balance(
            metered=Decimal(11), compensated=Decimal(11), transactions=1, refused=1
        ),
        ("zed", "JPY"): Balance(),
    }
    assert check_balances(got) == []


def test_balances_keep_exact_sums_beyond_the_default_precision() -> None:
    tiny = "0." + "0" * 40 + "1"
    got = balances_of(
        [_reserved(_metered("a", "1" + "0" * 20)), _reserved(_metered("b", tiny))], {}
    )
    assert got["acme", "USD"].metered == Decimal("1" + "0" * 20 + tiny[1:])


def _balance(metered: int, charged: int, compensated: int, in_flight: int) -> Balance:
    return Balance(
        metered=Decimal(metered),
        charged=Decimal(charged),
        compensated=Decimal(compensated),
        in_flight=Decimal(in_flight),
    )


@pytest.mark.parametrize(
    ("balance", "conserved"),
    [
        (_balance(10, 3, 5, 2), True),
        (_balance(9, 3, 5, 2), False),
        (_balance(11, 3, 5, 2), False),
        (_balance(8, 3, 5, 0), True),  # 3 | 5 == 7: an "or" would not add up
        (_balance(7, 3, 5, 0), False),
    ],
)
def test_conservation_holds_only_when_metered_is_exactly_the_sum(
    balance: Balance, conserved: bool
) -> None:
    assert balance.conserved is conserved
    found = check_balances({("acme", "USD"): balance})
    assert (found == []) is conserved


def test_a_conservation_finding_names_the_customer_currency_and_the_sums() -> None:
    bad = Balance(
        metered=Decimal(9), charged=Decimal(3), compensated=Decimal(5), in_flight=Decimal(2)
    )
    good = Balance(metered=Decimal(1), in_flight=Decimal(1))
    found = check_balances({("zed", "EUR"): bad, ("acme", "USD"): good, ("acme", "EUR"): bad})
    assert found == [
        Finding(
            "conservation",
            f"{c}",
            "metered 0.09 EUR != charged 0.03 EUR + compensated 0.05 EUR + in flight 0.02 EUR",
        )
        for c in ("acme/EUR", "zed/EUR")
    ]


@pytest.mark.parametrize(
    ("limit", "available"), [(None, None), (100, Decimal(70)), (20, Decimal(0)), (30, Decimal(0))]
)
def test_available_is_what_the_limit_still_allows_never_below_zero(
    limit: int | None, available: Decimal | None
) -> None:
    balance = Balance(metered=Decimal(45), compensated=Decimal(15), spend_limit=limit)
    assert balance.available == available


# -- Stripe's items of per-transaction charges (before lines) ------------------------------


def _item(item_id: str, txn: str | None, amount: int = 12, currency: str = "usd") -> InvoiceItem:
    return InvoiceItem(item_id, txn, amount, currency)


def _charged_before_lines(txn_id: str, amount: str = "12", item: str = "ii_1") -> TxnAudit:
    return _charged(_reserved(_metered(txn_id, amount), None), item, sequence=None)


def test_a_charge_and_its_own_item_agree() -> None:
    txns = {"t": _charged_before_lines("t")}
    assert check_stripe([_item("ii_1", "t", 12, "usd")], txns) == []


@pytest.mark.parametrize(
    ("items", "detail"),
    [
        ([], "charged as ii_1, which Stripe does not hold"),
        ([_item("ii_1", "t", 13)], "Stripe holds 0.13 USD, the ledger charged 0.12 USD"),
        ([_item("ii_1", "t", 12, "eur")], "Stripe holds 0.12 EUR, the ledger charged 0.12 USD"),
        ([_item("ii_2", "t")], "charged as ii_1, Stripe holds ii_2"),
        ([_item("ii_1", "t"), _item("ii_2", "t")], "charged as ii_1, Stripe holds ii_1, ii_2"),
    ],
)
def test_a_charge_whose_item_differs_is_a_stripe_finding(
    items: list[InvoiceItem], detail: str
) -> None:
    txns = {"t": _charged_before_lines("t")}
    assert check_stripe(items, txns) == [Finding("stripe", "t", detail)]


def test_a_compensated_transaction_must_have_no_item() -> None:
    txns = {"t": _compensated(_reserved(_metered("t", "12"), None))}
    assert check_stripe([], txns) == []
    assert check_stripe([_item("ii_1", "t")], txns) == [
        Finding("stripe", "t", "compensated, but Stripe holds ii_1")
    ]


def test_an_unfinished_transaction_may_have_one_item_not_two() -> None:
    txns = {"t": _reserved(_metered("t", "12"), None)}
    assert check_stripe([_item("ii_1", "t")], txns) == []
    assert check_stripe([_item("ii_1", "t"), _item("ii_9", "t")], txns) == [
        Finding("stripe", "t", "reserved, but Stripe holds ii_1, ii_9")
    ]


def test_items_the_ledger_does_not_know_are_foreign_unless_told_otherwise() -> None:
    txns = {"t": _charged_before_lines("t")}
    items = [
        _item("ii_1", "t"),
        _item("ii_x", "nobody", 5, "eur"),
        _item("ii_y", None, 6),
        InvoiceItem("ii_line", None, 99, "usd", line_id=str(LINE)),  # a line's: not here
    ]
    foreign = "the ledger does not (metadata txn_id"
    assert check_stripe(items, txns) == [
        Finding("stripe", "ii_x", f"Stripe has a charge of 0.05 EUR {foreign} nobody)"),
        Finding("stripe", "ii_y", f"Stripe has a charge of 0.06 USD {foreign} missing)"),
    ]
    assert check_stripe(items, txns, foreign_items=False) == []


def test_a_transaction_charged_through_its_line_is_left_to_the_line_audit() -> None:
    in_line = _charged(_reserved(_metered("t", "12"), LINE, 3), "line-item", sequence=4)
    assert check_stripe([], {"t": in_line}) == []
    # an item of its own besides the line (a charge from before lines) is still checked
    assert check_stripe([_item("ii_old", "t")], {"t": in_line}) == [
        Finding("stripe", "t", "charged as line-item, Stripe holds ii_old")
    ]


@pytest.mark.parametrize(
    "value",
    [
        {"_type_": "uuid_hex", "_data_": "1234567890abcdef0123456789abcdef"},
        "1234567890abcdef0123456789abcdef",
        "12345678-90ab-cdef-0123-456789abcdef",
        UUID("12345678-90ab-cdef-0123-456789abcdef"),
    ],
)
def test_uuid_text_reads_every_stored_form(value: Any) -> None:
    assert uuid_text(value) == "12345678-90ab-cdef-0123-456789abcdef"


def test_uuid_text_of_nothing_is_nothing() -> None:
    assert uuid_text(None) is None


def test_a_compensation_without_any_reason_is_a_problem() -> None:
    txn = _reserved(_metered())
    txn.apply("Compensated", {"reason": None, "from_state": "reserved"}, 3)
    assert txn.problems == ("v3: Compensated without a reason",)


def test_every_problem_of_a_transaction_is_kept() -> None:
    txn = _metered()
    txn.apply("Charged", {"stripe_object_id": "ii_1"}, 2)
    txn.apply("Metered", {}, 3)
    txn.apply("Reserved", {}, 4)
    assert txn.problems == (
        "v2: Charged after metered (illegal transition)",
        "v3: Metered is not a transaction event after Metered",
        "v4: Reserved after charged (illegal transition)",
    )


def test_the_stripe_check_goes_on_past_line_items_and_line_charges() -> None:
    in_line = _charged(_reserved(_metered("a", "12"), LINE, 3), "line-item", sequence=4)
    lost = _charged_before_lines("b")
    items = [InvoiceItem("ii_line", None, 99, "usd", line_id=str(LINE)), _item("ii_x", "nobody")]
    foreign = "Stripe has a charge of 0.12 USD the ledger does not (metadata txn_id nobody)"
    assert check_stripe(items, {"a": in_line, "b": lost}) == [
        Finding("stripe", "ii_x", foreign),
        Finding("stripe", "b", "charged as ii_1, which Stripe does not hold"),
    ]
