"""The ports: what the domain's processes need from the outside, in the domain's terms.

Each outside thing is a small Protocol with one real adapter and one hand-written fake:

* ``PaymentGateway``: Stripe (``adapters.stripe.client.StripeGateway``): customers, a
  draft invoice per customer, currency and period, the items of invoice lines (created
  created together, a draft's new lines in one request: ``add_lines``, then set
  together, a draft's lines in one request: ``update_lines``),
  finalizing an invoice and issuing credit notes; failures come back as
  ``domain.saga.ChargeFailure`` values, never as the SDK's exceptions;
* ``PurchaseGateway``: the same Stripe client, as the purchaser of prepaid credit needs
  it (``domain.purchase``): a one-off invoice of one item per purchased grant;
* ``DeadLetterSink``: where unbillable usage records are kept with their reason
  (``store.dead_letters.DeadLetterStore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from domain.invoice_states import StripeInvoiceView
from domain.periods import Period
from domain.pushing import LineAdd, LinePart, PushPlan, add_key, lines_key
from domain.saga import ChargeFailure, on_draft
from domain.verification import DraftView

__all__ = [
    "AddedItems",
    "CreditNote",
    "DeadLetter",
    "DeadLetterSink",
    "DraftInvoice",
    "ItemRepair",
    "LineItems",
    "LinesAdd",
    "LinesUpdate",
    "PaymentGateway",
    "PurchaseGateway",
    "PurchaseInvoice",
]


@dataclass(frozen=True)
class DeadLetter:
    """A usage record (or a ``billing.events`` message) that could not be handled: where
    it came from, its bytes, and why.

    ``code`` is the reason's short code (the log line's ``error_code``; dead letters are
    counted by it). Read back from the store, ``payload`` may be only a prefix of what
    arrived: ``payload_size`` and ``payload_sha256`` (hex) describe the whole.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes | None
    reason: str
    received_at: datetime | None = None
    code: str = "invalid"
    payload_size: int | None = None
    payload_sha256: str | None = None


class DeadLetterSink(Protocol):
    """Keeps dead letters (idempotent by source position)."""

    def record(self, letters: Sequence[DeadLetter]) -> int:
        """Store the letters not stored before; returns how many were new."""
        ...


@dataclass(frozen=True)
class DraftInvoice:
    """The draft invoice a line's items go on: one per customer, currency and period."""

    invoice_id: UUID  # the ledger's id (``domain.ids.invoice_id``), the key's origin
    customer_id: str
    stripe_customer_id: str
    currency: str
    period: Period
    draft: int = 1  # the invoice's draft number (``domain.saga.on_draft``)


@dataclass(frozen=True)
class LineItems:
    """One push of a line: its items set to ``plan``'s amounts on ``stripe_invoice_id``."""

    line_id: UUID
    meter: str
    period: Period
    stripe_customer_id: str
    stripe_invoice_id: str
    currency: str
    plan: PushPlan
    look_first: bool  # creation keys may have expired: look for planned items first
    draft: int = 1  # its invoice's draft number: the keys' (``domain.saga.on_draft``)


@dataclass(frozen=True)
class LinesUpdate:
    """One ``update_lines`` request: line items of one draft invoice set to their lines'
    amounts (``domain.pushing.batches``: at most ``MAX_LINES_PER_UPDATE``)."""

    invoice_id: UUID  # the ledger's invoice: the key's origin
    stripe_invoice_id: str
    parts: tuple[LinePart, ...]
    draft: int = 1  # the invoice's draft number (``domain.saga.on_draft``)

    @property
    def key(self) -> str:
        return on_draft(lines_key(self.invoice_id, self.parts), self.draft)


@dataclass(frozen=True)
class LinesAdd:
    """One ``add_lines`` request: new lines' items created on one draft invoice, each at
    its planned parameters (``domain.pushing.LineAdd``: at most ``MAX_ITEMS_PER_ADD``)."""

    invoice_id: UUID  # the ledger's invoice: the key's origin
    stripe_invoice_id: str
    stripe_customer_id: str
    currency: str
    adds: tuple[LineAdd, ...]
    look_first: bool  # the key may have expired: look for items made already first
    draft: int = 1  # the invoice's draft number (``domain.saga.on_draft``)

    @property
    def key(self) -> str:
        return on_draft(add_key(self.invoice_id, self.adds), self.draft)


AddedItems = dict[tuple[UUID, int], tuple[str, str | None]]
"""What an ``add_lines`` made: (line, chunk) -> (item id, its line item id if known)."""


@dataclass(frozen=True)
class CreditNote:
    """A credit note for one reversed transaction of a final invoice."""

    invoice_id: UUID  # the ledger's invoice
    stripe_invoice_id: str
    transaction_id: UUID  # the key's origin: ``credit:{transaction_id}``
    amount: int  # minor units, above 0: the transaction's billed share
    after_payment: bool  # the invoice is paid: credit the customer's balance
    memo: str


@dataclass(frozen=True)
class ItemRepair:
    """Set one invoice item back to the ledger's amount, under a repair's own key."""

    item_id: str
    amount: int
    sequence: int
    key: str  # ``domain.verification.repair_key``


class PaymentGateway(Protocol):
    """Stripe, as the pushers need it. Every call either answers or returns the
    failure (retryable or not); none raises. Each create has an idempotency key
    derived from the ids, so a repeated call returns the first call's object."""

    def customer(self, customer_id: str, *, look_first: bool) -> str | ChargeFailure:
        """The Stripe customer of ``customer_id``, created on first need."""
        ...

    def draft_invoice(self, draft: DraftInvoice, *, look_first: bool) -> str | ChargeFailure:
        """The Stripe id of ``draft``, created (a draft that never advances) on first need."""
        ...

    def set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        """Create or update the line's items to the plan's amounts; their ids, in order."""
        ...

    def line_items(self, stripe_invoice_id: str) -> dict[str, str] | ChargeFailure:
        """The line items of the draft's items, as Stripe names them: invoice item id ->
        line item id (``il_...``), every line (paged)."""
        ...

    def add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        """Create the items of ``add`` on its draft in one request under its key, or under
        the key of the part not found when ``look_first`` finds some made already (none
        left: no request). Stripe refuses it whole (nothing made) for an invoice that is
        not a draft; every item of ``add`` is in the answer."""
        ...

    def update_lines(self, update: LinesUpdate) -> ChargeFailure | None:
        """Set the line items of ``update`` on its draft, in one request under its key
        (``update.key``). Stripe refuses it whole (nothing set) for an invoice that is
        not a draft, a line item not on it, or too many line items."""
        ...

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool, draft: int = 1
    ) -> StripeInvoiceView | ChargeFailure:
        """Finalize the draft (key from ``invoice_id`` and the ``draft`` number); Stripe's
        view of the invoice. ``look_first``: an earlier attempt may have finalized it
        (read it first)."""
        ...

    def read_draft(self, stripe_invoice_id: str) -> DraftView | ChargeFailure:
        """The invoice as Stripe holds it: status, total and every item (paged)."""
        ...

    def repair_items(self, repairs: Sequence[ItemRepair]) -> ChargeFailure | None:
        """Set each item to its repair's amount (in order; the first failure stops)."""
        ...

    def credit_note(self, note: CreditNote) -> str | ChargeFailure:
        """Issue the credit note (once: the key is the transaction's); its Stripe id."""
        ...

    def pending_items(self, stripe_customer_id: str) -> dict[str, str] | ChargeFailure:
        """The customer's invoice items on no invoice (pending): item id -> the ledger line
        its metadata names ("" for none). The customer is read first, so an account or
        mode that does not know it answers a failure, never an empty list."""
        ...

    def delete_item(self, item_id: str, key: str) -> ChargeFailure | None:
        """Delete one invoice item (a charge from before lines had its own); gone counts."""
        ...

    def breaker_state(self) -> str:
        """closed, half_open or open."""
        ...


@dataclass(frozen=True)
class PurchaseInvoice:
    """The one-off invoice of a purchased grant: one item, its price."""

    purchase_id: UUID  # the ledger's id (``domain.ids.purchase_id``), the keys' origin
    customer_id: str
    stripe_customer_id: str
    currency: str
    grant_id: str
    amount: int  # the credit bought (for the description)
    price: int  # the item's amount, minor units


class PurchaseGateway(Protocol):
    """Stripe, as the purchaser needs it. Like ``PaymentGateway``: never raises, each
    request under a key derived from the purchase's id and the step."""

    def customer(self, customer_id: str, *, look_first: bool) -> str | ChargeFailure:
        """The Stripe customer of ``customer_id`` (key ``customer:{id}``)."""
        ...

    def purchase_draft(self, purchase: PurchaseInvoice, *, look_first: bool) -> str | ChargeFailure:
        """The draft invoice of the purchase (key ``invoice:{purchase}``); its Stripe id."""
        ...

    def purchase_item(
        self, purchase: PurchaseInvoice, stripe_invoice_id: str, *, look_first: bool
    ) -> str | ChargeFailure:
        """Its one item, the price (key ``line-item:{purchase}:0``); the item's id."""
        ...

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool
    ) -> StripeInvoiceView | ChargeFailure:
        """Finalize it (key ``invoice-finalize:{purchase}``); Stripe's view of it."""
        ...

    def void_purchase_invoice(
        self, stripe_invoice_id: str, purchase_id: UUID
    ) -> StripeInvoiceView | ChargeFailure:
        """Void it (key ``invoice-void:{purchase}``) when it is open or uncollectible,
        delete it when it is a draft (a view of status ``deleted``); Stripe's view of it
        (paid or void already: as it is)."""
        ...
