"""The audit of purchased credit against Stripe (pure): a fold of each purchase's events
(``domain.purchase``), and the check of its one-off invoice against Stripe's own listing.

A purchase and its grant change in one save (``CustomerAccount.settle_purchase``): the
purchase ``Paid`` is the grant made live, ``Unpaid`` is the grant voided with the reason,
and a purchase neither paid nor unpaid is a grant still awaiting payment (the order of
those account events is checked by ``domain.audit_credits``). So the purchase's state
says the grant's, and ``check_stripe_purchases`` proves, for every purchase whose draft
the ledger recorded (before that there is no invoice to compare):

* its invoice is in Stripe, of the Stripe customer the ledger recorded, in the
  purchase's currency, and (once final) for exactly its price;
* its status agrees with the grant: a live grant's invoice is ``paid``; a grant voided
  because its invoice was void or uncollectible has that invoice ``void`` or
  ``uncollectible``; a grant voided for another reason (Stripe refused a step, or
  finalized another total) has an invoice that is not ``paid``; a pending grant's
  invoice is not ``paid``, ``void`` nor ``uncollectible`` (else the webhook that says so,
  the one path by which the ledger learns it, was not processed: a ``purchase_webhook``
  finding) and, once the ledger recorded it final, not a draft;
* a grant voided by an operator while awaiting payment: the invoice is void (or, a
  draft, deleted: not in Stripe) unless the ledger recorded it paid after the void, in
  which case it is ``paid`` (and ``check_purchases``, from the history alone, reports
  it until an operator reinstates it: a ``purchase`` finding);
* no invoice in Stripe names a purchase (its metadata's ``purchase_id``) the ledger never
  recorded, nor a purchase whose invoice the ledger recorded is another one; one that
  names a purchase whose draft the ledger has not recorded (its answer lost) is still a
  draft (the ledger finalizes only the invoice it recorded).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from domain.audit import Finding
from domain.audit_invoices import StripeInvoice
from domain.money import format_money
from domain.purchase import PurchaseState

__all__ = ["PurchaseAudit", "check_purchases", "check_stripe_purchases"]

S = PurchaseState
# What Stripe's statuses a ledger learns from a webhook, and that webhook's type.
_WEBHOOKS = {
    "paid": "invoice.paid",
    "void": "invoice.voided",
    "uncollectible": "invoice.marked_uncollectible",
}


@dataclass(slots=True)
class PurchaseAudit:
    """One purchase as its events say it is (from its top-up's request, if any)."""

    purchase_id: str
    customer_id: str
    currency: str
    grant_id: str
    price: int
    state: PurchaseState = S.INVOICING
    stripe_invoice_id: str | None = None
    stripe_customer_id: str | None = None
    unpaid: str = ""  # why it was never paid: void, uncollectible, refused, mismatch, deleted
    amount: int = 0
    top_up: bool = False
    requested: bool = False  # a top-up requested whose purchase has not started yet
    attempts: int = 0
    amount_paid: int = 0  # paid after its grant was voided
    reinstated_grant_id: str | None = None

    @classmethod
    def started(cls, purchase_id: str, data: Mapping[str, Any]) -> PurchaseAudit:
        return cls(
            purchase_id, data["customer_id"], data["currency"], data["grant_id"], data["price"],
            amount=data["amount"], top_up=data["top_up"],
        )  # fmt: skip

    @classmethod
    def top_up_requested(cls, data: Mapping[str, Any]) -> PurchaseAudit:
        """A top-up's purchase as ``CustomerAccount.TopUpStarted`` requests it."""
        return cls(
            data["purchase_id"], data["customer_id"], data["currency"], data["grant_id"],
            data["price"], amount=data["buy"], top_up=True, requested=True,
        )  # fmt: skip

    @property
    def row_state(self) -> str:
        """Its state as ``billing.credit_purchases`` says it."""
        return "requested" if self.requested else str(self.state)

    def apply(self, name: str, data: Mapping[str, Any]) -> None:
        if name == "DraftCreated":
            self.stripe_invoice_id = data["stripe_invoice_id"]
            self.stripe_customer_id = data["stripe_customer_id"]
        elif name == "AttemptFailed":
            self.attempts = data["attempt"]
        elif name == "Finalized" and self.state is not S.VOIDING:
            self.state = S.FINALIZED
        elif name == "Paid":
            self.state = S.PAID
        elif name == "Unpaid":
            self.state, self.unpaid = S.UNPAID, data["status"]
        elif name == "VoidRequested":
            self.state = S.VOIDING
        elif name == "PaidAfterVoid":
            self.state, self.amount_paid = S.NEEDS_ATTENTION, data["amount_paid"]
        elif name == "Reinstated":
            self.state, self.reinstated_grant_id = S.REINSTATED, data["grant_id"]


def check_purchases(
    purchases: Mapping[str, PurchaseAudit], granted: Mapping[tuple[str, str], Collection[str]]
) -> list[Finding]:
    """From the history alone: a purchase paid after its grant was voided and not settled
    by an operator (the customer paid for credit they do not have), and one settled whose
    new grant the account does not hold (``granted``: each account's grant ids)."""
    found: list[Finding] = []
    for purchase in purchases.values():
        paid = format_money(purchase.amount_paid, purchase.currency)
        if purchase.state is S.NEEDS_ATTENTION:
            found.append(
                Finding(
                    "purchase",
                    purchase.purchase_id,
                    f"its invoice {purchase.stripe_invoice_id} was paid ({paid}) after grant"
                    f" {purchase.grant_id} was voided, and no operator settled it:"
                    f" `billing-ledger credits reinstate {purchase.customer_id}"
                    f" {purchase.currency} {purchase.grant_id} --reason ...`",
                )
            )
        elif purchase.state is S.REINSTATED and purchase.reinstated_grant_id not in granted.get(
            (purchase.customer_id, purchase.currency), ()
        ):
            found.append(
                Finding(
                    "purchase",
                    purchase.purchase_id,
                    f"reinstated as grant {purchase.reinstated_grant_id}, which the account"
                    " does not hold",
                )
            )
    return found


def check_stripe_purchases(
    stripe: Collection[StripeInvoice], purchases: Mapping[str, PurchaseAudit]
) -> list[Finding]:
    """Every purchase's invoice against Stripe's listing (of every invoice of the
    customers whose purchases are given), and every purchase invoice in Stripe that the
    ledger did not make."""
    by_id = {i.id: i for i in stripe}
    found: list[Finding] = []
    for purchase in purchases.values():
        if purchase.stripe_invoice_id is None:
            continue
        held = by_id.get(purchase.stripe_invoice_id)
        if held is None and purchase.unpaid == "deleted":
            continue  # its draft deleted when its grant was voided: gone from Stripe
        if held is None:
            found.append(
                Finding(
                    "purchase",
                    purchase.purchase_id,
                    f"its invoice {purchase.stripe_invoice_id} is not in Stripe",
                )
            )
        else:
            found += _against(purchase, held)
    for held in stripe:
        if held.purchase_id is None:
            continue
        mine = purchases.get(held.purchase_id)
        if mine is None:
            whose = "a purchase the ledger never recorded"
        elif mine.stripe_invoice_id is None and held.status != "draft":
            whose = "this purchase, of which the ledger recorded no invoice"
        elif mine.stripe_invoice_id in (None, held.id):
            continue  # its invoice, or its draft whose answer was lost
        else:
            whose = f"this purchase; the ledger's invoice of it is {mine.stripe_invoice_id}"
        found.append(
            Finding(
                "purchase",
                held.purchase_id,
                f"Stripe's invoice {held.id} ({held.status}, {_money(held)}) names {whose}",
            )
        )
    return found


def _against(purchase: PurchaseAudit, held: StripeInvoice) -> list[Finding]:
    """How one purchase's invoice in Stripe differs from what the ledger recorded."""
    problems: list[str] = []
    if held.customer != purchase.stripe_customer_id:
        problems.append(
            f"Stripe's invoice {held.id} is of customer {held.customer}; the ledger made it"
            f" for {purchase.stripe_customer_id}"
        )
    # A draft's total is not final; a mismatch is recorded already (the grant voided).
    total_checked = held.status != "draft" and purchase.unpaid != "mismatch"
    if held.currency.upper() != purchase.currency.upper() or (
        total_checked and held.total != purchase.price
    ):
        problems.append(
            f"Stripe's invoice {held.id} asks {_money(held)}; the purchase's price is"
            f" {format_money(purchase.price, purchase.currency)}"
        )
    status = _status_problem(purchase, held)
    if status is not None:
        problems.append(status)
    found = [Finding("purchase", purchase.purchase_id, p) for p in problems]
    webhook = _WEBHOOKS.get(held.status)
    if purchase.state in (S.INVOICING, S.FINALIZED, S.VOIDING) and webhook is not None:
        found.append(
            Finding(
                "purchase_webhook",
                purchase.purchase_id,
                f"Stripe's invoice {held.id} is {held.status}; the ledger's grant"
                f" {purchase.grant_id} still awaits payment ({webhook} not processed)",
            )
        )
    return found


def _status_problem(purchase: PurchaseAudit, held: StripeInvoice) -> str | None:
    """Where Stripe's status contradicts the grant's state (a pending grant's settled
    invoice is a ``purchase_webhook`` finding instead)."""
    if purchase.state is S.PAID and held.status != "paid":
        return (
            f"Stripe's invoice {held.id} is {held.status}; the ledger recorded it paid and"
            f" made grant {purchase.grant_id} live"
        )
    if purchase.state in (S.NEEDS_ATTENTION, S.REINSTATED) and held.status != "paid":
        return (
            f"Stripe's invoice {held.id} is {held.status}; the ledger recorded it paid after"
            f" grant {purchase.grant_id} was voided"
        )
    if purchase.unpaid == "deleted":
        return (
            f"Stripe's invoice {held.id} is {held.status}; the ledger recorded it deleted"
            f" when grant {purchase.grant_id} was voided"
        )
    if purchase.state is S.UNPAID and purchase.unpaid in ("void", "uncollectible"):
        if held.status != purchase.unpaid:
            return (
                f"Stripe's invoice {held.id} is {held.status}; the ledger voided grant"
                f" {purchase.grant_id} as its invoice was {purchase.unpaid}"
            )
    elif purchase.state is S.UNPAID and held.status == "paid":
        return (
            f"Stripe's invoice {held.id} is paid; the ledger voided grant"
            f" {purchase.grant_id} ({purchase.unpaid}): settle it by hand"
        )
    if purchase.state is S.FINALIZED and held.status == "draft":
        return f"Stripe's invoice {held.id} is still a draft; the ledger recorded it final"
    return None


def _money(held: StripeInvoice) -> str:
    return format_money(held.total, held.currency)
