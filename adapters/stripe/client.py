"""The one way billing-ledger talks to Stripe: the SDK behind bounded pressure.

``StripeGateway`` is the ``domain.ports.PaymentGateway``: a Stripe customer per
customer, one draft invoice per customer, currency and period (``auto_advance=false``:
it never finalizes by itself), and per invoice line one invoice item on that invoice
(more when the line's total is above Stripe's largest item amount) whose amount is
*set* to the line's billed total: created together, a draft's new lines in one
request (``invoices.add_lines``, under ``invoice-add:{invoice}:{digest}``; one by one,
``invoiceitems.create``, where the pusher falls back to that), then set together, the
changed lines of one draft in one request (``invoices.update_lines``, naming each line
by the line item id Stripe gave it, ``line_items``); at the period's close it finalizes
the invoice
(``invoice-finalize:{invoice id}``), and a reversal after that is a credit note
(``credit:{transaction id}``). Every create has an idempotency key derived from
the ledger's ids (``customer:{id}``, ``invoice:{invoice id}``, ``line-item:{line}:{n}``)
and always the same parameters; every update a key derived from the line, the item
and the sequence (``line-push:{line}:{n}:{sequence}``), and a draft's bulk update one
from the invoice and what it sets (``invoice-lines:{invoice}:{digest}``). Past Stripe's key window
(``key_window``, 23 h: Stripe keeps keys at least 24 h) the gateway looks an object up
by its metadata before creating it again.

A purchased credit grant (``domain.purchase``) has a one-off invoice of its own, made
the same way under the same kinds of keys, derived from the purchase's id:
``invoice:{purchase}``, ``line-item:{purchase}:0`` (one item, its price, never
updated), ``invoice-finalize:{purchase}``; its metadata names the purchase
(``purchase_id``), which is how the webhook handler tells it from a period's invoice.

Every call goes through the process's ``Pressure`` (breaker, AIMD in-flight limit,
rate limit; ``adapters.stripe.pressure``). The SDK's own retries are off
(``max_network_retries=0``): a failed push is recorded with a due time and pushed
again later, with the same keys. Failures reach the domain as ``ChargeFailure``
values (``adapters.stripe.errors``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from uuid import UUID

import stripe
from stripe.params import InvoiceItemListParams, InvoiceListParams

from adapters.observability import telemetry
from adapters.settings import StripeSettings
from adapters.stripe.errors import classify
from adapters.stripe.pressure import Pressure
from adapters.stripe.views import deleted_view, invoice_view
from domain.invoice_states import StripeInvoiceView
from domain.ports import (
    AddedItems,
    CreditNote,
    DraftInvoice,
    ItemRepair,
    LineItems,
    LinesAdd,
    LinesUpdate,
    PurchaseInvoice,
)
from domain.pushing import ItemStep, LineAdd, item_key, push_key
from domain.saga import ChargeFailure, idempotency_key, on_draft
from domain.verification import DraftItem, DraftView

__all__ = ["StripeGateway"]

T = TypeVar("T")


class StripeGateway:
    """Customers, draft invoices and line items in Stripe (see the module docstring)."""

    def __init__(self, settings: StripeSettings) -> None:
        self.settings = settings
        self.client = stripe.StripeClient(
            settings.api_key,
            base_addresses={"api": settings.api_base},
            max_network_retries=0,
            http_client=stripe.new_default_http_client(timeout=settings.timeout_s),
        )
        self.pressure = Pressure(settings)
        self.breaker = self.pressure.breaker

    # -- the port ------------------------------------------------------------------

    def customer(self, customer_id: str, *, look_first: bool) -> str | ChargeFailure:
        return _answer(lambda: self.create_customer(customer_id, look_first=look_first))

    def draft_invoice(self, draft: DraftInvoice, *, look_first: bool) -> str | ChargeFailure:
        return _answer(lambda: self.create_draft_invoice(draft, look_first=look_first))

    def set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        return _answer(lambda: self.push_line(items))

    def line_items(self, stripe_invoice_id: str) -> dict[str, str] | ChargeFailure:
        return _answer(lambda: self.invoice_line_items(stripe_invoice_id))

    def add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        return _answer(lambda: self.add_invoice_lines(add))

    def update_lines(self, update: LinesUpdate) -> ChargeFailure | None:
        failure = _answer(lambda: self.set_invoice_lines(update))
        return failure if isinstance(failure, ChargeFailure) else None

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool, draft: int = 1
    ) -> StripeInvoiceView | ChargeFailure:
        return _answer(
            lambda: self.finalize(stripe_invoice_id, invoice_id, look_first=look_first, draft=draft)
        )

    def credit_note(self, note: CreditNote) -> str | ChargeFailure:
        return _answer(lambda: self.create_credit_note(note))

    def read_draft(self, stripe_invoice_id: str) -> DraftView | ChargeFailure:
        return _answer(lambda: self.read_invoice(stripe_invoice_id))

    def repair_items(self, repairs: Sequence[ItemRepair]) -> ChargeFailure | None:
        failure = _answer(lambda: self.set_items(repairs))
        return failure if isinstance(failure, ChargeFailure) else None

    def pending_items(self, stripe_customer_id: str) -> dict[str, str] | ChargeFailure:
        return _answer(lambda: self.pending_invoice_items(stripe_customer_id))

    def delete_item(self, item_id: str, key: str) -> ChargeFailure | None:
        failure = _answer(lambda: self.delete_invoice_item(item_id, key))
        return failure if isinstance(failure, ChargeFailure) else None

    def breaker_state(self) -> str:
        return self.breaker.state

    # -- purchased credit (domain.ports.PurchaseGateway) ----------------------------

    def purchase_draft(self, purchase: PurchaseInvoice, *, look_first: bool) -> str | ChargeFailure:
        return _answer(lambda: self.create_purchase_draft(purchase, look_first=look_first))

    def purchase_item(
        self, purchase: PurchaseInvoice, stripe_invoice_id: str, *, look_first: bool
    ) -> str | ChargeFailure:
        return _answer(
            lambda: self.create_purchase_item(purchase, stripe_invoice_id, look_first=look_first)
        )

    def void_purchase_invoice(
        self, stripe_invoice_id: str, purchase_id: UUID
    ) -> StripeInvoiceView | ChargeFailure:
        return _answer(lambda: self.void_purchase(stripe_invoice_id, purchase_id))

    def void_purchase(self, stripe_invoice_id: str, purchase_id: UUID) -> StripeInvoiceView:
        """Read the purchase's invoice, then: a draft is deleted (Stripe voids only final
        invoices); an open or uncollectible one is voided (``invoice-void:{purchase}``);
        a paid or void one is answered as it is. One gone (deleted by an earlier attempt
        whose answer was lost) counts as deleted; a void refused because the invoice was
        paid meanwhile is answered with the paid invoice."""
        try:
            found = self.retrieve_invoice(stripe_invoice_id)
        except stripe.InvalidRequestError as exc:
            if exc.http_status != 404:
                raise
            return deleted_view("void")
        if found["status"] == "draft":
            self._call("invoices.delete", lambda: self.client.v1.invoices.delete(stripe_invoice_id))
            return deleted_view("void")
        if found["status"] not in ("open", "uncollectible"):
            return invoice_view(found, "void")
        return self._act_or_read(
            "invoices.void",
            lambda: self.client.v1.invoices.void_invoice(
                stripe_invoice_id,
                options={"idempotency_key": idempotency_key("invoice-void", purchase_id)},
            ),
            stripe_invoice_id,
            source="void",
            refused_when=("open", "uncollectible"),
        )

    def create_purchase_draft(self, purchase: PurchaseInvoice, *, look_first: bool) -> str:
        """The purchase's one-off draft invoice, created once (``invoice:{purchase}``)."""
        if look_first:
            found = self.find_invoice(purchase.purchase_id)
            if found is not None:
                return found
        return self._create_invoice(
            purchase.purchase_id, purchase.stripe_customer_id, purchase.currency,
            f"Prepaid credit {purchase.grant_id}",
            {"purchase_id": str(purchase.purchase_id), "customer_id": purchase.customer_id,
             "grant_id": purchase.grant_id},
        )  # fmt: skip

    def create_purchase_item(
        self, purchase: PurchaseInvoice, stripe_invoice_id: str, *, look_first: bool
    ) -> str:
        """Its one item, the price (``line-item:{purchase}:0``), created once."""
        if look_first:
            for item in self.invoice_items(invoice=stripe_invoice_id):
                if (item.get("metadata") or {}).get("purchase_id") == str(purchase.purchase_id):
                    return str(item["id"])
        created = self._call(
            "invoice_items.create",
            lambda: self.client.v1.invoice_items.create(
                params={
                    "customer": purchase.stripe_customer_id,
                    "invoice": stripe_invoice_id,
                    "currency": purchase.currency.lower(),
                    "amount": purchase.price,
                    "description": f"Prepaid credit {purchase.grant_id}",
                    "metadata": {
                        "purchase_id": str(purchase.purchase_id),
                        "grant_id": purchase.grant_id,
                        "credit": str(purchase.amount),
                    },
                },
                options={"idempotency_key": item_key(purchase.purchase_id, 0)},
            ),
        )
        return str(created.id)

    # -- the calls (they raise) ----------------------------------------------------

    def create_customer(self, customer_id: str, *, look_first: bool = False) -> str:
        """The Stripe customer of ``customer_id``, created with its own key."""
        if look_first:
            found = self.find_customer(customer_id)
            if found is not None:
                return found
        created = self._call(
            "customers.create",
            lambda: self.client.v1.customers.create(
                params={"name": customer_id, "metadata": {"customer_id": customer_id}},
                options={"idempotency_key": idempotency_key("customer", customer_id)},
            ),
        )
        return str(created.id)

    def find_customer(self, customer_id: str) -> str | None:
        """The Stripe customer of ``customer_id`` if there is one (never creates it)."""
        found = self._call(
            "customers.search",
            lambda: self.client.v1.customers.search(
                params={"query": f"metadata['customer_id']:'{customer_id}'", "limit": 1}
            ),
        )
        return str(found.data[0].id) if found.data else None

    def create_draft_invoice(self, draft: DraftInvoice, *, look_first: bool = False) -> str:
        """The draft invoice of ``draft``: created once, never advancing by itself."""
        if look_first:
            found = self.find_invoice(draft.invoice_id)
            if found is not None:
                return found
        span = telemetry.span("stripe draft_invoice", billing__customer_id=draft.customer_id)
        with span:
            again = {"draft": str(draft.draft)} if draft.draft > 1 else {}
            return self._create_invoice(
                draft.invoice_id, draft.stripe_customer_id, draft.currency,
                f"Usage {draft.period}",
                {"customer_id": draft.customer_id, "period": str(draft.period), **again},
                draft=draft.draft,
            )  # fmt: skip

    def _create_invoice(
        self,
        invoice_id: UUID,
        stripe_customer_id: str,
        currency: str,
        description: str,
        metadata: dict[str, str],
        *,
        draft: int = 1,
    ) -> str:
        """A draft invoice that never advances by itself and takes only the items given
        to it, under ``invoice:{invoice_id}`` (its ``draft``-th: ``domain.saga.on_draft``);
        its metadata names ``invoice_id``."""
        invoice = self._call(
            "invoices.create",
            lambda: self.client.v1.invoices.create(
                params={
                    "customer": stripe_customer_id,
                    "currency": currency.lower(),
                    "auto_advance": False,
                    "collection_method": "charge_automatically",
                    "pending_invoice_items_behavior": "exclude",
                    "description": description,
                    "metadata": {"invoice_id": str(invoice_id), **metadata},
                },
                options={
                    "idempotency_key": on_draft(idempotency_key("invoice", invoice_id), draft)
                },
            ),
        )
        return str(invoice.id)

    def find_invoice(self, invoice_id: UUID) -> str | None:
        found = self._call(
            "invoices.search",
            lambda: self.client.v1.invoices.search(
                params={"query": f"metadata['invoice_id']:'{invoice_id}'", "limit": 1}
            ),
        )
        return str(found.data[0].id) if found.data else None

    def finalize(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool = False, draft: int = 1
    ) -> StripeInvoiceView:
        """Finalize the draft with key ``invoice-finalize:{invoice_id}`` (of its ``draft``-th
        draft: ``domain.saga.on_draft``); an invoice that is no longer a draft (an earlier
        attempt finalized it, its answer lost) is read instead, so finalizing twice
        records it once."""
        if look_first:
            found = self.retrieve_invoice(stripe_invoice_id)
            if found["status"] != "draft":
                return invoice_view(found, "finalize")
        return self._act_or_read(
            "invoices.finalize",
            lambda: self.client.v1.invoices.finalize_invoice(
                stripe_invoice_id,
                params={"auto_advance": True},
                options={
                    "idempotency_key": on_draft(
                        idempotency_key("invoice-finalize", invoice_id), draft
                    )
                },
            ),
            stripe_invoice_id,
            source="finalize",
            refused_when=("draft",),
        )

    def _act_or_read(
        self,
        operation: str,
        act: Callable[[], stripe.Invoice],
        stripe_invoice_id: str,
        *,
        source: str,
        refused_when: tuple[str, ...],
    ) -> StripeInvoiceView:
        """``act`` on the invoice and Stripe's view of the answer; a 400 reads the
        invoice instead (an earlier attempt did it, its answer lost, or it moved on):
        still in one of ``refused_when``, the refusal stands."""
        try:
            done = self._call(operation, act)
        except stripe.InvalidRequestError as exc:
            if exc.http_status != 400:
                raise
            found = self.retrieve_invoice(stripe_invoice_id)
            if found["status"] in refused_when:
                raise
            return invoice_view(found, source)
        return invoice_view(done.to_dict(), source)

    def retrieve_invoice(self, stripe_invoice_id: str) -> dict[str, Any]:
        found = self._call(
            "invoices.retrieve", lambda: self.client.v1.invoices.retrieve(stripe_invoice_id)
        )
        return found.to_dict()

    def read_invoice(self, stripe_invoice_id: str) -> DraftView:
        """The invoice's status, total and items: one retrieve (Stripe embeds the first
        lines), and the item list paged through only when the lines have more."""
        span = telemetry.span("stripe read_invoice", stripe__invoice_id=stripe_invoice_id)
        with span:
            found = self.retrieve_invoice(stripe_invoice_id)
            lines = found.get("lines") or {}
            if lines.get("has_more"):
                items = [
                    DraftItem(str(i["id"]), int(i["amount"]))
                    for i in self.invoice_items(invoice=stripe_invoice_id)
                ]
            else:
                items = [
                    DraftItem(_line_item_id(line), int(line["amount"]))
                    for line in lines.get("data") or ()
                ]
            return DraftView(str(found["status"]), int(found["total"]), tuple(items))

    def set_items(self, repairs: Sequence[ItemRepair]) -> None:
        """Set each item to its repair's amount, each under its repair key."""
        for repair in repairs:
            self._call(
                "invoice_items.update",
                lambda r=repair: self.client.v1.invoice_items.update(  # type: ignore[misc]
                    r.item_id,
                    params={"amount": r.amount, "metadata": {"sequence": str(r.sequence)}},
                    options={"idempotency_key": r.key},
                ),
            )

    def invoice_line_items(self, stripe_invoice_id: str) -> dict[str, str]:
        """Invoice item id -> line item id of every line of the invoice (100 a page, each
        page one call through the pressure)."""
        return _traced(
            "stripe line_items",
            lambda: self._line_items(stripe_invoice_id),
            stripe__invoice_id=stripe_invoice_id,
        )

    def _line_items(self, stripe_invoice_id: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for line in self._lines_of(stripe_invoice_id):
            item = _line_item_id(line)
            if item != line["id"]:
                found[item] = str(line["id"])
        return found

    def _lines_of(self, stripe_invoice_id: str) -> Iterator[dict[str, Any]]:
        """The invoice's lines, as plain dicts: 100 a page, each page one call through
        the pressure, fetched as they are read."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100}
            if after is not None:
                params["starting_after"] = after
            page = self._call(
                "invoices.list_lines",
                lambda p=params: self.client.v1.invoices.line_items.list(  # type: ignore[misc]
                    stripe_invoice_id, params=p
                ),
            )
            lines = [line.to_dict() for line in page.data]
            yield from lines
            if not page.has_more or not lines:
                return
            after = str(lines[-1]["id"])

    def add_invoice_lines(self, add: LinesAdd) -> AddedItems:
        """One ``add_lines`` request creating the items of ``add`` (each with its line and
        chunk in its metadata); what it made, read from the answer's lines (paged
        through when they do not show every one). ``look_first``: items found on the
        invoice by their metadata are not made again."""
        made: AddedItems = {}
        adds = list(add.adds)
        if add.look_first:
            for item in self.invoice_items(invoice=add.stripe_invoice_id):
                meta = item.get("metadata") or {}
                with contextlib.suppress(KeyError, ValueError):
                    made[UUID(meta["line_id"]), int(meta["chunk"])] = (str(item["id"]), None)
            adds = [a for a in adds if any((a.line_id, c) not in made for c, _, _ in a.items)]
            adds = [_rest(a, made) for a in adds]
        if adds:
            rest = LinesAdd(
                add.invoice_id, add.stripe_invoice_id, add.stripe_customer_id, add.currency,
                tuple(adds), look_first=False, draft=add.draft,
            )  # fmt: skip
            made.update(_traced(
                "stripe add_lines", lambda: self._add_lines(rest),
                stripe__invoice_id=add.stripe_invoice_id, billing__lines=len(adds),
            ))  # fmt: skip
        wanted = [(a.line_id, c) for a in add.adds for c, _, _ in a.items]
        return {k: made[k] for k in wanted if k in made}

    def _add_lines(self, add: LinesAdd) -> AddedItems:
        lines = [
            {
                "amount": amount,
                "description": _describe(a.meter, a.period, chunk),
                "metadata": {
                    "line_id": str(a.line_id),
                    "chunk": str(chunk),
                    "sequence": str(sequence),
                },
            }
            for a in add.adds
            for chunk, sequence, amount in a.items
        ]
        answer = self._call(
            "invoices.add_lines",
            lambda: self.client.v1.invoices.add_lines(
                add.stripe_invoice_id,
                params={"lines": lines},  # type: ignore[typeddict-item]
                options={"idempotency_key": add.key},
            ),
        ).to_dict()
        wanted = {(a.line_id, c) for a in add.adds for c, _, _ in a.items}
        page = answer.get("lines") or {}
        made = _made_lines(page.get("data") or (), wanted)
        if len(made) < len(wanted) and page.get("has_more"):
            made = self._made_on(add.stripe_invoice_id, wanted)
        missing = wanted - set(made)
        if missing:  # Stripe said it made them: an answer without them is no answer
            raise RuntimeError(f"add_lines answered without {len(missing)} of its lines")
        return made

    def _made_on(self, stripe_invoice_id: str, wanted: set[tuple[UUID, int]]) -> AddedItems:
        """The invoice's lines paged through for the items of ``wanted`` (until found)."""
        made: AddedItems = {}
        for line in self._lines_of(stripe_invoice_id):
            made.update(_made_lines([line], wanted))
            if len(made) == len(wanted):
                break
        return made

    def set_invoice_lines(self, update: LinesUpdate) -> None:
        """One ``update_lines`` request: each line item's amount and its line's sequence."""
        lines = [
            {"id": s.line_item_id, "amount": s.amount, "metadata": {"sequence": str(s.sequence)}}
            for part in update.parts
            for s in part.sets
        ]
        _traced(
            "stripe update_lines",
            lambda: self._call(
                "invoices.update_lines",
                lambda: self.client.v1.invoices.update_lines(
                    update.stripe_invoice_id,
                    params={"lines": lines},  # type: ignore[typeddict-item]
                    options={"idempotency_key": update.key},
                ),
            ),
            stripe__invoice_id=update.stripe_invoice_id,
            billing__lines=len(update.parts),
        )

    def create_credit_note(self, note: CreditNote) -> str:
        """A credit note of ``note.amount`` on the invoice, once (key from the transaction)."""
        params: dict[str, Any] = {
            "invoice": note.stripe_invoice_id,
            "amount": note.amount,
            "memo": note.memo[:500],
            "metadata": {
                "invoice_id": str(note.invoice_id),
                "transaction_id": str(note.transaction_id),
            },
        }
        if note.after_payment:
            params["credit_amount"] = note.amount  # to the customer's balance
        created = self._call(
            "credit_notes.create",
            lambda: self.client.v1.credit_notes.create(
                params=params,  # type: ignore[arg-type]
                options={"idempotency_key": idempotency_key("credit", note.transaction_id)},
            ),
        )
        return str(created.id)

    def push_line(self, items: LineItems) -> list[str]:
        """Set the line's items to the plan's amounts; their ids in chunk order."""
        return _traced(
            "stripe push_line",
            lambda: [self._item(items, step) for step in items.plan.items],
            billing__line_id=str(items.line_id),
            billing__sequence=items.plan.sequence,
            billing__requests=items.plan.calls,
        )

    def _item(self, items: LineItems, step: ItemStep) -> str:
        item_id = step.item_id
        if item_id is None:
            item_id = self._create_item(items, step)
        if step.update:
            self._call(
                "invoice_items.update",
                lambda: self.client.v1.invoice_items.update(
                    item_id,
                    params={
                        "amount": step.amount,
                        "metadata": {"sequence": str(items.plan.sequence)},
                    },
                    options={
                        "idempotency_key": on_draft(
                            push_key(
                                items.line_id, step.chunk, items.plan.sequence, items.plan.repair
                            ),
                            items.draft,
                        )
                    },
                ),
            )
        return item_id

    def _create_item(self, items: LineItems, step: ItemStep) -> str:
        amount, sequence = step.create_amount, step.create_sequence
        assert amount is not None and sequence is not None
        if items.look_first:
            found = self.find_line_item(items.stripe_invoice_id, items.line_id, step.chunk)
            if found is not None:
                return found
        description = _describe(items.meter, str(items.period), step.chunk)
        created = self._call(
            "invoice_items.create",
            lambda: self.client.v1.invoice_items.create(
                params={
                    "customer": items.stripe_customer_id,
                    "invoice": items.stripe_invoice_id,
                    "currency": items.currency.lower(),
                    "amount": amount,
                    "description": description,
                    "metadata": {
                        "line_id": str(items.line_id),
                        "chunk": str(step.chunk),
                        "sequence": str(sequence),
                    },
                },
                options={
                    "idempotency_key": on_draft(item_key(items.line_id, step.chunk), items.draft)
                },
            ),
        )
        return str(created.id)

    def find_line_item(self, stripe_invoice_id: str, line_id: UUID, chunk: int) -> str | None:
        """The item of ``line_id``'s ``chunk`` on the invoice, if it exists."""
        for item in self.invoice_items(invoice=stripe_invoice_id):
            meta = item.get("metadata") or {}
            if meta.get("line_id") == str(line_id) and meta.get("chunk") == str(chunk):
                return str(item["id"])
        return None

    def invoice_items(
        self, customer: str | None = None, *, invoice: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every live invoice item (of one Stripe customer or invoice), as plain dicts."""
        params: InvoiceItemListParams = {"limit": 100}
        if customer is not None:
            params["customer"] = customer
        if invoice is not None:
            params["invoice"] = invoice
        page = self._call(
            "invoice_items.list", lambda: self.client.v1.invoice_items.list(params=params)
        )
        for item in page.auto_paging_iter():
            yield item.to_dict()

    def invoices(self, customer: str | None = None) -> Iterator[dict[str, Any]]:
        """Every invoice (of one Stripe customer), as plain dicts."""
        params: InvoiceListParams = {"limit": 100}
        if customer is not None:
            params["customer"] = customer
        page = self._call("invoices.list", lambda: self.client.v1.invoices.list(params=params))
        for invoice in page.auto_paging_iter():
            yield invoice.to_dict()

    def pending_invoice_items(self, stripe_customer_id: str) -> dict[str, str]:
        """The customer's pending invoice items: item id -> the line its metadata names
        ("" for none); the customer is retrieved first (a 404 if this account or mode
        does not know it)."""
        self._call(
            "customers.retrieve", lambda: self.client.v1.customers.retrieve(stripe_customer_id)
        )
        params: InvoiceItemListParams = {
            "limit": 100,
            "customer": stripe_customer_id,
            "pending": True,
        }
        page = self._call(
            "invoice_items.list", lambda: self.client.v1.invoice_items.list(params=params)
        )
        pending: dict[str, str] = {}
        for item in page.auto_paging_iter():
            found = item.to_dict()
            pending[str(found["id"])] = str((found.get("metadata") or {}).get("line_id", ""))
        return pending

    def delete_invoice_item(self, item_id: str, key: str) -> None:
        """Delete an invoice item (a charge from before lines: one item per transaction);
        an item already gone counts as deleted."""
        try:
            self._call(
                "invoice_items.delete",
                lambda: self.client.v1.invoice_items.delete(
                    item_id, options={"idempotency_key": key}
                ),
            )
        except stripe.InvalidRequestError as exc:
            if exc.http_status != 404:
                raise

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        return self.pressure.call(operation, fn)


def _line_item_id(line: dict[str, Any]) -> str:
    """The invoice item behind an invoice line (``parent`` in newer API versions)."""
    item = line.get("invoice_item")
    if not item:
        parent = line.get("parent") or {}
        item = (parent.get("invoice_item_details") or {}).get("invoice_item")
    return str(item or line.get("id"))


def _describe(meter: str, period: str, chunk: int) -> str:
    """An item's description: its meter and period (and its part, past the first)."""
    return f"{meter} {period}" + (f" (part {chunk + 1})" if chunk else "")


def _rest(add: LineAdd, made: AddedItems) -> LineAdd:
    """``add`` without the items found made already."""
    return LineAdd(
        add.line_id, add.meter, add.period,
        tuple(i for i in add.items if (add.line_id, i[0]) not in made),
    )  # fmt: skip


def _made_lines(lines: Iterable[dict[str, Any]], wanted: set[tuple[UUID, int]]) -> AddedItems:
    """The items of ``wanted`` among invoice lines (by their metadata): item and line ids."""
    made: AddedItems = {}
    for line in lines:
        meta = line.get("metadata") or {}
        try:
            key = (UUID(meta["line_id"]), int(meta["chunk"]))
        except (KeyError, ValueError):
            continue
        if key in wanted:
            made[key] = (_line_item_id(line), str(line["id"]))
    return made


def _answer(fn: Callable[[], T]) -> T | ChargeFailure:
    """``fn()``, or its failure as the domain's value (every failure is classified)."""
    try:
        return fn()
    except Exception as exc:
        return classify(exc)


def _traced(name: str, call: Callable[[], T], **attributes: Any) -> T:
    """``call()`` in a span named ``name``, its outcome recorded on it (``billing.outcome``
    ok or error, and on an error ``error.type``, the error's class)."""
    with telemetry.span(name, **attributes) as current:
        try:
            result = call()
        except Exception as exc:
            current.set_attributes(
                {"billing.outcome": "error", "error.type": _trace_error_type(exc)}
            )
            raise
        current.set_attribute("billing.outcome", "ok")
        return result


def _trace_error_type(exc: Exception) -> str:  # pragma: no mutate block
    """The ``error.type`` of a span that ended in ``exc`` (tracing only)."""
    return classify(exc).error_class
