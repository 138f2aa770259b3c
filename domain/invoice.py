"""The ``Invoice`` aggregate: one customer's invoice in one currency for one period,
from its first line to its payment.

Its life, as events (the transition table ``domain.invoice_states.ALLOWED_FROM`` is
data, checked by every method like the transaction's lifecycle)::

    Opened ──> Closed ──> FinalizeStarted ──> Finalized ──> Paid
      │  LineAdded   │  Adjusted    │  FinalizeFailed   │  PaymentFailed ──> Paid
      │  DraftCreated│              │                   │  MarkedUncollectible ──> Paid
      │              └──> NothingDue                    └──> Voided
      └ (ingest)                                 CreditRequested, Credited (once final)

* **Opened** by ingest with its first line; **LineAdded** names every later line. A
  new line of a period always records one of them on its invoice, in the same save,
  so closing (which records on the invoice) and a new line racing it are settled by
  the event store's version check: no line can join an invoice after it closed.
* **DraftCreated** when the pushers made its draft in Stripe (key from the id).
* **Closed** at the period's end plus the grace (or early, by an operator): every line
  is frozen in the same save (``InvoiceLine.Frozen``), so usage that arrives later goes
  to a late line of an open period (``domain.metering``). **Adjusted**: a line of a
  closed invoice lost a transaction (a reversal or compensation before finalizing).
* **FinalizeStarted** once every line's final total is in Stripe: from here a reversal
  is a credit note, not a lower total. **Finalized** records Stripe's number and total
  (from the finalize call or from the ``invoice.finalized`` webhook, whichever comes
  first); **FinalizeFailed** a failed attempt and when the next is due.
* **NothingDue**: closed with nothing billed and no draft in Stripe.
* **PaymentFailed**, **Paid**, **MarkedUncollectible**, **Voided** come from Stripe's
  webhooks, in any order: ``observe`` compares what Stripe says with the state and
  records only what moves the invoice forward, so a stale or repeated event changes
  nothing.
* **CreditRequested** (a reversal after finalizing: the transaction's billed share,
  ``domain.closing.billed_shares``) and **Credited** (the credit note Stripe issued).
* While finalizing, Stripe's draft is read back before the finalize call
  (``domain.verification``): **Verified** when every item and the total equal the
  ledger's; **DriftFound** when an item differs (both amounts, and the repair it
  starts, with the moment after which that repair can no longer land), **Repaired**
  when Stripe answered the repair. **DraftChecked**: while it is open, its draft was
  read back (drifted lines are set again by their own pushes). **MismatchFound**: the
  total Stripe finalized differs from the expected total (never silent: an alert until
  settled).
* **AttentionNeeded** stops the invoice with a reason an operator must settle (the
  draft holds what setting amounts cannot repair, Stripe refused a line of an
  invoice that is no longer a draft, a finalized total differs); **AttentionSettled**
  records who settled it and how (``billing-ledger invoices settle``).
* **DraftReplaced**: Stripe no longer has the draft (deleted by hand in the
  dashboard: Stripe answers 404) and an operator chose to bill the invoice on a new
  one (``billing-ledger invoices redraft``): the lost draft's id is forgotten, the
  draft's number goes up (so every key of the new draft's requests is its own,
  ``domain.saga.on_draft``), a finalizing invoice is closed again, and its lines'
  pushes start over in the same save (``LinePush.Redrafted``). It settles the
  attention that stopped the invoice.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import IllegalTransition
from domain.ids import invoice_id
from domain.invoice_states import ALLOWED_FROM, FINAL_STATES, InvoiceState, StripeInvoiceView
from domain.money import format_money
from domain.periods import Period

__all__ = ["Invoice", "mismatch_reason"]


def mismatch_reason(expected_total: int, stripe_total: int, currency: str) -> str:
    """Why an invoice Stripe finalized at another total than expected needs attention."""
    return (
        f"Stripe finalized {format_money(stripe_total, currency)} where the ledger expected"
        f" {format_money(expected_total, currency)}"
    )


S = InvoiceState


class Invoice(Aggregate):
    """A customer's invoice for one currency and period."""

    class Opened(Aggregate.Created):
        customer_id: str
        currency: str
        period_start: datetime
        period_end: datetime
        first_line: UUID

    class LineAdded(Aggregate.Event):
        line_id: UUID

    class DraftCreated(Aggregate.Event):
        stripe_invoice_id: str
        stripe_customer_id: str

    class Closed(Aggregate.Event):
        lines: list[str]
        reason: str  # "period ended" or an operator's reason

    class Adjusted(Aggregate.Event):
        line_id: UUID
        transaction_ids: list[str]
        reason: str

    class NothingDue(Aggregate.Event):
        pass

    class FinalizeStarted(Aggregate.Event):
        lines: list[str]
        sequences: list[int]
        expected_total: int

    class FinalizeFailed(Aggregate.Event):
        class_version = 2
        attempt: int
        error_class: str
        message: str
        next_attempt_at: datetime
        call: str  # "read back", "repair" or "finalize" (v1: not recorded)
        may_have_landed: bool  # Stripe may still execute the failed call

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            # Unknown before v2: taken as a finalize that may have landed, so the next
            # attempt reads the invoice first, as every retry did then.
            state["call"] = "finalize"
            state["may_have_landed"] = True

    class Finalized(Aggregate.Event):
        number: str
        total: int
        finalized_at: datetime
        source: str

    class PaymentFailed(Aggregate.Event):
        attempt: int
        next_payment_attempt: datetime | None
        source: str

    class Paid(Aggregate.Event):
        amount_paid: int
        paid_at: datetime
        source: str

    class MarkedUncollectible(Aggregate.Event):
        source: str

    class Voided(Aggregate.Event):
        source: str

    class CreditRequested(Aggregate.Event):
        transaction_id: UUID
        amount: int
        reason: str

    class Credited(Aggregate.Event):
        transaction_id: UUID | None  # None: a credit note made outside the ledger
        credit_note_id: str
        amount: int
        source: str

    class CreditFailed(Aggregate.Event):
        """A credit note Stripe did not issue: why, and when it is tried again."""

        transaction_id: UUID
        attempt: int
        error_class: str
        message: str
        next_attempt_at: datetime

    class Verified(Aggregate.Event):
        """Stripe's draft, read back, holds exactly what the ledger decided."""

        total: int
        items: int

    class DriftFound(Aggregate.Event):
        """Stripe's draft differs from the ledger: the items, both amounts, the repair."""

        repair: int
        drifts: list[list[str]]  # [line, chunk, sequence, item, expected, found]
        expected_total: int
        stripe_total: int
        lands_by: datetime  # the repair's requests can no longer land after this

    class Repaired(Aggregate.Event):
        repair: int

    class RepairNotSent(Aggregate.Event):
        """Our own breaker or limiter refused the repair before any request of it was
        sent: it does not count toward the repairs an invoice may have."""

        repair: int

    class DraftChecked(Aggregate.Event):
        """Its open draft was read back: equal to the ledger, or ``drifted`` lines handed
        to their pushers to be set again."""

        total: int
        items: int
        drifted: list[str]  # the lines whose items differed

    class AttentionNeeded(Aggregate.Event):
        reason: str

    class AttentionSettled(Aggregate.Event):
        how: str
        by: str

    class DraftReplaced(Aggregate.Event):
        """Stripe lost the draft ``lost`` (``why``: its answer); the invoice is billed on
        its ``draft``-th draft, made by the next push. Who decided it, and how."""

        lost: str
        why: str
        draft: int
        how: str
        by: str

    class MismatchFound(Aggregate.Event):
        """The total Stripe finalized is not the total the ledger expected."""

        expected_total: int
        stripe_total: int
        source: str

    @staticmethod
    def create_id(customer_id: str, currency: str, period_start: datetime, **_: Any) -> UUID:
        return invoice_id(customer_id, currency, Period(period_start, period_start).key)

    @classmethod
    def open(cls, customer_id: str, currency: str, period: Period, first_line: UUID) -> Invoice:
        """The invoice of ``period``, opened with its first line."""
        return cls(
            customer_id=customer_id,
            currency=currency,
            period_start=period.start,
            period_end=period.end,
            first_line=first_line,
        )

    @event(Opened)
    def __init__(
        self,
        customer_id: str,
        currency: str,
        period_start: datetime,
        period_end: datetime,
        first_line: UUID,
    ) -> None:
        self.customer_id = customer_id
        self.currency = currency
        self.period_start = period_start
        self.period_end = period_end
        self.state = InvoiceState.OPEN
        self.lines: list[UUID] = [first_line]
        self.stripe_invoice_id: str | None = None
        self.stripe_customer_id: str | None = None
        self.number: str | None = None
        self.total = 0
        self.expected_total = 0
        self.final_sequences: dict[str, int] = {}
        self.finalize_attempts = 0
        # A finalize call whose outcome is unknown was sent: it may have finalized the
        # draft, its answer lost, so the next one reads the invoice first. Only then: a
        # failed read, or a finalize Stripe refused (a 429), leaves nothing to look for.
        self.finalize_in_doubt = False
        self.next_attempt_at: datetime | None = None
        self.last_error: str | None = None
        self.payment_attempts = 0
        self.amount_paid = 0
        self.credits_requested: dict[str, int] = {}  # transaction id -> amount
        self.credit_reasons: dict[str, str] = {}
        self.credited: dict[str, str] = {}  # credit note id -> transaction id ("" if none)
        self.credited_amount = 0
        self.verified = False
        self.repairs = 0
        self.repairs_not_sent = 0
        self.repair_lands_by: datetime | None = None  # an unanswered repair may land until
        self.attention: str | None = None
        self.mismatch: tuple[int, int] | None = None  # (expected, Stripe's) once final
        self.credit_attempts = 0  # failed credit notes since the last one issued
        self.credit_due: datetime | None = None

    # -- reading ----------------------------------------------------------------------

    @property
    def period(self) -> Period:
        return Period(self.period_start, self.period_end)

    @property
    def is_closed(self) -> bool:
        """No usage joins it any more."""
        return self.state is not InvoiceState.OPEN

    @property
    def is_final(self) -> bool:
        """Final in Stripe: changes are credit notes."""
        return self.state in FINAL_STATES or self.state is InvoiceState.VOID

    draft = 1  # the number of its draft in Stripe (a class default: older snapshots)

    def credits_pending(self) -> list[tuple[UUID, int]]:
        """Credits requested and not yet issued (transaction, amount)."""
        issued = set(self.credited.values())
        return [(UUID(t), a) for t, a in self.credits_requested.items() if t not in issued]

    def _require(self, name: str, what: str) -> None:
        if self.state not in ALLOWED_FROM[name]:
            raise IllegalTransition(f"invoice {self.id} is {self.state}: cannot {what}")

    # -- lines and the draft ------------------------------------------------------------

    def add_line(self, line_id: UUID) -> None:
        if line_id in self.lines:
            return
        self._require("LineAdded", "add a line")
        self._line_added(line_id)

    @event(LineAdded)
    def _line_added(self, line_id: UUID) -> None:
        self.lines.append(line_id)

    def record_draft(self, stripe_invoice_id: str, stripe_customer_id: str) -> None:
        """The draft exists in Stripe (recorded once)."""
        if self.stripe_invoice_id is not None:
            return
        self._require("DraftCreated", "record its draft")
        self._draft_created(stripe_invoice_id, stripe_customer_id)

    @event(DraftCreated)
    def _draft_created(self, stripe_invoice_id: str, stripe_customer_id: str) -> None:
        self.stripe_invoice_id = stripe_invoice_id
        self.stripe_customer_id = stripe_customer_id

    def replace_draft(self, why: str, how: str, by: str) -> int:
        """Stripe no longer has the draft (``why``: its answer, a 404): bill the invoice
        on a new one. Only for an invoice stopped for an operator, not final, with a
        draft; the new draft's number (its lines' pushes start over with it)."""
        refused = self.draft_kept()
        if refused is not None:
            raise IllegalTransition(refused)
        assert self.stripe_invoice_id is not None
        if not why.strip() or not how.strip() or not by.strip():
            raise ValueError("replacing a draft needs Stripe's answer, how and who")
        self._draft_replaced(self.stripe_invoice_id, why, self.draft + 1, how, by)
        return self.draft

    def draft_deleted(self, stripe_invoice_id: str) -> bool:
        """Stripe says ``stripe_invoice_id`` was deleted (a webhook): when it is this
        invoice's draft and the invoice is not final, it stops for an operator at once,
        before a push or the close runs into the 404 (once: the same news again records
        nothing); whether anything was recorded. Any other draft (one already replaced)
        records nothing."""
        if (
            self.stripe_invoice_id != stripe_invoice_id
            or self.state not in ALLOWED_FROM["DraftReplaced"]
        ):
            return False
        before = len(self.pending_events)
        self.need_attention(
            f"Stripe says its draft {stripe_invoice_id} was deleted: bill it on a new draft"
            " (billing-ledger invoices redraft) or settle how it was billed"
        )
        return len(self.pending_events) > before

    def draft_kept(self) -> str | None:
        """Why its draft may not be replaced now, or None when it may (``replace_draft``)."""
        if self.state not in ALLOWED_FROM["DraftReplaced"]:
            return f"invoice {self.id} is {self.state}: cannot replace its draft"
        if self.stripe_invoice_id is None:
            return f"invoice {self.id} has no draft in Stripe yet: its next push makes one"
        if self.attention is None:
            return (
                f"invoice {self.id} needs no attention: nothing says its draft"
                f" {self.stripe_invoice_id} is gone"
            )
        return None

    @event(DraftReplaced)
    def _draft_replaced(self, lost: str, why: str, draft: int, how: str, by: str) -> None:
        self.draft = draft
        self.stripe_invoice_id = None
        self.state = InvoiceState.CLOSED if self.state is S.FINALIZING else self.state
        self.attention = None
        self.verified = False
        self.final_sequences = {}
        self.finalize_attempts = 0
        self.finalize_in_doubt = False
        self.next_attempt_at = None
        self.last_error = None
        self.repairs = 0
        self.repairs_not_sent = 0
        self.repair_lands_by = None

    # -- closing and finalizing ---------------------------------------------------------

    def close(self, reason: str) -> None:
        """No usage joins it any more (its lines are frozen in the same save)."""
        self._require("Closed", "close")
        self._closed([str(line) for line in self.lines], reason)

    @event(Closed)
    def _closed(self, lines: list[str], reason: str) -> None:
        self.state = InvoiceState.CLOSED

    def adjust(self, line_id: UUID, transaction_ids: Sequence[UUID], reason: str) -> None:
        """A line of this closed invoice lost transactions before finalizing."""
        self._require("Adjusted", "adjust a line")
        self._adjusted(line_id, [str(t) for t in transaction_ids], reason)

    @event(Adjusted)
    def _adjusted(self, line_id: UUID, transaction_ids: list[str], reason: str) -> None:
        pass

    def nothing_due(self) -> None:
        self._require("NothingDue", "close with nothing due")
        self._nothing_due()

    @event(NothingDue)
    def _nothing_due(self) -> None:
        self.state = InvoiceState.NOTHING_DUE

    def start_finalizing(self, final: Sequence[tuple[UUID, int, int]]) -> None:
        """Every line's final total is in Stripe: (line, sequence, billed) for each."""
        self._require("FinalizeStarted", "start finalizing")
        if {line for line, _, _ in final} != set(self.lines):
            raise ValueError(f"invoice {self.id}: finalizing needs every line's final total")
        self._finalize_started(
            [str(line) for line, _, _ in final],
            [sequence for _, sequence, _ in final],
            sum(billed for _, _, billed in final),
        )

    @event(FinalizeStarted)
    def _finalize_started(
        self, lines: list[str], sequences: list[int], expected_total: int
    ) -> None:
        self.state = InvoiceState.FINALIZING
        self.final_sequences = dict(zip(lines, sequences, strict=True))
        self.expected_total = expected_total

    def record_finalize_failure(
        self,
        error_class: str,
        message: str,
        next_attempt_at: datetime,
        *,
        call: str,
        may_have_landed: bool,
    ) -> None:
        """A failed call while finalizing (``call``: "read back", "repair", "finalize"),
        and when the next attempt is due. ``may_have_landed``: Stripe may still execute
        it (a timeout, a dropped connection); a finalize that may have landed makes every
        later finalize read the invoice first (``finalize_in_doubt``)."""
        self._require("FinalizeFailed", "record a failed finalize")
        self._finalize_failed(
            self.finalize_attempts + 1, error_class, message, next_attempt_at, call=call,
            may_have_landed=may_have_landed,
        )  # fmt: skip

    @event(FinalizeFailed)
    def _finalize_failed(
        self,
        attempt: int,
        error_class: str,
        message: str,
        next_attempt_at: datetime,
        *,
        call: str,
        may_have_landed: bool,
    ) -> None:
        self.finalize_attempts = attempt
        self.last_error = f"{error_class}: {message}"
        self.next_attempt_at = next_attempt_at
        if call == "finalize" and may_have_landed:
            self.finalize_in_doubt = True

    @event(Finalized)
    def _finalized(self, number: str, total: int, finalized_at: datetime, source: str) -> None:
        self.state = InvoiceState.FINALIZED
        self.number = number
        self.total = total
        self.next_attempt_at = None

    # -- what Stripe says -----------------------------------------------------------------

    def observe(self, view: StripeInvoiceView) -> bool:
        """Record what ``view`` shows that this invoice has not recorded yet, in order;
        whether anything was recorded. A draft, a stale or a repeated view records
        nothing; so does a view of an invoice this ledger is not finalizing (one
        finalized outside it is left for an operator: it never takes usage back)."""
        before = len(self.pending_events)
        if view.status == "draft" or self.state in (
            S.OPEN,
            S.CLOSED,
            S.NOTHING_DUE,
            S.VOID,
            S.PAID,
        ):
            return False
        if self.state is S.FINALIZING:
            self._finalized(view.number or "", view.total, view.at, view.source)
            if view.total != self.expected_total:
                self._mismatch_found(self.expected_total, view.total, view.source)
        if view.status == "open" and self.state in ALLOWED_FROM["PaymentFailed"]:
            if view.attempt_count > self.payment_attempts:
                self._payment_failed(view.attempt_count, view.next_payment_attempt, view.source)
        elif view.status == "paid" and self.state in ALLOWED_FROM["Paid"]:
            self._paid(view.amount_paid, view.at, view.source)
        elif view.status == "uncollectible" and self.state in ALLOWED_FROM["MarkedUncollectible"]:
            self._uncollectible(view.source)
        elif view.status == "void" and self.state in ALLOWED_FROM["Voided"]:
            self._voided(view.source)
        return len(self.pending_events) > before

    @event(MismatchFound)
    def _mismatch_found(self, expected_total: int, stripe_total: int, source: str) -> None:
        self.mismatch = (expected_total, stripe_total)
        self.attention = mismatch_reason(expected_total, stripe_total, self.currency)

    # -- reading back the draft ---------------------------------------------------------

    def in_doubt_until(self, now: datetime) -> datetime | None:
        """When the newest repair can no longer land, if it may still and is after now."""
        if self.repair_lands_by is not None and self.repair_lands_by > now:
            return self.repair_lands_by
        return None

    def record_verified(self, total: int, items: int) -> None:
        """The draft read back equals the ledger: the finalize call may go."""
        self._require("Verified", "record a verified draft")
        if total != self.expected_total:
            raise ValueError(
                f"invoice {self.id}: verified {format_money(total, self.currency)}, expected"
                f" {format_money(self.expected_total, self.currency)}"
            )
        self._verified(total, items)

    @event(Verified)
    def _verified(self, total: int, items: int) -> None:
        self.verified = True

    def record_drift(
        self, drifts: Sequence[Sequence[str]], stripe_total: int, lands_by: datetime
    ) -> int:
        """The draft differs (rows: line, chunk, sequence, item, expected, found); the
        repair this starts, recorded before its requests are sent."""
        self._require("DriftFound", "record drift")
        if not drifts:
            raise ValueError("drift needs at least one item that differs")
        repair = self.repairs + 1
        self._drift_found(
            repair, [list(d) for d in drifts], self.expected_total, stripe_total, lands_by
        )
        return repair

    @event(DriftFound)
    def _drift_found(
        self,
        repair: int,
        drifts: list[list[str]],
        expected_total: int,
        stripe_total: int,
        lands_by: datetime,
    ) -> None:
        self.repairs = repair
        self.repair_lands_by = lands_by
        self.verified = False

    def record_repaired(self, repair: int) -> None:
        """Stripe answered repair ``repair``: it cannot land later."""
        self._require("Repaired", "record a repair")
        if repair == self.repairs and self.repair_lands_by is not None:
            self._repaired(repair)

    @event(Repaired)
    def _repaired(self, repair: int) -> None:
        self.repair_lands_by = None

    def record_repair_not_sent(self, repair: int) -> None:
        """Repair ``repair`` was refused before any of its requests left: nothing of it
        can land, and it is no repair (``repairs_sent``)."""
        self._require("RepairNotSent", "record a repair not sent")
        if repair == self.repairs and self.repair_lands_by is not None:
            self._repair_not_sent(repair)

    @event(RepairNotSent)
    def _repair_not_sent(self, repair: int) -> None:
        self.repair_lands_by = None
        self.repairs_not_sent += 1

    @property
    def repairs_sent(self) -> int:
        """The repairs whose requests reached Stripe (the drift found, less those our
        own breaker or limiter refused unsent)."""
        return self.repairs - self.repairs_not_sent

    def record_checked(self, total: int, items: int, drifted: Sequence[UUID]) -> None:
        """Its draft was read back while usage still joins it (``DraftChecked``)."""
        self._require("DraftChecked", "record a checked draft")
        self._draft_checked(total, items, [str(line) for line in drifted])

    @event(DraftChecked)
    def _draft_checked(self, total: int, items: int, drifted: list[str]) -> None:
        pass

    def need_attention(self, reason: str) -> None:
        """Stop here until an operator settles ``reason`` (recorded once per reason)."""
        if not reason.strip():
            raise ValueError("attention needs a reason")
        if self.attention != reason:
            self._attention_needed(reason)

    @event(AttentionNeeded)
    def _attention_needed(self, reason: str) -> None:
        self.attention = reason
        self.verified = False
        self.raised = (*self.raised, reason)

    raised: tuple[str, ...] = ()  # every attention reason recorded, settled or not

    def settle_attention(self, how: str, by: str) -> None:
        """An operator settled what stopped the invoice (the draft is read back again)."""
        if self.attention is None:
            raise IllegalTransition(f"invoice {self.id} needs no attention")
        if not how.strip() or not by.strip():
            raise ValueError("settling needs how and who")
        self._attention_settled(how, by)

    @event(AttentionSettled)
    def _attention_settled(self, how: str, by: str) -> None:
        self.attention = None

    @event(PaymentFailed)
    def _payment_failed(
        self, attempt: int, next_payment_attempt: datetime | None, source: str
    ) -> None:
        self.state = InvoiceState.PAYMENT_FAILED
        self.payment_attempts = attempt

    @event(Paid)
    def _paid(self, amount_paid: int, paid_at: datetime, source: str) -> None:
        self.state = InvoiceState.PAID
        self.amount_paid = amount_paid

    @event(MarkedUncollectible)
    def _uncollectible(self, source: str) -> None:
        self.state = InvoiceState.UNCOLLECTIBLE

    @event(Voided)
    def _voided(self, source: str) -> None:
        self.state = InvoiceState.VOID

    # -- credits ----------------------------------------------------------------------

    def request_credit(self, transaction_id: UUID, amount: int, reason: str) -> None:
        """A reversal after finalizing: credit ``amount`` (the transaction's billed share)."""
        self._require("CreditRequested", "request a credit")
        if str(transaction_id) in self.credits_requested:
            raise IllegalTransition(f"invoice {self.id}: {transaction_id} is credited already")
        if amount < 0:
            raise ValueError(f"a credit cannot be negative: {amount}")
        if self.credit_total_requested + amount > self.expected_total:
            raise ValueError(
                f"invoice {self.id}: credits of"
                f" {format_money(self.credit_total_requested + amount, self.currency)} would"
                f" exceed its total of {format_money(self.expected_total, self.currency)}"
            )
        self._credit_requested(transaction_id, amount, reason)

    def creditable(self, amount: int) -> int:
        """What of ``amount`` Stripe's invoice can still be credited: its finalized total
        less every credit note recorded on it (ours and those made in the dashboard)."""
        return max(0, min(amount, self.total - self.credited_amount))

    def record_credit_failure(
        self, transaction_id: UUID, error_class: str, message: str, next_attempt_at: datetime
    ) -> None:
        """A credit note failed; it is tried again from ``next_attempt_at``."""
        self._require("Credited", "record a failed credit note")
        self._credit_failed(
            transaction_id, self.credit_attempts + 1, error_class, message, next_attempt_at
        )

    @event(CreditFailed)
    def _credit_failed(
        self,
        transaction_id: UUID,
        attempt: int,
        error_class: str,
        message: str,
        next_attempt_at: datetime,
    ) -> None:
        self.credit_attempts = attempt
        self.credit_due = next_attempt_at
        self.last_error = f"{error_class}: {message}"

    @property
    def credit_total_requested(self) -> int:
        return sum(self.credits_requested.values())

    @event(CreditRequested)
    def _credit_requested(self, transaction_id: UUID, amount: int, reason: str) -> None:
        self.credits_requested[str(transaction_id)] = amount
        self.credit_reasons[str(transaction_id)] = reason

    def record_credit(
        self, transaction_id: UUID | None, credit_note_id: str, amount: int, source: str
    ) -> bool:
        """Stripe issued ``credit_note_id``; whether it was new to this invoice."""
        if credit_note_id in self.credited:
            return False
        self._require("Credited", "record a credit note")
        self._credited(transaction_id, credit_note_id, amount, source)
        return True

    @event(Credited)
    def _credited(
        self, transaction_id: UUID | None, credit_note_id: str, amount: int, source: str
    ) -> None:
        self.credited[credit_note_id] = str(transaction_id) if transaction_id else ""
        self.credited_amount += amount
        if transaction_id is not None:
            self.credit_attempts = 0
            self.credit_due = None
