"""The audit of invoice lines (pure): folds of the lines' and the pushes' events, and the
checks that tie them to the transactions and to Stripe.

Like ``domain.audit``, the folds read plain stored data (registered types as their
encoded strings), not aggregates. What they prove, per line:

* every ``Settled``/``Removed``/``Repriced`` records the exact total the listed amounts add up to,
  and the billed amount is that total rounded once, half up (I8);
* a transaction is in exactly one line, once, with its own exact amount, and says so
  itself (its ``Reserved``/``Settled`` names the line and the version that took it);
* every ``Pushed`` acknowledged the billed total the line had at that sequence, and
  every Charged transaction's line was acknowledged at or after the version it joined
  (I3); a compensated transaction is no longer in any line;
* Stripe holds, for each line, exactly the items of its newest acknowledged push, of
  exactly its amounts, on the invoice the push names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from typing import Any

from domain.audit import Finding, InvoiceItem, TxnAudit, amount_text
from domain.closing import is_true_up
from domain.money import format_money, round_minor
from domain.transaction import TxnState

__all__ = ["LineAudit", "PushAudit", "check_line_items", "check_lines", "credit_applied"]


@dataclass(slots=True)
class LineAudit:
    """One invoice line as its events say it is."""

    line_id: str
    customer_id: str
    currency: str
    meter: str
    period_start: str
    exact_total: Decimal = Decimal(0)
    billed: int = 0
    transactions: int = 0
    sequence: int = 1
    members: dict[str, tuple[Decimal, int]] = field(default_factory=dict)  # id: amount, version
    billed_at: dict[int, int] = field(default_factory=lambda: {1: 0})  # version: billed
    problems: list[str] = field(default_factory=list)
    # A line priced by quantity: the version its key names, its quantity, and its records
    # in settlement order (id, quantity, amount), and what removals took back.
    price_version: int | None = None
    model: str | None = None
    tier: int | None = None
    quantity: Decimal = Decimal(0)
    settled: list[tuple[str, Decimal, Decimal]] = field(default_factory=list)
    removed: Decimal = Decimal(0)
    # A credit line (domain.credit_line): each usage line's credit, and the records it
    # credited there.
    credit_of_line: dict[str, Decimal] = field(default_factory=dict)
    credited_on_line: dict[str, int] = field(default_factory=dict)

    @classmethod
    def opened(cls, line_id: str, data: Mapping[str, Any]) -> LineAudit:
        return cls(
            line_id,
            data["customer_id"],
            data["currency"],
            data["meter"],
            str(data["period_start"]),
            price_version=data.get("price_version"),  # none before lines priced by quantity
            model=data.get("model"),
        )

    def _count(self, data: Mapping[str, Any], ids: list[str], amounts: list[Decimal]) -> None:
        """A Settled of a line priced by quantity: its records in order, and the line's
        quantity it records."""
        quantities = [Decimal(q) for q in data.get("quantities") or ()]
        if self.price_version is None:
            if quantities:
                self.problems.append("a per-unit line records quantities")
            return
        if len(quantities) != len(ids):
            self.problems.append(f"{len(ids)} transactions, {len(quantities)} quantities")
        with localcontext(prec=80):
            for txn_id, q, amount in zip(ids, quantities, amounts, strict=False):
                self.settled.append((txn_id, q, amount))
                self.quantity += q
        self.tier = data.get("tier")
        recorded = data.get("quantity")
        if isinstance(recorded, dict):  # as stored: a registered type's encoded text
            recorded = recorded["_data_"]
        if recorded is None or Decimal(recorded) != self.quantity:
            self.problems.append(f"records quantity {recorded}; its records make {self.quantity}")

    def apply(self, name: str, data: Mapping[str, Any], version: int) -> None:
        if name == "Frozen":  # its invoice closed: a new sequence, the same total
            self.sequence = version
            self.billed_at[version] = self.billed
            return
        if name == "CreditsApplied":
            self._credits_applied(data, version)
            return
        ids, amounts = data["transaction_ids"], [Decimal(a) for a in data["amounts"]]
        if name == "Repriced":
            self._repriced(ids, [Decimal(a) for a in data["old_amounts"]], amounts, version)
        else:
            self._settled_or_removed(name, data, ids, amounts, version)
        self.sequence = version
        self.billed = round_minor(self.exact_total)
        self.transactions = len(self.members)
        self._check_recorded(data, version)

    def _settled_or_removed(
        self,
        name: str,
        data: Mapping[str, Any],
        ids: list[str],
        amounts: list[Decimal],
        version: int,
    ) -> None:
        if len(ids) != len(amounts):
            self.problems.append(f"v{version}: {len(ids)} transactions, {len(amounts)} amounts")
        if name == "Settled":
            self._count(data, ids, amounts)
        elif self.price_version is not None:
            with localcontext(prec=80):
                self.removed += sum(amounts, Decimal(0))
        with localcontext(prec=80):
            for txn_id, amount in zip(ids, amounts, strict=False):
                if name == "Settled":
                    if txn_id in self.members:
                        self.problems.append(f"v{version}: {txn_id} settled twice")
                    self.members[txn_id] = (amount, version)
                    self.exact_total += amount
                else:
                    held = self.members.pop(txn_id, None)
                    if held is None or held[0] != amount:
                        holds = self._money(held[0]) if held else "nothing"
                        self.problems.append(
                            f"v{version}: removes {txn_id} ({self._money(amount)}), which the"
                            f" line holds as {holds}"
                        )
                    self.exact_total -= amount

    def _credits_applied(self, data: Mapping[str, Any], version: int) -> None:
        """A credit line's total is minus the credit, rounded once per usage line. Version
        2 records each usage line's credit and count; version 1 (``transaction_ids``)
        listed every record, each counted once on its usage line."""
        lines, amounts = data["line_ids"], data["amounts"]
        v1 = data.get("transaction_ids")
        counts = [1] * len(lines) if v1 is not None else data["counts"]
        if len({len(lines), len(amounts), len(counts), len(lines if v1 is None else v1)}) > 1:
            self.problems.append(f"v{version}: CreditsApplied lists of unequal lengths")
        with localcontext(prec=80):
            for line, text, count in zip(lines, amounts, counts, strict=False):
                amount = Decimal(text)
                self.credit_of_line[line] = self.credit_of_line.get(line, Decimal(0)) + amount
                self.credited_on_line[line] = self.credited_on_line.get(line, 0) + count
                self.transactions += count
                self.exact_total -= amount
        self.sequence = version
        self.billed = -sum(round_minor(c) for c in self.credit_of_line.values())
        self._check_recorded(data, version)

    def _check_recorded(self, data: Mapping[str, Any], version: int) -> None:
        self.billed_at[version] = self.billed
        recorded = (Decimal(data["exact_total"]), data["billed"], data["transactions"])
        if recorded != (self.exact_total, self.billed, self.transactions):
            self.problems.append(
                f"v{version}: records total {self._money(recorded[0])}, billed"
                f" {self._money(recorded[1])}, {recorded[2]} transactions; its amounts make"
                f" {self._money(self.exact_total)}, {self._money(self.billed)},"
                f" {self.transactions} transactions"
            )

    def _repriced(
        self, ids: list[str], old: list[Decimal], new: list[Decimal], version: int
    ) -> None:
        """Each transaction's amount moves from ``old`` (what the line holds) to ``new``."""
        if not len(ids) == len(old) == len(new):
            self.problems.append(
                f"v{version}: {len(ids)} transactions, {len(old)} old and {len(new)} new amounts"
            )
        with localcontext(prec=80):
            for txn_id, was, now in zip(ids, old, new, strict=False):
                held = self.members.get(txn_id)
                if held is None or held[0] != was:
                    holds = self._money(held[0]) if held else "nothing"
                    self.problems.append(
                        f"v{version}: reprices {txn_id} from {self._money(was)}, which the"
                        f" line holds as {holds}"
                    )
                if held is not None:
                    self.members[txn_id] = (now, held[1])
                self.exact_total += now - was

    def _money(self, amount: Decimal | int) -> str:
        return format_money(amount, self.currency)


@dataclass(slots=True)
class PushAudit:
    """What the pushes of one line say Stripe holds."""

    push_id: str
    line_id: str
    currency: str  # its line's
    pushed_sequence: int = 0
    pushed_billed: int = 0
    amounts: list[int] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    stripe_invoice_id: str | None = None
    charged_through: int = 0
    acknowledged: dict[int, int] = field(default_factory=dict)  # sequence: billed
    failing: bool = False  # the newest push failed (its transactions' delay is recorded)
    unknown: list[int] = field(default_factory=list)  # sequences a failed push may have set
    problems: list[str] = field(default_factory=list)

    def apply(self, name: str, data: Mapping[str, Any], version: int) -> None:
        if name == "Pushed":
            if data["sequence"] < self.pushed_sequence:
                self.problems.append(
                    f"v{version}: acknowledges sequence {data['sequence']} after"
                    f" {self.pushed_sequence}"
                )
            if sum(data["amounts"]) != data["billed"]:
                self.problems.append(
                    f"v{version}: items {_amounts(data['amounts'], self.currency)} are not"
                    f" {format_money(data['billed'], self.currency)}"
                )
            self.pushed_sequence, self.pushed_billed = data["sequence"], data["billed"]
            self.amounts, self.item_ids = list(data["amounts"]), list(data["item_ids"])
            self.stripe_invoice_id = data["stripe_invoice_id"]
            self.acknowledged[data["sequence"]] = data["billed"]
            self.failing, self.unknown = False, []
        elif name == "PushFailed":
            self.failing = True
            if data["retryable"]:  # no answer: Stripe may hold that sequence's total
                self.unknown.append(data["sequence"])
        elif name == "Redrafted":  # its invoice's draft was lost: nothing pushed to the new
            self.pushed_sequence, self.pushed_billed = 0, 0
            self.amounts, self.item_ids, self.stripe_invoice_id = [], [], None
            self.failing, self.unknown = False, []
        elif name == "ChargesRecorded":
            if not self.charged_through < data["through"] <= self.pushed_sequence:
                self.problems.append(
                    f"v{version}: charges through {data['through']}, pushed"
                    f" {self.pushed_sequence}, charged through {self.charged_through}"
                )
            self.charged_through = data["through"]


def credit_applied(lines: Mapping[str, LineAudit]) -> dict[str, tuple[Decimal, int]]:
    """Each usage line's credit as the invoices' credit lines record it, and how many
    records it credited."""
    applied: dict[str, tuple[Decimal, int]] = {}
    for line in lines.values():
        for usage_line, credit in line.credit_of_line.items():
            total, count = applied.get(usage_line, (Decimal(0), 0))
            with localcontext(prec=80):
                applied[usage_line] = (total + credit, count + line.credited_on_line[usage_line])
    return applied


def check_lines(
    lines: Mapping[str, LineAudit],
    pushes: Mapping[str, PushAudit],
    txns: Mapping[str, TxnAudit],
    credited: Collection[str] = frozenset(),
) -> list[Finding]:
    """Every line's own problems, and how lines, pushes and transactions agree;
    ``credited``: transactions reversed by a credit note after their invoice was
    finalized (they stay on their final line)."""
    findings = [Finding("line", line.line_id, p) for line in lines.values() for p in line.problems]
    findings += [
        Finding("line", push.line_id, p) for push in pushes.values() for p in push.problems
    ]
    push_of = {push.line_id: push for push in pushes.values()}
    for push in pushes.values():
        line = lines.get(push.line_id)
        if line is None:
            findings.append(Finding("line", push.line_id, "pushed, but no such line"))
            continue
        for sequence, billed in push.acknowledged.items():
            if line.billed_at.get(sequence) != billed:
                findings.append(
                    Finding(
                        "line",
                        line.line_id,
                        f"Stripe acknowledged {format_money(billed, line.currency)} at sequence"
                        f" {sequence}; the line billed"
                        f" {amount_text(line.billed_at.get(sequence), line.currency)} then",
                    )
                )
    where: dict[str, str] = {}
    for line in lines.values():
        for txn_id, (amount, version) in line.members.items():
            findings += _member(
                line,
                txn_id,
                (amount, version),
                txns.get(txn_id),
                where,
                credited=txn_id in credited,
            )
    for txn in txns.values():
        findings += _transaction(txn, lines, push_of)
    return findings


def _member(
    line: LineAudit,
    txn_id: str,
    held: tuple[Decimal, int],
    txn: TxnAudit | None,
    where: dict[str, str],
    *,
    credited: bool = False,
) -> list[Finding]:
    amount, version = held
    found = []
    if txn_id in where:
        found.append(Finding("line", txn_id, f"in lines {where[txn_id]} and {line.line_id}"))
    where[txn_id] = line.line_id
    if is_true_up(line.meter):  # a minimum's shortfall (``domain.audit_minimums``)
        return found
    if txn is None:
        return [*found, Finding("line", line.line_id, f"holds {txn_id}, no such transaction")]
    if (txn.line_id, txn.line_version) != (line.line_id, version):
        found.append(
            Finding(
                "line",
                txn_id,
                f"line {line.line_id} took it at v{version}; the transaction says"
                f" {txn.line_id} at v{txn.line_version}",
            )
        )
    if txn.amount != amount:
        found.append(
            Finding(
                "line",
                txn_id,
                f"in its line as {format_money(amount, line.currency)}, metered"
                f" {format_money(txn.amount, txn.currency)}",
            )
        )
    if txn.state is TxnState.COMPENSATED and not credited:
        found.append(Finding("line", txn_id, f"compensated, but still in line {line.line_id}"))
    return found


def _transaction(
    txn: TxnAudit, lines: Mapping[str, LineAudit], push_of: Mapping[str, PushAudit]
) -> list[Finding]:
    if txn.line_id is None:
        return []
    line = lines.get(txn.line_id)
    if line is None:
        return [Finding("line", txn.transaction_id, f"names line {txn.line_id}, no such line")]
    if txn.state is not TxnState.COMPENSATED and txn.transaction_id not in line.members:
        return [Finding("line", txn.transaction_id, f"not in its line {line.line_id}")]
    if txn.state is TxnState.CHARGED:
        push = push_of.get(txn.line_id)
        # Acknowledged at any time: a draft Stripe lost after (``Redrafted``) took back
        # nothing the transaction was charged for; its next push holds it again.
        pushed = max(push.pushed_sequence, *push.acknowledged) if push else 0
        if txn.line_sequence is None or txn.line_sequence > pushed:
            return [
                Finding(
                    "line",
                    txn.transaction_id,
                    f"charged at line sequence {txn.line_sequence}; Stripe acknowledged {pushed}",
                )
            ]
    return []


def check_line_items(
    items: Iterable[InvoiceItem],
    pushes: Mapping[str, PushAudit],
    lines: Mapping[str, LineAudit],
    *,
    foreign_items: bool = True,
) -> list[Finding]:
    """Stripe holds, for each line, exactly its newest acknowledged push (I3), or, while a
    push that got no answer is being retried, the total that push sent."""
    by_line: dict[str, list[InvoiceItem]] = {}
    for item in items:
        if item.line_id is not None:
            by_line.setdefault(item.line_id, []).append(item)
    push_of = {push.line_id: push for push in pushes.values()}
    findings: list[Finding] = []
    for line_id, live in sorted(by_line.items()):
        push = push_of.get(line_id)
        if push is None:
            if foreign_items:
                findings.append(
                    Finding("stripe", line_id, f"Stripe holds {_ids(live)} for no known line")
                )
            continue
        held = {i.id: i.amount for i in live}
        expected = dict(zip(push.item_ids, push.amounts, strict=True))
        line = lines.get(line_id)
        pending = {line.billed_at.get(s) for s in push.unknown} if line is not None else set()
        if held != expected and sum(held.values()) not in pending:
            findings.append(
                Finding(
                    "stripe",
                    line_id,
                    f"Stripe holds {_items(held, push.currency)}; the newest acknowledged push"
                    f" (sequence {push.pushed_sequence}) is {_items(expected, push.currency)}",
                )
            )
    for line_id, push in sorted(push_of.items()):
        if line_id not in by_line and any(push.amounts):
            findings.append(
                Finding(
                    "stripe",
                    line_id,
                    f"acknowledged {format_money(push.pushed_billed, push.currency)} in"
                    f" {', '.join(push.item_ids)}; Stripe holds nothing",
                )
            )
    return findings


def _ids(items: list[InvoiceItem]) -> str:
    return ", ".join(i.id for i in items)


def _amounts(amounts: list[int], currency: str) -> str:
    return " + ".join(format_money(a, currency) for a in amounts)


def _items(amounts: Mapping[str, int], currency: str) -> str:
    """Items and their amounts: ``ii_1 0.99 USD, ii_2 0.01 USD`` (``nothing``: none)."""
    listed = [f"{item} {format_money(a, currency)}" for item, a in amounts.items()]
    return ", ".join(listed) or "nothing"
