"""Corrections outside the push path: a transaction from before lines joins its line,
and an operator reverses a charge.

``adopt`` settles a transaction reserved before invoice lines existed into its line
(the reconciler finds them); ``reverse`` compensates a transaction and makes Stripe
follow, by lowering its line, an ``Adjusted`` on a closed invoice, a credit note
requested on a final one, or the deletion of a pre-line charge's own item. Both load,
decide and save in one go, and reload and look again when another writer saved first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.pusher import invoice_of, utcnow
from adapters.errors import PaymentFailed
from adapters.observability.logs import step_fields
from domain.closing import billed_shares
from domain.errors import IllegalTransition
from domain.invoice_states import InvoiceState
from domain.metering import LineBook
from domain.ports import PaymentGateway
from domain.saga import ChargeFailure, StepResult
from domain.transaction import BillingTransaction, TxnState
from store.ledger import BillingLedger

__all__ = ["Corrections"]

log = logging.getLogger(__name__)


class Corrections:
    """Adopts transactions from before lines and reverses charges, on the ledger and
    the Stripe client the pusher uses."""

    max_races = 20

    def __init__(
        self,
        ledger: BillingLedger,
        gateway: PaymentGateway,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.clock = clock

    def adopt(self, txn_id: UUID) -> StepResult:
        """Settle a transaction reserved before lines existed into its line."""
        for _ in range(self.max_races):
            txn = self.ledger.transaction(txn_id)
            if txn.line_id is not None or txn.state not in (
                TxnState.RESERVED,
                TxnState.CHARGE_FAILED,
            ):
                return StepResult.NOTHING
            book = LineBook(
                txn.customer_id, txn.currency, self.ledger.line_or_none,
                self.ledger.invoice_by_id, self.ledger.periods, self.clock(),
            )  # fmt: skip
            line = book.line_for(txn.meter, self.ledger.periods.period_of(txn.occurred_at))
            line.settle([(txn.id, txn.amount)])
            txn.settle(line.id, line.sequence)
            try:
                self.ledger.save(line, txn, *book.touched_invoices())
            except IntegrityError:
                continue
            return StepResult.SETTLED
        return StepResult.RACED

    def reverse(self, txn_id: UUID, reason: str) -> StepResult:
        """Operator reversal: the transaction is Compensated and its hold released, and
        Stripe follows: while its invoice is open or closing, its line's total drops
        (the next push sets the lower amount; ``Adjusted`` on a closed invoice); once the
        invoice is finalizing or final, a credit note of its billed share is requested
        on the invoice (``domain.closing.billed_shares``; issued by the closer, key
        ``credit:{transaction}``); a void invoice or a share of 0 needs nothing. A charge
        from before lines has its own invoice item deleted."""
        for _ in range(self.max_races):
            txn = self.ledger.transaction(txn_id)
            if txn.state is not TxnState.CHARGED and not (
                txn.state is TxnState.RESERVED and txn.line_id is not None
            ):
                raise IllegalTransition(f"transaction {txn_id} is {txn.state}, not charged")
            account = self.ledger.account(txn.customer_id, txn.currency)
            assert account is not None
            touched: list[Any] = [txn, account]
            if txn.line_id is None:  # a charge from before lines: its own item
                assert txn.stripe_object_id is not None
                self._delete_legacy_item(txn)
                reversal = f"deleted:{txn.stripe_object_id}"
            else:
                reversal, changed = self._reverse_on_line(txn.line_id, txn.id, reason)
                touched += changed
            charged = txn.state is TxnState.CHARGED
            txn.compensate(reason, stripe_reversal_id=reversal if charged else None)
            account.release(txn.id, txn.amount)
            try:
                self.ledger.save(*touched)
            except (IntegrityError, IllegalTransition):
                continue
            log.info(
                "charge reversed",
                extra=step_fields("reverse", "reversed", transaction_id=txn.id, reason=reason,
                                  reversal=reversal),
            )  # fmt: skip
            return StepResult.REVERSED
        return StepResult.RACED

    def _reverse_on_line(self, line_id: UUID, txn_id: UUID, reason: str) -> tuple[str, list[Any]]:
        """How a reversal reaches Stripe for a transaction on ``line_id``, and the
        aggregates that record it."""
        line = self.ledger.line_by_id(line_id)
        invoice = invoice_of(self.ledger, line)
        if invoice.state in (InvoiceState.OPEN, InvoiceState.CLOSED):
            line.remove([(txn_id, self.ledger.transaction(txn_id).amount)], reason)
            if invoice.state is InvoiceState.CLOSED:
                invoice.adjust(line.id, [txn_id], reason)
                return f"line:{line.id}@{line.sequence}", [line, invoice]
            return f"line:{line.id}@{line.sequence}", [line]
        if invoice.state in (InvoiceState.VOID, InvoiceState.NOTHING_DUE):
            return f"invoice {invoice.state}: nothing to credit", []
        share = billed_shares(self.ledger.line_changes(line.id, 0, line.sequence)).get(txn_id, 0)
        if share == 0:
            return "billed share 0: nothing to credit", []
        invoice.request_credit(txn_id, share, reason)
        return f"credit:{txn_id}", [invoice]

    def _delete_legacy_item(self, txn: BillingTransaction) -> None:
        assert txn.stripe_object_id is not None
        failed = self.gateway.delete_item(txn.stripe_object_id, f"reverse:{txn.id}")
        if isinstance(failed, ChargeFailure):
            raise PaymentFailed(f"reversal not done in Stripe: {failed.message}")
