"""The invoice's "Prepaid credits applied" line: the credit usage of a period consumed.

Credit that usage consumed (``CustomerAccount.reserve_and_burn``) must come off the
invoice that bills that usage, or the customer pays twice. ``CreditLine`` is an
``InvoiceLine`` of its own kind on that invoice (one per customer, currency and
period; its meter reads ``CREDIT_METER``, and its id is derived like a line's from
``CREDIT_KEY``, which no usage meter can be: a usage meter has no leading space): ingest records its
``CreditsApplied`` in the batch's save, beside the usage lines' ``Settled``. Its
``billed`` is **negative**: the credit, which the pushers set on its own Stripe
invoice item like any line's (keys from the line's id and sequence) and the closer
reads back with the other items before finalizing (the invoice's expected total is
the sum of its lines, this one included).

**Rounding, and never below zero.** The credit is kept exactly per usage line it was
consumed by, and rounded once per usage line, half up, like that line:
``billed = -sum(round(credit of line))``. A record consumes at most its own amount, so
a line's credit is at most the line's exact total, and rounding half up is monotone:
each line's rounded credit is at most that line's billed total. So the credit item is
at most the usage of its invoice and Stripe's total never goes below zero; credit a
rounding leaves over (less than half a minor unit per line) is not billed either way.

Usage removed from a line after it consumed credit (a compensation, a reversal) does
not give the credit back (not built yet): see the concept page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from domain.errors import IllegalTransition
from domain.invoice_line import InvoiceLine
from domain.money import add_exact, round_minor, sum_exact
from domain.periods import Period

__all__ = ["CREDIT_KEY", "CREDIT_METER", "CreditLine"]

CREDIT_METER = "Prepaid credits applied"
_NO_CREDIT: dict[str, Decimal] = {}
CREDIT_KEY = " prepaid credits"  # usage meters are stripped of whitespace: never this


class CreditLine(InvoiceLine):
    """The credit consumed by one invoice's usage (its ``billed`` is negative)."""

    class CreditsApplied(InvoiceLine.Event):
        """One per batch: the exact credit its records consumed, per usage line, and how
        many records that is. (Version 1 listed every record, its transaction beside
        its usage line and credit: read as version 2, summed per usage line.)"""

        class_version = 2

        line_ids: list[str]
        amounts: list[str]  # per usage line: exact minor units, canonical decimal text
        counts: list[int]  # per usage line: the records it credited
        exact_total: Decimal  # negative: the credit
        billed: int  # negative: -sum(round(credit per usage line))
        transactions: int

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            line_ids, amounts, counts = _per_line(
                zip(state["line_ids"], map(Decimal, state["amounts"]), strict=True)
            )
            del state["transaction_ids"]
            state.update(line_ids=line_ids, amounts=amounts, counts=counts)

    # Each usage line's exact credit: replaced by every CreditsApplied, never changed.
    per_line = _NO_CREDIT

    # A line's own: InvoiceLine's class defaults are annotated (a dataclass to the
    # library), which would otherwise give this subclass a generated __init__ of them.
    __init__ = InvoiceLine.__init__

    @classmethod
    def open_for(cls, customer_id: str, currency: str, period: Period) -> CreditLine:
        # The line's own Opened (eventsourcing gives a subclass its own copy of it).
        return cls._create(
            cls.Opened, id=None, customer_id=customer_id, currency=currency,
            meter=CREDIT_METER, period_start=period.start, period_end=period.end,
            late_of_start=None, price_version=None, model=None,
        )  # fmt: skip

    @staticmethod
    def id_for(customer_id: str, currency: str, period: Period) -> UUID:
        return InvoiceLine.create_id(customer_id, currency, CREDIT_KEY, period.start)

    def settle(self, entries: Sequence[tuple[UUID, Decimal]], *_: Any, **__: Any) -> None:
        raise IllegalTransition("a credit line holds credit, not usage: use apply")

    def apply(self, entries: Sequence[tuple[UUID, UUID, Decimal]]) -> None:
        """Add each (transaction, usage line, exact credit) in one event, summed per usage
        line; the credits in canonical form (``domain.money.canonical``, as
        ``reserve_and_burn`` gives them)."""
        grouped: dict[UUID, list[Decimal]] = {}
        for _, line, credit in entries:
            found = grouped.get(line)
            if found is None:
                grouped[line] = [credit]
            else:
                found.append(credit)
        self.apply_per_line({str(line): credits for line, credits in grouped.items()})

    def apply_per_line(self, credits: Mapping[str, Sequence[Decimal]]) -> None:
        """``apply``, with the credits already grouped per usage line (its id as text), in
        the order the lines first appear: one event, the same as ``apply``'s."""
        grouped = {line: [c for c in found if c > 0] for line, found in credits.items()}
        credited = {line: found for line, found in grouped.items() if found}
        if not credited:
            return
        if self.frozen:
            raise IllegalTransition(f"line {self.id} is frozen: its invoice has closed")
        line_ids = list(credited)
        amounts = [f"{sum_exact(found):f}" for found in credited.values()]
        counts = [len(found) for found in credited.values()]
        per_line = _added(self.per_line, line_ids, amounts)
        exact = sum_exact(per_line.values())
        billed = -sum(round_minor(c) for c in per_line.values())
        credit = exact.copy_negate()  # exact: ``-exact`` would round to 28 digits
        self._applied(line_ids, amounts, counts, credit, billed, self.transactions + sum(counts))

    @event(CreditsApplied)
    def _applied(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        line_ids: list[str],
        amounts: list[str],
        counts: list[int],
        exact_total: Decimal,
        billed: int,
        transactions: int,
    ) -> None:
        self.per_line = _added(self.per_line, line_ids, amounts)
        self.exact_total = exact_total
        self.billed = billed
        self.transactions = transactions

    @staticmethod
    def create_id(
        customer_id: str, currency: str, meter: str, period_start: datetime,
        late_of_start: datetime | None = None, **_: Any,
    ) -> UUID:  # fmt: skip
        """Whatever ``meter`` reads, the id is ``CREDIT_KEY``'s."""
        return InvoiceLine.create_id(customer_id, currency, CREDIT_KEY, period_start)


def _per_line(
    credits: Iterable[tuple[str, Decimal]],
) -> tuple[list[str], list[str], list[int]]:
    """``credits`` (usage line, exact credit) summed per usage line, in the order the lines
    first appear: the lines, their credits as canonical text, and how many each summed."""
    grouped: dict[str, list[Decimal]] = {}
    for line, credit in credits:
        found = grouped.get(line)
        if found is None:
            grouped[line] = [credit]
        else:
            found.append(credit)
    return (
        list(grouped),
        [f"{sum_exact(c):f}" for c in grouped.values()],
        [len(c) for c in grouped.values()],
    )


def _added(
    per_line: dict[str, Decimal], line_ids: Sequence[str], amounts: Sequence[str]
) -> dict[str, Decimal]:
    """``per_line`` with each usage line's credit (``amounts``, text) added, as a new dict."""
    added = dict(per_line)
    for line, amount in zip(line_ids, amounts, strict=True):
        added[line] = add_exact(per_line.get(line, Decimal(0)), Decimal(amount))
    return added
