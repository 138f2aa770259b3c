"""The audit of invoices (pure): a fold of each invoice's events, and the checks that
tie it to its lines, its transactions, Stripe and the webhooks.

Like ``domain.audit``, the fold reads plain stored data. What it proves, per invoice:

* its events follow ``domain.invoice_states.ALLOWED_FROM`` (the table the aggregate checks);
* finalizing named every line of the invoice, each at its newest sequence, and the
  expected total is the sum of what those lines billed then; the lines did not change
  after (usage that came later went to a late line of another period);
* Stripe's total, as finalized, is that sum (``total == Σ lines' billed``);
* every credit issued was requested, for its requested amount, once, and each
  requested amount is the transaction's billed share of its line
  (``domain.closing.shares_in_order``); the credits never exceed the total;
  a credited transaction is Compensated;
* a paid invoice's amount paid is Stripe's total less nothing (the webhooks' figure),
  and it was recorded from a webhook or a finalize answer the ledger received;
* with Stripe's invoices listed (``check_stripe_invoices``): every invoice the ledger
  finalized is final in Stripe, at the total the ledger expected, and no invoice of
  the ledger's is final in Stripe while the ledger has not finalized it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.audit import Finding, TxnAudit, amount_text, uuid_text
from domain.audit_lines import LineAudit
from domain.closing import shares_in_order
from domain.invoice_states import ALLOWED_FROM, InvoiceState
from domain.transaction import TxnState

__all__ = [
    "InvoiceAudit",
    "StripeInvoice",
    "check_invoices",
    "check_stripe_invoices",
    "credited_transactions",
]

S = InvoiceState
_TO_STATE = {
    "Closed": S.CLOSED,
    "NothingDue": S.NOTHING_DUE,
    "FinalizeStarted": S.FINALIZING,
    "Finalized": S.FINALIZED,
    "PaymentFailed": S.PAYMENT_FAILED,
    "Paid": S.PAID,
    "MarkedUncollectible": S.UNCOLLECTIBLE,
    "Voided": S.VOID,
}


@dataclass(frozen=True)
class StripeInvoice:
    """An invoice as Stripe lists it: its id, status, total, the ledger's invoice id
    from its metadata (None: not made by the ledger), its currency, its Stripe customer,
    and the purchase of credit its metadata names (None: not a purchase's,
    ``domain.audit_purchases``)."""

    id: str
    status: str
    total: int
    invoice_id: str | None
    currency: str
    customer: str
    purchase_id: str | None


@dataclass(slots=True)
class InvoiceAudit:
    """One invoice as its events say it is."""

    invoice_id: str
    customer_id: str
    currency: str
    period_start: str
    lines: list[str]
    state: InvoiceState = S.OPEN
    stripe_invoice_id: str | None = None
    final_sequences: dict[str, int] = field(default_factory=dict)
    expected_total: int | None = None
    total: int | None = None
    amount_paid: int = 0
    paid_from: str | None = None  # the webhook event id (or "finalize") that recorded it
    requested: dict[str, int] = field(default_factory=dict)  # transaction: amount
    credited: dict[str, tuple[str, int]] = field(default_factory=dict)  # note: (txn, amount)
    problems: list[str] = field(default_factory=list)
    period_end: str | None = None

    @classmethod
    def opened(cls, invoice_id: str, data: Mapping[str, Any]) -> InvoiceAudit:
        end = data.get("period_end")  # unwrapped by the replay, like period_start
        return cls(
            invoice_id,
            data["customer_id"],
            data["currency"],
            str(data["period_start"]),
            [_id(data["first_line"])],
            period_end=None if end is None else str(end),
        )

    def apply(self, name: str, data: Mapping[str, Any], version: int) -> None:
        allowed = ALLOWED_FROM.get(name)
        if allowed is not None and self.state not in allowed:
            self.problems.append(f"v{version}: {name} while {self.state}")
        self.state = _TO_STATE.get(name, self.state)
        if name == "LineAdded":
            self.lines.append(_id(data["line_id"]))
        elif name == "DraftCreated":
            self.stripe_invoice_id = data["stripe_invoice_id"]
        elif name == "DraftReplaced":
            self._draft_replaced(data["lost"], version)
        elif name == "FinalizeStarted":
            named = [_id(line) for line in data["lines"]]
            self.final_sequences = dict(zip(named, data["sequences"], strict=False))
            self.expected_total = data["expected_total"]
            if sorted(named) != sorted(self.lines):
                self.problems.append(f"v{version}: finalizing names lines other than its own")
        elif name == "Finalized":
            self.total = data["total"]
        elif name == "Paid":
            self.amount_paid, self.paid_from = data["amount_paid"], data["source"]
        elif name == "CreditRequested":
            txn = _id(data["transaction_id"])
            if txn in self.requested:
                self.problems.append(f"v{version}: credit for {txn} requested twice")
            self.requested[txn] = data["amount"]
        elif name == "Credited":
            note = data["credit_note_id"]
            if note in self.credited:
                self.problems.append(f"v{version}: credit note {note} recorded twice")
            self.credited[note] = (uuid_text(data["transaction_id"]) or "", data["amount"])

    def _draft_replaced(self, lost: str, version: int) -> None:
        """Stripe lost the draft: the invoice is billed on a new one, closed again."""
        if lost != self.stripe_invoice_id:
            self.problems.append(
                f"v{version}: replaces draft {lost}, its draft is {self.stripe_invoice_id}"
            )
        self.stripe_invoice_id = None
        if self.state is S.FINALIZING:
            self.state = S.CLOSED
        self.final_sequences, self.expected_total = {}, None


def _id(value: Any) -> str:
    text = uuid_text(value)
    assert text is not None
    return text


def check_invoices(
    invoices: Mapping[str, InvoiceAudit],
    lines: Mapping[str, LineAudit],
    txns: Mapping[str, TxnAudit],
    paid_webhooks: Collection[str] | None = None,
) -> list[Finding]:
    """Every invoice's own problems and how it agrees with its lines, transactions and
    (with ``paid_webhooks``: the event ids received) the webhooks that paid it."""
    findings: list[Finding] = []
    for inv in invoices.values():
        findings += [Finding("invoice", inv.invoice_id, p) for p in inv.problems]
        findings += _totals(inv, lines)
        findings += _credits(inv, lines, txns)
        if inv.state is S.PAID and paid_webhooks is not None:
            source = inv.paid_from
            if source != "finalize" and source not in paid_webhooks:
                findings.append(
                    Finding("invoice", inv.invoice_id, f"paid from {source}, never received")
                )
        if inv.state is S.PAID and inv.total is not None and inv.amount_paid != inv.total:
            findings.append(
                Finding(
                    "invoice",
                    inv.invoice_id,
                    f"paid {_money(inv.amount_paid, inv)} of a total of {_money(inv.total, inv)}",
                )
            )
    return findings


def _totals(inv: InvoiceAudit, lines: Mapping[str, LineAudit]) -> list[Finding]:
    if inv.expected_total is None:
        return []
    found: list[Finding] = []
    billed = 0
    for line_id, sequence in inv.final_sequences.items():
        line = lines.get(line_id)
        if line is None:
            found.append(Finding("invoice", inv.invoice_id, f"line {line_id}: no such line"))
            continue
        billed += line.billed_at.get(sequence, 0)
        if line.sequence != sequence:
            found.append(
                Finding(
                    "invoice",
                    inv.invoice_id,
                    f"line {line_id} changed after finalizing (v{sequence} -> v{line.sequence})",
                )
            )
    if billed != inv.expected_total:
        found.append(
            Finding(
                "invoice",
                inv.invoice_id,
                f"finalizing expected {_money(inv.expected_total, inv)}; its lines billed"
                f" {_money(billed, inv)}",
            )
        )
    if inv.total is not None and inv.total != inv.expected_total:
        found.append(
            Finding(
                "invoice",
                inv.invoice_id,
                f"Stripe finalized {_money(inv.total, inv)}; its lines billed"
                f" {_money(inv.expected_total, inv)}",
            )
        )
    return found


def _credits(
    inv: InvoiceAudit, lines: Mapping[str, LineAudit], txns: Mapping[str, TxnAudit]
) -> list[Finding]:
    found: list[Finding] = []
    shares: dict[str, int] = {}
    if inv.requested:
        for line_id in inv.final_sequences:
            line = lines.get(line_id)
            if line is not None:
                held = {t: amount for t, (amount, _) in line.members.items()}
                shares.update(shares_in_order(held))
    for txn_id, amount in inv.requested.items():
        if shares.get(txn_id) != amount:
            found.append(
                Finding(
                    "invoice",
                    inv.invoice_id,
                    f"credit of {_money(amount, inv)} requested for {txn_id}; its billed share"
                    f" is {_money(shares.get(txn_id), inv)}",
                )
            )
        txn = txns.get(txn_id)
        if txn is None or txn.state is not TxnState.COMPENSATED:
            found.append(
                Finding("invoice", inv.invoice_id, f"credit for {txn_id}, not compensated")
            )
    issued: dict[str, int] = {}
    for note, (txn_id, amount) in inv.credited.items():
        if txn_id == "":
            continue  # a credit note made in Stripe, not by the ledger: counted below
        if txn_id in issued:
            found.append(Finding("invoice", inv.invoice_id, f"{txn_id} credited twice ({note})"))
        issued[txn_id] = amount
        if inv.requested.get(txn_id) != amount:
            found.append(
                Finding(
                    "invoice",
                    inv.invoice_id,
                    f"credit note {note} of {_money(amount, inv)} for {txn_id}; requested"
                    f" {_money(inv.requested.get(txn_id), inv)}",
                )
            )
    credited = sum(amount for _, amount in inv.credited.values())
    if inv.total is not None and credited > inv.total:
        found.append(
            Finding(
                "invoice",
                inv.invoice_id,
                f"credited {_money(credited, inv)} of a total of {_money(inv.total, inv)}",
            )
        )
    return found


def _money(amount: int | None, inv: InvoiceAudit) -> str:
    return amount_text(amount, inv.currency)


def credited_transactions(invoices: Mapping[str, InvoiceAudit]) -> frozenset[str]:
    """Transactions reversed by a credit note request (they stay on their final line)."""
    return frozenset(t for inv in invoices.values() for t in inv.requested)


_FINAL_IN_LEDGER = (S.FINALIZED, S.PAYMENT_FAILED, S.PAID, S.UNCOLLECTIBLE, S.VOID)


def check_stripe_invoices(
    stripe: Collection[StripeInvoice], invoices: Mapping[str, InvoiceAudit], *, whole: bool
) -> list[Finding]:
    """Every invoice the ledger finalized against Stripe's own listing (I10): final there,
    at the expected total; and (``whole``: every invoice of the ledger was replayed) no
    invoice of the ledger's final in Stripe that the ledger never finalized."""
    by_id = {i.id: i for i in stripe}
    found: list[Finding] = []
    for inv in invoices.values():
        if inv.state not in _FINAL_IN_LEDGER or inv.stripe_invoice_id is None:
            continue
        held = by_id.get(inv.stripe_invoice_id)
        if held is None:
            if whole:
                found.append(
                    Finding("stripe", inv.invoice_id, f"{inv.stripe_invoice_id} not in Stripe")
                )
            continue
        if held.status == "draft":
            found.append(Finding("stripe", inv.invoice_id, f"{held.id} is still a draft in Stripe"))
        elif inv.expected_total is not None and held.total != inv.expected_total:
            found.append(
                Finding(
                    "stripe",
                    inv.invoice_id,
                    f"Stripe's invoice {held.id} totals {_money(held.total, inv)}; the ledger"
                    f" expected {_money(inv.expected_total, inv)}",
                )
            )
    if whole:
        ours = {inv.stripe_invoice_id: inv for inv in invoices.values()}
        for held in stripe:
            mine = ours.get(held.id)
            if mine is not None and held.status != "draft" and mine.state not in (
                *_FINAL_IN_LEDGER, S.FINALIZING,
            ):  # fmt: skip
                found.append(
                    Finding(
                        "stripe",
                        mine.invoice_id,
                        f"{held.id} is {held.status} in Stripe; the ledger's invoice is"
                        f" {mine.state}",
                    )
                )
    return found
