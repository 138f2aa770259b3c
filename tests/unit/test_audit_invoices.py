"""``domain.audit_invoices``: the fold of an invoice's events and the checks that tie it
to its lines, its transactions, Stripe's total and the webhooks that paid it.

The data is asymmetric on purpose: two lines whose shares round differently (a share
of 0 and a share above its transaction's amount), the invoice's lines named in
another order than they joined, findings that are not the first thing checked.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from domain.audit import Finding, TxnAudit
from domain.audit_invoices import (
    InvoiceAudit,
    StripeInvoice,
    check_invoices,
    check_stripe_invoices,
    credited_transactions,
)
from domain.audit_lines import LineAudit
from domain.invoice_states import InvoiceState
from domain.transaction import TxnState

S = InvoiceState
INV = "00000000-0000-0000-0000-0000000000e1"
INV_B = "00000000-0000-0000-0000-0000000000e2"
L1 = "00000000-0000-0000-0000-0000000000a1"
L2 = "00000000-0000-0000-0000-0000000000a2"
L3 = "00000000-0000-0000-0000-0000000000a3"
T1, T2, T3, T4, T5 = (f"00000000-0000-0000-0000-0000000000c{n}" for n in range(1, 6))
T9 = "00000000-0000-0000-0000-0000000000c9"  # in no line


def _hex(uuid: str) -> dict[str, str]:
    """A UUID as the stored JSON has it."""
    return {"_type_": "uuid_hex", "_data_": uuid.replace("-", "")}


def _settled(ids: list[str], amounts: list[str], total: str, billed: int, n: int) -> dict[str, Any]:
    return {
        "transaction_ids": ids,
        "amounts": amounts,
        "exact_total": total,
        "billed": billed,
        "transactions": n,
    }


def _lines() -> dict[str, LineAudit]:
    """L1: T1 120.4, T2 30.3, T3 0.45 at v2, frozen at v3: billed 151 (shares 120, 31, 0).
    L2: T4 75.5 at v2, T5 10.2 at v3, frozen at v4: billed 86 (shares 76, 10)."""
    opened = {"customer_id": "acme", "currency": "USD", "meter": "api", "period_start": "p"}
    one, two = LineAudit.opened(L1, opened), LineAudit.opened(L2, opened)
    one.apply("Settled", _settled([T1, T2, T3], ["120.4", "30.3", "0.45"], "151.15", 151, 3), 2)
    one.apply("Frozen", {}, 3)
    two.apply("Settled", _settled([T4], ["75.5"], "75.5", 76, 1), 2)
    two.apply("Settled", _settled([T5], ["10.2"], "85.7", 86, 2), 3)
    two.apply("Frozen", {}, 4)
    return {L1: one, L2: two}


def _opened() -> InvoiceAudit:
    return InvoiceAudit.opened(
        INV,
        {
            "customer_id": "acme",
            "currency": "USD",
            "period_start": "2026-12-01T00:00:00+00:00",
            "first_line": _hex(L1),
        },
    )


def _finalized(expected: int = 237, total: int = 237) -> InvoiceAudit:
    """L1 and L2, finalized at their frozen sequences for 237 (151 + 86)."""
    inv = _opened()
    inv.apply("LineAdded", {"line_id": L2}, 2)
    inv.apply("DraftCreated", {"stripe_invoice_id": "in_77"}, 3)
    inv.apply("Closed", {}, 4)
    inv.apply(
        "FinalizeStarted",
        {"lines": [_hex(L2), L1], "sequences": [4, 3], "expected_total": expected},
        5,
    )
    inv.apply("Finalized", {"total": total, "number": "A-1"}, 6)
    return inv


def _txn(txn_id: str, state: TxnState = TxnState.COMPENSATED) -> TxnAudit:
    txn = TxnAudit(txn_id, "acme", "u", "api", "1", Decimal(1), "USD", "t")
    txn.state = state
    return txn


def _credit(inv: InvoiceAudit, txn: str, amount: int, note: str | None, version: int) -> None:
    inv.apply("CreditRequested", {"transaction_id": _hex(txn), "amount": amount}, version)
    if note is not None:
        credited = {"credit_note_id": note, "transaction_id": txn, "amount": amount}
        inv.apply("Credited", credited, version + 1)


def _findings(*details: str, subject: str = INV) -> list[Finding]:
    return [Finding("invoice", subject, d) for d in details]


# -- the fold --------------------------------------------------------------------------------


def test_opened_keeps_the_invoices_identity_and_its_first_line() -> None:
    inv = _opened()
    assert (inv.invoice_id, inv.customer_id, inv.currency, inv.period_start, inv.lines) == (
        INV,
        "acme",
        "USD",
        "2026-12-01T00:00:00+00:00",
        [L1],
    )
    assert (inv.state, inv.stripe_invoice_id, inv.expected_total, inv.total) == (
        S.OPEN,
        None,
        None,
        None,
    )
    assert (inv.final_sequences, inv.requested, inv.credited, inv.problems) == ({}, {}, {}, [])


def test_the_fold_records_lines_draft_finalizing_total_payment_and_credits() -> None:
    inv = _finalized()
    inv.apply("Paid", {"amount_paid": 237, "source": "evt_9"}, 7)
    _credit(inv, T2, 31, "cn_1", 8)
    assert inv.lines == [L1, L2]
    assert inv.stripe_invoice_id == "in_77"
    assert inv.final_sequences == {L2: 4, L1: 3}
    assert (inv.expected_total, inv.total) == (237, 237)
    assert (inv.state, inv.amount_paid, inv.paid_from) == (S.PAID, 237, "evt_9")
    assert inv.requested == {T2: 31}
    assert inv.credited == {"cn_1": (T2, 31)}
    assert inv.problems == []


@pytest.mark.parametrize(
    ("before", "name", "after"),
    [
        (S.OPEN, "Closed", S.CLOSED),
        (S.CLOSED, "NothingDue", S.NOTHING_DUE),
        (S.CLOSED, "FinalizeStarted", S.FINALIZING),
        (S.FINALIZING, "Finalized", S.FINALIZED),
        (S.FINALIZED, "PaymentFailed", S.PAYMENT_FAILED),
        (S.PAYMENT_FAILED, "Paid", S.PAID),
        (S.PAYMENT_FAILED, "MarkedUncollectible", S.UNCOLLECTIBLE),
        (S.UNCOLLECTIBLE, "Voided", S.VOID),
        # events that record something without moving the invoice
        (S.OPEN, "LineAdded", S.OPEN),
        (S.CLOSED, "DraftCreated", S.CLOSED),
        (S.CLOSED, "Adjusted", S.CLOSED),
        (S.FINALIZING, "FinalizeFailed", S.FINALIZING),
        (S.PAID, "CreditRequested", S.PAID),
        (S.UNCOLLECTIBLE, "Credited", S.UNCOLLECTIBLE),
    ],
)
def test_each_event_moves_the_invoice_as_the_aggregate_does(before: S, name: str, after: S) -> None:
    data = {
        "line_id": L3,
        "stripe_invoice_id": "in_1",
        "lines": [L1],
        "sequences": [3],
        "expected_total": 0,
        "total": 0,
        "amount_paid": 0,
        "source": "finalize",
        "transaction_id": T1,
        "amount": 0,
        "credit_note_id": "cn_1",
    }
    inv = _opened()
    inv.state = before
    inv.apply(name, data, 9)
    assert inv.state is after
    assert inv.problems == []


def test_an_event_in_a_state_that_does_not_allow_it_is_a_problem_and_still_applied() -> None:
    inv = _opened()
    inv.apply("Closed", {}, 2)
    inv.apply("Paid", {"amount_paid": 5, "source": "evt_1"}, 3)  # never finalized
    inv.apply("LineAdded", {"line_id": L2}, 4)  # after closing
    assert inv.problems == ["v3: Paid while closed", "v4: LineAdded while paid"]
    assert (inv.state, inv.amount_paid, inv.lines) == (S.PAID, 5, [L1, L2])


def test_a_lost_draft_replaced_closes_a_finalizing_invoice_again_and_forgets_its_draft() -> None:
    inv = _opened()
    inv.apply("DraftCreated", {"stripe_invoice_id": "in_1"}, 2)
    inv.apply("Closed", {}, 3)
    inv.apply("FinalizeStarted", {"lines": [L1], "sequences": [3], "expected_total": 9}, 4)
    inv.apply("DraftReplaced", {"lost": "in_1"}, 5)
    assert (inv.state, inv.stripe_invoice_id) == (S.CLOSED, None)
    assert (inv.final_sequences, inv.expected_total) == ({}, None)
    inv.apply("DraftCreated", {"stripe_invoice_id": "in_2"}, 6)
    inv.apply("FinalizeStarted", {"lines": [L1], "sequences": [3], "expected_total": 9}, 7)
    assert (inv.state, inv.stripe_invoice_id, inv.problems) == (S.FINALIZING, "in_2", [])
    inv.apply("DraftReplaced", {"lost": "in_1"}, 8)  # not its draft: a problem
    assert inv.problems == ["v8: replaces draft in_1, its draft is in_2"]
    inv.apply("Finalized", {"total": 9}, 9)
    inv.apply("DraftReplaced", {"lost": None}, 10)  # final: never
    assert inv.problems[-1] == "v10: DraftReplaced while finalized"


def test_an_event_the_table_does_not_know_changes_nothing() -> None:
    inv = _finalized()
    inv.apply("SomethingNew", {"total": 1}, 7)
    assert (inv.state, inv.total, inv.problems) == (S.FINALIZED, 237, [])


def test_finalizing_must_name_exactly_the_invoices_lines() -> None:
    inv = _opened()
    inv.apply("LineAdded", {"line_id": L2}, 2)
    inv.apply("Closed", {}, 3)
    inv.apply("FinalizeStarted", {"lines": [L1, L3], "sequences": [3, 1], "expected_total": 1}, 4)
    assert inv.problems == ["v4: finalizing names lines other than its own"]
    assert inv.final_sequences == {L1: 3, L3: 1}


def test_a_finalizing_with_fewer_sequences_than_lines_is_read_not_raised() -> None:
    inv = _opened()
    inv.apply("Closed", {}, 2)
    inv.apply("FinalizeStarted", {"lines": [L1, L2], "sequences": [3], "expected_total": 1}, 3)
    assert inv.final_sequences == {L1: 3}
    assert inv.problems == ["v3: finalizing names lines other than its own"]


def test_a_credit_requested_twice_or_a_note_recorded_twice_is_a_problem() -> None:
    inv = _finalized()
    _credit(inv, T2, 31, "cn_1", 7)
    inv.apply("CreditRequested", {"transaction_id": T2, "amount": 30}, 9)
    inv.apply("Credited", {"credit_note_id": "cn_1", "transaction_id": T4, "amount": 76}, 10)
    assert inv.problems == [
        f"v9: credit for {T2} requested twice",
        "v10: credit note cn_1 recorded twice",
    ]
    assert inv.requested == {T2: 30}
    assert inv.credited == {"cn_1": (T4, 76)}


def test_a_credit_note_made_in_stripe_names_no_transaction() -> None:
    inv = _finalized()
    inv.apply("Credited", {"credit_note_id": "cn_s", "transaction_id": None, "amount": 12}, 7)
    assert inv.credited == {"cn_s": ("", 12)}
    assert inv.problems == []


# -- the checks ------------------------------------------------------------------------------


def test_an_invoice_that_agrees_with_everything_has_no_findings() -> None:
    inv = _finalized()
    _credit(inv, T2, 31, "cn_1", 7)
    _credit(inv, T4, 76, "cn_2", 9)
    inv.apply("Paid", {"amount_paid": 237, "source": "evt_9"}, 11)
    txns = {T2: _txn(T2), T4: _txn(T4), T1: _txn(T1, TxnState.CHARGED)}
    assert check_invoices({INV: inv}, _lines(), txns, paid_webhooks={"evt_8", "evt_9"}) == []


def test_open_closed_and_finalized_invoices_not_yet_paid_have_no_findings() -> None:
    opened, closed, finalized = _opened(), _opened(), _finalized()
    closed.apply("Closed", {}, 2)
    invoices = {"a": opened, "b": closed, INV: finalized}
    assert check_invoices(invoices, _lines(), {}, paid_webhooks=set()) == []


def test_the_folds_own_problems_are_findings_of_their_invoice() -> None:
    inv, other = _finalized(), _opened()
    other.invoice_id = INV_B
    inv.problems.append("v9: trouble")
    other.problems += ["v2: more", "v3: still more"]
    assert check_invoices({INV: inv, INV_B: other}, _lines(), {}) == [
        Finding("invoice", INV, "v9: trouble"),
        Finding("invoice", INV_B, "v2: more"),
        Finding("invoice", INV_B, "v3: still more"),
    ]


def test_a_payment_must_come_from_a_webhook_received_or_the_finalize_answer() -> None:
    by_webhook, by_finalize = _finalized(), _finalized()
    by_finalize.invoice_id = INV_B
    by_webhook.apply("Paid", {"amount_paid": 237, "source": "evt_9"}, 7)
    by_finalize.apply("Paid", {"amount_paid": 237, "source": "finalize"}, 7)
    invoices = {INV: by_webhook, INV_B: by_finalize}
    assert check_invoices(invoices, _lines(), {}, paid_webhooks={"evt_8"}) == _findings(
        "paid from evt_9, never received"
    )
    assert check_invoices(invoices, _lines(), {}, paid_webhooks={"evt_9"}) == []
    assert check_invoices(invoices, _lines(), {}) == []  # the webhooks were not read


def test_only_a_paid_invoice_is_checked_against_the_webhooks_and_its_total() -> None:
    inv = _finalized()
    inv.apply("Paid", {"amount_paid": 200, "source": "evt_9"}, 7)
    inv.apply("Voided", {}, 8)  # not from paid: a problem of the fold, nothing more
    assert check_invoices({INV: inv}, _lines(), {}, paid_webhooks=set()) == _findings(
        "v8: Voided while paid"
    )


def test_a_paid_invoice_must_have_been_paid_its_total() -> None:
    inv = _finalized()
    inv.apply("Paid", {"amount_paid": 236, "source": "finalize"}, 7)
    assert check_invoices({INV: inv}, _lines(), {}) == _findings(
        "paid 2.36 USD of a total of 2.37 USD"
    )
    inv.amount_paid = 237
    assert check_invoices({INV: inv}, _lines(), {}) == []


def test_a_paid_invoice_without_stripes_total_is_not_compared_to_it() -> None:
    inv = _opened()
    inv.apply("Closed", {}, 2)
    inv.apply("Paid", {"amount_paid": 50, "source": "finalize"}, 3)
    assert check_invoices({INV: inv}, _lines(), {}) == _findings("v3: Paid while closed")


def test_finalizing_must_expect_what_its_lines_billed_and_stripe_must_agree() -> None:
    assert check_invoices({INV: _finalized(expected=236, total=236)}, _lines(), {}) == _findings(
        "finalizing expected 2.36 USD; its lines billed 2.37 USD"
    )
    assert check_invoices({INV: _finalized(total=238)}, _lines(), {}) == _findings(
        "Stripe finalized 2.38 USD; its lines billed 2.37 USD"
    )


def test_a_line_missing_or_changed_after_finalizing_is_found() -> None:
    inv = _finalized(expected=86, total=86)
    inv.final_sequences = {L3: 1, L1: 9, L2: 4}  # L3 unknown, L1 never reached v9
    lines = _lines()
    lines[L2].apply("Settled", _settled([T3 + "x"], ["1"], "86.7", 87, 3), 5)  # after v4
    assert check_invoices({INV: inv}, lines, {}) == _findings(
        f"line {L3}: no such line",
        f"line {L1} changed after finalizing (v9 -> v3)",
        f"line {L2} changed after finalizing (v4 -> v5)",
    )


def test_a_credit_must_be_its_transactions_billed_share_of_its_line() -> None:
    inv = _finalized()
    inv.final_sequences = {L3: 1, **inv.final_sequences}  # a line the audit does not have
    inv.expected_total = inv.total = None  # (its totals are checked elsewhere)
    _credit(inv, T3, 1, None, 7)  # 0.45 added nothing to L1's rounded total: share 0
    _credit(inv, T5, 10, None, 8)  # L2's share, not L1+L2 rounded together
    _credit(inv, T2, 30, None, 9)  # 30.3 carried L1 from 120 to 151: share 31
    _credit(inv, T9, 4, None, 10)
    txns = {t: _txn(t) for t in (T2, T3, T5, T9)}
    assert check_invoices({INV: inv}, _lines(), txns) == _findings(
        f"credit of 0.01 USD requested for {T3}; its billed share is 0.00 USD",
        f"credit of 0.30 USD requested for {T2}; its billed share is 0.31 USD",
        f"credit of 0.04 USD requested for {T9}; its billed share is none",
    )


def test_a_credited_transaction_must_be_compensated() -> None:
    inv = _finalized()
    _credit(inv, T1, 120, "cn_1", 7)
    _credit(inv, T4, 76, "cn_2", 9)
    _credit(inv, T5, 10, "cn_3", 11)
    txns = {T1: _txn(T1, TxnState.CHARGED), T5: _txn(T5)}
    assert check_invoices({INV: inv}, _lines(), txns) == _findings(
        f"credit for {T1}, not compensated", f"credit for {T4}, not compensated"
    )


def test_every_credit_note_of_the_ledger_was_requested_for_its_amount_once() -> None:
    inv = _finalized()
    _credit(inv, T4, 76, None, 7)
    _credit(inv, T5, 10, None, 8)
    notes = [
        ("cn_s", None, 3),  # made in Stripe: not the ledger's, only counted in the total
        ("cn_1", T4, 75),
        ("cn_2", T5, 10),
        ("cn_3", T5, 10),
        ("cn_4", T1, 2),
    ]
    for version, (note, txn, amount) in enumerate(notes, start=9):
        inv.apply(
            "Credited", {"credit_note_id": note, "transaction_id": txn, "amount": amount}, version
        )
    txns = {T4: _txn(T4), T5: _txn(T5)}
    assert check_invoices({INV: inv}, _lines(), txns) == _findings(
        f"credit note cn_1 of 0.75 USD for {T4}; requested 0.76 USD",
        f"{T5} credited twice (cn_3)",
        f"credit note cn_4 of 0.02 USD for {T1}; requested none",
    )


def test_credits_may_reach_the_total_but_never_exceed_it() -> None:
    inv = _finalized(expected=86, total=86)
    inv.final_sequences = {L2: 4}
    _credit(inv, T4, 76, "cn_1", 7)
    inv.apply("Credited", {"credit_note_id": "cn_s", "transaction_id": None, "amount": 10}, 9)
    txns = {T4: _txn(T4)}
    assert check_invoices({INV: inv}, _lines(), txns) == []
    inv.apply("Credited", {"credit_note_id": "cn_t", "transaction_id": None, "amount": 1}, 10)
    assert check_invoices({INV: inv}, _lines(), txns) == _findings(
        "credited 0.87 USD of a total of 0.86 USD"
    )
    inv.total = inv.expected_total = None
    assert check_invoices({INV: inv}, _lines(), txns) == []


def test_credited_transactions_are_those_requested_on_any_invoice() -> None:
    one, two = _finalized(), _finalized()
    _credit(one, T2, 31, None, 7)
    _credit(two, T4, 76, "cn_1", 7)
    _credit(two, T5, 10, None, 9)
    assert credited_transactions({INV: one, INV_B: two}) == frozenset({T2, T4, T5})
    assert credited_transactions({}) == frozenset()


def _audited(state: InvoiceState, expected: int | None = 300) -> InvoiceAudit:
    return InvoiceAudit(
        "inv-1", "acme", "USD", "2026-12-01", ["l1"], state=state,
        stripe_invoice_id="in_1", expected_total=expected,
    )  # fmt: skip


def test_stripe_invoices_at_the_expected_total_are_clean() -> None:
    stripe = [StripeInvoice("in_1", "paid", 300, "inv-1", "usd", "cus_1", None)]
    assert check_stripe_invoices(stripe, {"inv-1": _audited(InvoiceState.PAID)}, whole=True) == []


def test_a_finalized_invoice_whose_stripe_total_differs_is_a_stripe_finding() -> None:
    stripe = [StripeInvoice("in_1", "open", 200, "inv-1", "usd", "cus_1", None)]
    [finding] = check_stripe_invoices(
        stripe, {"inv-1": _audited(InvoiceState.FINALIZED)}, whole=True
    )
    assert (finding.kind, finding.subject, finding.detail) == (
        "stripe", "inv-1", "Stripe's invoice in_1 totals 2.00 USD; the ledger expected 3.00 USD",
    )  # fmt: skip


def test_an_invoice_final_in_the_ledger_but_a_draft_or_missing_in_stripe_is_a_finding() -> None:
    final = {"inv-1": _audited(InvoiceState.FINALIZED)}
    [draft] = check_stripe_invoices(
        [StripeInvoice("in_1", "draft", 300, "inv-1", "usd", "cus_1", None)], final, whole=True
    )
    assert draft.detail == "in_1 is still a draft in Stripe"
    [gone] = check_stripe_invoices([], final, whole=True)
    assert gone.detail == "in_1 not in Stripe"
    assert check_stripe_invoices([], final, whole=False) == []  # a customer's scope only


def test_an_invoice_final_in_stripe_that_the_ledger_never_finalized_is_a_finding() -> None:
    stripe = [StripeInvoice("in_1", "open", 300, "inv-1", "usd", "cus_1", None)]
    closed = {"inv-1": _audited(InvoiceState.CLOSED)}
    [finding] = check_stripe_invoices(stripe, closed, whole=True)
    assert finding.detail == "in_1 is open in Stripe; the ledger's invoice is closed"
    assert check_stripe_invoices(stripe, closed, whole=False) == []
    finalizing = {"inv-1": _audited(InvoiceState.FINALIZING)}
    assert check_stripe_invoices(stripe, finalizing, whole=True) == []  # its answer pending


def _also(invoice_id: str, stripe_id: str, state: InvoiceState) -> InvoiceAudit:
    return InvoiceAudit(
        invoice_id, "acme", "USD", "2026-12-01", ["l1"], state=state,
        stripe_invoice_id=stripe_id, expected_total=300,
    )  # fmt: skip


def test_every_stripe_finding_names_its_kind_and_invoice_and_each_invoice_is_checked() -> None:
    invoices = {
        "inv-0": _also("inv-0", "in_0", InvoiceState.OPEN),  # not final: not compared
        "inv-9": _also("inv-9", "in_9", InvoiceState.PAID),  # missing, scope partial
        "inv-1": _also("inv-1", "in_1", InvoiceState.FINALIZED),
        "inv-2": _also("inv-2", "in_2", InvoiceState.PAID),
        "inv-3": _also("inv-3", "in_3", InvoiceState.CLOSED),
    }
    stripe = [
        StripeInvoice("in_0", "draft", 999, "inv-0", "usd", "cus_1", None),
        StripeInvoice("in_1", "draft", 300, "inv-1", "usd", "cus_1", None),
        StripeInvoice("in_2", "paid", 200, "inv-2", "usd", "cus_1", None),
        StripeInvoice(
            "in_3", "draft", 300, "inv-3", "usd", "cus_1", None
        ),  # a draft of a closed invoice: fine
    ]
    found = check_stripe_invoices(stripe, invoices, whole=False)
    assert [(f.kind, f.subject) for f in found] == [("stripe", "inv-1"), ("stripe", "inv-2")]
    whole = check_stripe_invoices(stripe, invoices, whole=True)
    assert [(f.kind, f.subject, f.detail) for f in whole] == [
        ("stripe", "inv-9", "in_9 not in Stripe"),
        ("stripe", "inv-1", "in_1 is still a draft in Stripe"),
        ("stripe", "inv-2", "Stripe's invoice in_2 totals 2.00 USD; the ledger expected 3.00 USD"),
    ]
    opened = [
        StripeInvoice("in_3", "open", 300, "inv-3", "usd", "cus_1", None),
        StripeInvoice("in_0", "open", 1, "x", "usd", "cus_1", None),
    ]
    later = check_stripe_invoices(opened, invoices, whole=True)
    assert [(f.kind, f.subject) for f in later] == [
        ("stripe", "inv-9"), ("stripe", "inv-1"), ("stripe", "inv-2"),  # not in this listing
        ("stripe", "inv-3"), ("stripe", "inv-0"),  # final in Stripe, not in the ledger
    ]  # fmt: skip
    assert later[3].detail == "in_3 is open in Stripe; the ledger's invoice is closed"
