"""The audit of prepaid credits (pure): a fold of each account's credit events, and the
checks that tie them to the transactions and to the invoices' credit lines (I11).

Like ``domain.audit``, the fold reads plain stored data (registered types as their
encoded strings). What it proves, per grant and per account:

* conservation: ``granted = consumed + expired + voided + remaining``, the remaining
  computed from the events alone, and never below zero: no consumption beyond what was
  left, an expiry or a void takes exactly what was left, once;
* nothing is consumed from a grant that is unknown, closed, not yet effective or past
  its expiry at the event's moment (``domain.credits``: decided by the save's moment),
  or purchased and not paid yet (between ``CreditAwaitingPayment`` and
  ``CreditActivated``); a grant is activated only while it awaits payment;
* under the ``block`` policy, every reserved transaction that consumed credit consumed
  its whole amount (the customer's credit never went below zero to bill it);
* what the invoices' credit lines took off for each usage line is exactly what the
  grants gave the transactions on that line, for as many transactions
  (``CreditsApplied`` against the consumption, ``CreditsConsumed`` or a reservation's
  ``burnt_from``, and the line each transaction joined),
  so no credit is billed twice nor given without being consumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any

from domain.audit import Finding, TxnAudit
from domain.money import format_money

__all__ = ["CreditAudit", "GrantAudit", "check_credits"]


@dataclass(slots=True)
class GrantAudit:
    """One grant as the account's events say it is."""

    amount: int
    effective_at: datetime
    expires_at: datetime | None
    consumed: Decimal = Decimal(0)
    expired: Decimal = Decimal(0)
    voided: Decimal = Decimal(0)
    pending: bool = False  # purchased, its invoice not paid yet

    @property
    def remaining(self) -> Decimal:
        with localcontext(prec=80):
            return Decimal(self.amount) - self.consumed - self.expired - self.voided


@dataclass(slots=True)
class CreditAudit:
    """One account's grants and policy, and what its consumption gave each transaction."""

    customer_id: str
    currency: str
    policy: str = "overage"
    grants: dict[str, GrantAudit] = field(default_factory=dict)
    consumed_by: dict[str, Decimal] = field(default_factory=dict)  # transaction: credit
    blocked_at: dict[str, bool] = field(default_factory=dict)  # transaction: under block
    problems: list[str] = field(default_factory=list)

    def apply(self, name: str, data: Mapping[str, Any], version: int) -> None:
        if name == "CreditPolicySet":
            self.policy = data["policy"]
        elif name == "CreditGranted":
            expires = data["expires_at"]
            self.grants[data["grant_id"]] = GrantAudit(
                data["amount"],
                datetime.fromisoformat(data["effective_at"]),
                datetime.fromisoformat(expires) if expires else None,
            )
        elif name in ("CreditAwaitingPayment", "CreditActivated"):
            self._payment(name, data, version)
        elif name in ("CreditVoided", "CreditExpired"):
            self._close(name, data, version)
        elif name == "CreditsConsumed":
            self._consumed(data, version, datetime.fromisoformat(data["at"]))
        elif name == "AmountsReserved" and data.get("burnt_from") is not None:
            ids = data["transaction_ids"]  # each amount burnt whole from the one grant
            burnt = {**data, "grant_ids": [data["burnt_from"]] * len(ids)}
            self._consumed(burnt, version, datetime.fromisoformat(data["burnt_at"]))

    def _close(self, name: str, data: Mapping[str, Any], version: int) -> None:
        grant = self._grant(data["grant_id"], version)
        if grant is None:
            return
        amount, left = Decimal(data["amount"]), grant.remaining
        if amount != left:
            self.problems.append(
                f"v{version}: {name} of grant {data['grant_id']} takes {self._money(amount)};"
                f" {self._money(left)} was left"
            )
        with localcontext(prec=80):  # exact: the default context keeps 28 digits
            if name == "CreditVoided":
                grant.voided += amount
            else:
                grant.expired += amount

    def _payment(self, name: str, data: Mapping[str, Any], version: int) -> None:
        grant = self._grant(data["grant_id"], version)
        if grant is None:
            return
        waiting = name == "CreditAwaitingPayment"
        if grant.pending == waiting or grant.voided:
            self.problems.append(
                f"v{version}: {name} of grant {data['grant_id']}, which"
                f" {'awaits payment already' if grant.pending else 'awaits no payment'}"
            )
        grant.pending = waiting

    def _consumed(self, data: Mapping[str, Any], version: int, at: datetime) -> None:
        ids, grants, amounts = data["transaction_ids"], data["grant_ids"], data["amounts"]
        if not len(ids) == len(grants) == len(amounts):
            self.problems.append(f"v{version}: CreditsConsumed lists of unequal lengths")
            return
        for txn_id, grant_id, text in zip(ids, grants, amounts, strict=True):
            grant, amount = self._grant(grant_id, version), Decimal(text)
            with localcontext(prec=80):
                self.consumed_by[txn_id] = self.consumed_by.get(txn_id, Decimal(0)) + amount
            self.blocked_at[txn_id] = self.policy == "block"
            if grant is None:
                continue
            if grant.expired or grant.voided or grant.pending or not _live(grant, at):
                self.problems.append(
                    f"v{version}: {txn_id} consumed grant {grant_id}, which was not live"
                )
            if amount <= 0 or amount > grant.remaining:
                self.problems.append(
                    f"v{version}: {txn_id} consumed {self._money(amount)} of grant {grant_id},"
                    f" which had {self._money(grant.remaining)} left"
                )
            with localcontext(prec=80):
                grant.consumed += amount

    def _grant(self, grant_id: str, version: int) -> GrantAudit | None:
        grant = self.grants.get(grant_id)
        if grant is None:
            self.problems.append(f"v{version}: no grant {grant_id}")
        return grant

    def _money(self, amount: Decimal | int) -> str:
        return format_money(amount, self.currency)


def _live(grant: GrantAudit, at: datetime) -> bool:
    return grant.effective_at <= at and (grant.expires_at is None or at < grant.expires_at)


def check_credits(
    accounts: Mapping[tuple[str, str], CreditAudit],
    applied: Mapping[str, tuple[Decimal, int]],
    txns: Mapping[str, TxnAudit],
) -> list[Finding]:
    """Each account's own problems, a grant below zero, a transaction under ``block``
    only partly covered, and credit lines that do not match the consumption;
    ``applied``: each usage line's credit as the invoices' credit lines record it, and
    the records it credited (``domain.audit_lines.credit_applied``)."""
    findings = []
    given: dict[str, tuple[Decimal, int]] = {}  # per usage line, from the consumption
    for (customer, currency), account in accounts.items():
        subject = f"{customer}/{currency}"
        findings += [Finding("credits", subject, p) for p in account.problems]
        for grant_id, grant in account.grants.items():
            if grant.remaining < 0:
                findings.append(
                    Finding("credits", f"{subject} {grant_id}",
                            f"below zero: {format_money(grant.remaining, currency)} left")
                )  # fmt: skip
        for txn_id, credit in account.consumed_by.items():
            txn = txns.get(txn_id)
            if txn is None or txn.line_id is None:
                findings.append(
                    Finding("credits", txn_id,
                            f"consumed {format_money(credit, currency)} and is on no line")
                )  # fmt: skip
                continue
            total, count = given.get(txn.line_id, (Decimal(0), 0))
            with localcontext(prec=80):
                given[txn.line_id] = (total + credit, count + 1)
            if account.blocked_at.get(txn_id) and credit != txn.amount:
                findings.append(
                    Finding("credits", txn_id,
                            f"consumed {format_money(credit, currency)} under the block policy;"
                            f" its amount is {format_money(txn.amount, currency)}")
                )  # fmt: skip
    none = (Decimal(0), 0)
    for line_id in sorted(set(given) | set(applied)):
        (gave, records), (took, credited) = given.get(line_id, none), applied.get(line_id, none)
        if (gave, records) != (took, credited):
            findings.append(
                Finding("credits", line_id,
                        f"its transactions' grants gave {gave} to {records} of them; its"
                        f" invoice's credit line took off {took} for {credited}")
            )  # fmt: skip
    return findings
