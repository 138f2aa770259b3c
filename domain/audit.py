"""The audit's pure logic: a fold over one transaction's events, balances, invariants.

A transaction's history is replayed from plain data (the event's class name and its
stored fields, with registered types such as datetimes as their encoded strings), not
by rebuilding the aggregate: an audit replays millions of events. The legal order is
``domain.transaction.ALLOWED_FROM``, the table the aggregate's commands check, and
``TxnAudit.apply`` repeats each ``@event`` method's effect on the state; the unit tests
prove it agrees with the aggregate on every sequence.

A ``Repriced`` event (``domain.repricing``) keeps the state and moves the transaction's
amount and the version that priced it: its old amount and version must be the ones the
history holds, and the price audit then checks the new amount against the new version.

Findings are facts, not exceptions: an audit reports all of them. Each transaction's
amount is recomputed from the price book version its Metered names in
``domain.audit_prices`` (``priced_by`` below).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

from domain.ids import contract_id
from domain.money import format_money
from domain.price_book import INITIAL_VERSION
from domain.transaction import ALLOWED_FROM, TxnState

__all__ = [
    "Balance",
    "Finding",
    "InvoiceItem",
    "TxnAudit",
    "amount_text",
    "balances_of",
    "check_balances",
    "check_stripe",
    "check_transactions",
    "uuid_text",
]

_TO_STATE = {
    "Reserved": TxnState.RESERVED,
    "Settled": TxnState.RESERVED,
    "ChargeFailed": TxnState.CHARGE_FAILED,
    "Charged": TxnState.CHARGED,
    "Compensated": TxnState.COMPENSATED,
}


@dataclass(frozen=True)
class Finding:
    """One thing that does not hold: its kind, what it is about, and why."""

    kind: str  # chain, sequence, double_charge, overdue, conservation, projection, stripe, ...
    subject: str  # a transaction id, "customer/currency", an aggregate id and version, ...
    detail: str


@dataclass(slots=True)
class TxnAudit:
    """One transaction as its events say it is (what ``billing.transactions`` should show)."""

    transaction_id: str
    customer_id: str
    usage_id: str
    meter: str
    quantity: str
    amount: Decimal  # exact minor units
    currency: str
    metered_at: str
    state: TxnState = TxnState.METERED
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: str | None = None
    stripe_object_id: str | None = None
    compensation_reason: str | None = None
    refused: bool = False  # compensated straight from Metered (the spend limit said no)
    charges: int = 0
    line_id: str | None = None  # the invoice line it joined, and the line's version then
    line_version: int | None = None
    line_sequence: int | None = None  # the acknowledged line sequence that charged it
    problems: tuple[str, ...] = ()  # a tuple: millions of these are built per audit
    # The price book and version its Metered names; None before price books.
    priced_by: tuple[str | None, int] | None = None
    # Its Metered came before the Published of the version it names, in the log.
    before_its_version: bool = False
    # The customer's contract version its Metered names (None: the list price priced it),
    # and whether its Metered came before that version's Set in the log.
    contract_version: int | None = None
    before_its_contract: bool = False

    @property
    def price_version(self) -> int:
        """The version that prices it now (``billing.transactions.price_version``):
        before price books, the initial version its Metered loads naming."""
        return INITIAL_VERSION if self.priced_by is None else self.priced_by[1]

    @classmethod
    def metered(
        cls,
        transaction_id: str,
        data: Mapping[str, Any],
        published: Container[tuple[str | None, int]] | None = None,
        contracts: Container[tuple[str, int]] | None = None,
    ) -> TxnAudit:
        """The transaction as its Metered event starts it; ``published``, when given: the
        price book versions published before it in the log (``before_its_version``);
        ``contracts``: the contract versions set before it, as (contract id, number)."""
        number = data.get("price_version")  # none in histories from before price books
        priced_by = None if number is None else (uuid_text(data["price_book_id"]), number)
        contract_version = data.get("contract_version")  # none before contracts
        return cls(
            transaction_id,
            data["customer_id"],
            data["usage_id"],
            data["meter"],
            str(data["quantity"]),
            Decimal(data["amount"]),  # an integer in histories from before exact amounts
            data["currency"],
            str(data["timestamp"]),
            priced_by=priced_by,
            before_its_version=(
                published is not None and priced_by is not None and priced_by not in published
            ),
            contract_version=contract_version,
            before_its_contract=(
                contracts is not None
                and contract_version is not None
                and (str(contract_id(data["customer_id"])), contract_version) not in contracts
            ),
        )

    def apply(self, name: str, data: Mapping[str, Any], version: int) -> None:
        """Apply one later event; an illegal one is recorded in ``problems`` and applied."""
        allowed = ALLOWED_FROM.get(name)
        if allowed is None:
            self.problems += (f"v{version}: {name} is not a transaction event after Metered",)
            return
        if self.state not in allowed:
            self.problems += (f"v{version}: {name} after {self.state} (illegal transition)",)
        check = _CHECKS.get(name)
        if check is not None:
            problem = check(self, data)
            if problem:
                self.problems += (f"v{version}: {problem}",)
        _APPLY[name](self, data)
        self.state = _TO_STATE.get(name, self.state)  # Repriced keeps the state


def _check_failed(txn: TxnAudit, data: Mapping[str, Any]) -> str | None:
    if data["attempt"] != txn.attempts + 1:
        return f"ChargeFailed attempt {data['attempt']} after {txn.attempts} attempts"
    if data["retryable"] and data.get("next_attempt_at") is None:
        return "a retryable ChargeFailed without next_attempt_at"
    return None


def _check_charged(txn: TxnAudit, data: Mapping[str, Any]) -> str | None:
    if txn.charges:
        return "charged twice"
    line, sequence = uuid_text(data.get("line_id")), data.get("sequence")
    if line != txn.line_id:
        return f"Charged names line {line}, the transaction is in line {txn.line_id}"
    if line is not None and (sequence is None or sequence < (txn.line_version or 0)):
        return f"Charged at line sequence {sequence}, before it joined at {txn.line_version}"
    return None


def _check_settled(txn: TxnAudit, data: Mapping[str, Any]) -> str | None:
    if txn.line_id is not None:
        return f"joins line {uuid_text(data['line_id'])}, but is in line {txn.line_id} already"
    return None


def _check_compensated(txn: TxnAudit, data: Mapping[str, Any]) -> str | None:
    if not str(data.get("reason") or "").strip():
        return "Compensated without a reason"
    if data["from_state"] != str(txn.state):
        return f"Compensated says from {data['from_state']}, the history says {txn.state}"
    if txn.state is TxnState.CHARGED and not data.get("stripe_reversal_id"):
        return "a reversed charge without the id of its Stripe reversal"
    return None


def _check_repriced(txn: TxnAudit, data: Mapping[str, Any]) -> str | None:
    old = Decimal(data["old_amount"])
    named = txn.priced_by[1] if txn.priced_by is not None else None
    if old != txn.amount or data["old_price_version"] != named:
        return (
            f"Repriced from {format_money(old, txn.currency)} (version"
            f" {data['old_price_version']}), the history holds"
            f" {format_money(txn.amount, txn.currency)} (version {named})"
        )
    if txn.line_id is None:
        return "Repriced, but in no line"
    if data["state"] != str(txn.state):
        return f"Repriced says {data['state']}, the history says {txn.state}"
    return None


def _apply_repriced(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.amount = Decimal(data["amount"])
    txn.priced_by = (uuid_text(data["price_book_id"]), data["price_version"])


def _apply_reserved(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.line_id = uuid_text(data.get("line_id"))
    txn.line_version = data.get("line_version")


def _apply_settled(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.line_id = uuid_text(data["line_id"])
    txn.line_version = data["line_version"]
    txn.next_attempt_at = None


def _apply_failed(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.attempts = data["attempt"]
    txn.last_error = f"{data['error_class']}: {data['message']}"
    txn.next_attempt_at = data["next_attempt_at"]


def _apply_charged(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.charges += 1
    txn.stripe_object_id = data["stripe_object_id"]
    txn.line_sequence = data.get("sequence")
    txn.next_attempt_at = None


def _apply_compensated(txn: TxnAudit, data: Mapping[str, Any]) -> None:
    txn.compensation_reason = data["reason"]
    txn.refused = data["from_state"] == str(TxnState.METERED)
    txn.next_attempt_at = None


_CHECKS = {
    "Settled": _check_settled,
    "ChargeFailed": _check_failed,
    "Charged": _check_charged,
    "Repriced": _check_repriced,
    "Compensated": _check_compensated,
}
_APPLY = {
    "Reserved": _apply_reserved,
    "Settled": _apply_settled,
    "ChargeFailed": _apply_failed,
    "Charged": _apply_charged,
    "Repriced": _apply_repriced,
    "Compensated": _apply_compensated,
}


@dataclass
class Balance:
    """One customer's money in one currency, in minor units (``billing.customer_balances``)."""

    metered: Decimal = Decimal(0)
    charged: Decimal = Decimal(0)
    compensated: Decimal = Decimal(0)
    in_flight: Decimal = Decimal(0)
    transactions: int = 0
    refused: int = 0
    spend_limit: int | None = None

    @property
    def available(self) -> Decimal | None:
        """What the limit still allows (None: unlimited), as the projection computes it."""
        if self.spend_limit is None:
            return None
        return max(self.spend_limit - (self.metered - self.compensated), Decimal(0))

    @property
    def conserved(self) -> bool:
        return self.metered == self.charged + self.compensated + self.in_flight


def balances_of(
    txns: Iterable[TxnAudit], limits: Mapping[tuple[str, str], int | None]
) -> dict[tuple[str, str], Balance]:
    """Balances per (customer, currency): each transaction's amount where its state puts it."""
    out: dict[tuple[str, str], Balance] = {}
    for key, limit in limits.items():
        out[key] = Balance(spend_limit=limit)
    with localcontext(prec=80):  # sums of exact amounts stay exact
        _add_up(txns, out)
    return out


def _add_up(txns: Iterable[TxnAudit], out: dict[tuple[str, str], Balance]) -> None:
    for txn in txns:
        bal = out.setdefault((txn.customer_id, txn.currency), Balance())
        bal.transactions += 1
        bal.metered += txn.amount
        if txn.state is TxnState.CHARGED:
            bal.charged += txn.amount
        elif txn.state is TxnState.COMPENSATED:
            bal.compensated += txn.amount
            bal.refused += txn.refused
        else:
            bal.in_flight += txn.amount


def check_transactions(
    txns: Iterable[TxnAudit],
    *,
    now: datetime,
    horizon: timedelta,
    failing_lines: Collection[str] = (),
) -> list[Finding]:
    """Illegal sequences, double charges, and what is past its deadline without a reason
    (a transaction whose line's push is failing has its reason recorded there)."""
    findings: list[Finding] = []
    for txn in txns:
        for problem in txn.problems:
            kind = "double_charge" if problem.endswith("charged twice") else "sequence"
            findings.append(Finding(kind, txn.transaction_id, problem))
        if txn.state.is_terminal or txn.last_error or txn.line_id in failing_lines:
            continue
        deadline = datetime.fromisoformat(txn.metered_at) + horizon
        if deadline < now:
            findings.append(
                Finding(
                    "overdue",
                    txn.transaction_id,
                    f"{txn.state} since {txn.metered_at}, past its deadline {deadline.isoformat()}"
                    " with no failure or reason recorded",
                )
            )
    return findings


def check_balances(balances: Mapping[tuple[str, str], Balance]) -> list[Finding]:
    """Conservation (I4): metered = charged + compensated + in flight, per customer and currency."""
    return [
        Finding(
            "conservation",
            f"{customer}/{currency}",
            f"metered {format_money(bal.metered, currency)} != charged"
            f" {format_money(bal.charged, currency)} + compensated"
            f" {format_money(bal.compensated, currency)} + in flight"
            f" {format_money(bal.in_flight, currency)}",
        )
        for (customer, currency), bal in sorted(balances.items())
        if not bal.conserved
    ]


@dataclass(frozen=True)
class InvoiceItem:
    """A live invoice item in Stripe, with the transaction (a charge from before lines)
    or the invoice line its metadata names."""

    id: str
    txn_id: str | None
    amount: int
    currency: str
    line_id: str | None = None  # an invoice line's item (its metadata names the line)


def check_stripe(
    items: Iterable[InvoiceItem], txns: Mapping[str, TxnAudit], *, foreign_items: bool = True
) -> list[Finding]:
    """Charges Stripe has that the ledger does not, and the reverse (I3).

    Each Charged transaction has exactly its recorded item, of its amount; a
    Compensated one has none, an unfinished one at most one. ``foreign_items``: also
    report items that name no transaction of the ledger (off for part of the history).
    """
    findings: list[Finding] = []
    by_txn: dict[str, list[InvoiceItem]] = {}
    for item in items:
        if item.line_id is not None:
            continue  # a line's item: ``domain.audit_lines.check_line_items``
        if item.txn_id is not None and item.txn_id in txns:
            by_txn.setdefault(item.txn_id, []).append(item)
        elif foreign_items:
            findings.append(
                Finding(
                    "stripe",
                    item.id,
                    f"Stripe has a charge of {format_money(item.amount, item.currency)} the"
                    f" ledger does not (metadata txn_id {item.txn_id or 'missing'})",
                )
            )
    for txn_id, txn in txns.items():
        live = by_txn.get(txn_id, [])
        if txn.line_id is not None and not live:
            continue  # charged through its line: ``domain.audit_lines.check_line_items``
        if txn.state is TxnState.CHARGED:
            findings.extend(_charged_vs_stripe(txn, live))
        elif live and (txn.state is TxnState.COMPENSATED or len(live) > 1):
            # One item of an unfinished transaction is a charge whose answer was lost:
            # the reconciler finds it. A compensated one must have none.
            findings.append(
                Finding("stripe", txn_id, f"{txn.state}, but Stripe holds {_ids(live)}")
            )
    return findings


def _charged_vs_stripe(txn: TxnAudit, live: list[InvoiceItem]) -> list[Finding]:
    ids = [i.id for i in live]
    if ids == [txn.stripe_object_id]:
        item = live[0]
        if item.amount == txn.amount and item.currency.upper() == txn.currency:
            return []
        detail = (
            f"Stripe holds {format_money(item.amount, item.currency)}, the ledger charged"
            f" {format_money(txn.amount, txn.currency)}"
        )
    elif not live:
        detail = f"charged as {txn.stripe_object_id}, which Stripe does not hold"
    else:
        detail = f"charged as {txn.stripe_object_id}, Stripe holds {_ids(live)}"
    return [Finding("stripe", txn.transaction_id, detail)]


def _ids(items: list[InvoiceItem]) -> str:
    return ", ".join(i.id for i in items)


def amount_text(amount: Decimal | int | None, currency: str) -> str:
    """An amount as a finding shows it (``format_money``); "none" where there is none (a
    credit never requested, a sequence a line never had)."""
    return "none" if amount is None else format_money(amount, currency)


def uuid_text(value: Any) -> str | None:
    """A UUID as the stored JSON has it (``{"_type_": "uuid_hex", "_data_": hex}``, or
    already text) in its canonical text form; None stays None."""
    if value is None:
        return None
    text = value["_data_"] if isinstance(value, dict) else str(value)
    h = text.replace("-", "")
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
