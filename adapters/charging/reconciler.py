"""The reconciler: every line with a change Stripe has not acknowledged is scheduled,
and every transaction reserved before lines existed joins its line.

Every ``reconcile_interval_s`` it reads the lines with unsent changes, failed pushes
or charges not yet recorded (``projections.invoice_lines.open_lines``, which also sees
what the projector has not reached) and hands them to the scheduler with the time of
their oldest unsent change and their next attempt; it settles open transactions that
have no line yet (histories from before lines); and it records the expiry of every
prepaid credit grant past its expiry with something left (``projections.credits
.due_expiries``), which the next ingest save of that customer would record otherwise
(an expired grant is never consumed either way: ``domain.credits``). Forward progress
never depends on a message being delivered again.

It drives purchased credit (``adapters.charging.purchases``): each automatic top-up a
save started is turned into a purchased grant with its purchase, and each purchase's
one-off invoice whose next step is due is driven forward (``projections.purchases
.open_purchases``). The payment that makes the grant live arrives by webhook.

It also runs a pass of the re-pricer (``adapters.charging.repricing``) while one is due:
usage a price version published for the past prices again, on lines still open, is
re-priced, bounded per pass; the lines it changes are then pushed like any other.

With a charge consumer in the process (``ownership``), it schedules only the lines of
the customers whose partitions that consumer holds, and any line whose owner is late
(``adapters.charging.ownership``): one pusher per line, so pushes rarely race.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from adapters.charging.corrections import Corrections
from adapters.charging.ownership import Ownership
from adapters.charging.purchases import Purchaser
from adapters.charging.pusher import utcnow
from adapters.charging.repricing import Repricer
from adapters.charging.scheduler import LineScheduler
from domain.saga import StepResult
from projections.credits import due_expiries
from projections.invoice_lines import open_lines
from projections.purchases import OpenPurchase, open_purchases
from projections.transactions import unlined_transaction_ids
from store.connections import Database
from store.errors import ConcurrencyExhausted

__all__ = ["ReconcileReport", "Reconciler"]

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    lines: int = 0  # scheduled here
    adopted: int = 0
    others: int = 0  # open lines another process owns
    repriced: int = 0  # lines re-priced (``adapters.charging.repricing``)
    expired: int = 0  # accounts whose grants' expiry was recorded here
    purchases: int = 0  # purchases of credit driven (top-ups started, invoices stepped)


class Reconciler:
    """Finds the work the database says is open and schedules it."""

    def __init__(
        self,
        corrections: Corrections,
        scheduler: LineScheduler,
        database: Database,
        *,
        ownership: Ownership | None = None,
        clock: Callable[[], datetime] = utcnow,
        repricer: Repricer | None = None,
        purchaser: Purchaser | None = None,
    ) -> None:
        self.purchaser = purchaser
        self.repricer = repricer
        self.corrections = corrections
        self.scheduler = scheduler
        self.database = database
        self.ownership = ownership
        self.clock = clock

    def pass_once(self, stop: threading.Event | None = None) -> ReconcileReport:
        """Schedule every open line and settle every unlined transaction; when ``stop``
        is set, no further transaction is adopted."""
        stop = stop or threading.Event()
        report = ReconcileReport()
        now = self.clock()
        if self.repricer is not None and self.repricer.due():
            report.repriced = self.repricer.pass_once(stop)[0].lines
        with self.database.connection() as conn:
            lines = open_lines(conn)
            legacy = unlined_transaction_ids(conn)
            expiring = due_expiries(conn, now)
            purchases = open_purchases(conn, now) if self.purchaser is not None else []
        ledger = self.corrections.ledger
        for customer_id, currency in expiring:  # idempotent: a racer records nothing more
            expired = ledger.change_account(customer_id, currency, lambda a: a.expire_credits(now))
            report.expired += bool(expired)
        for purchase in purchases:
            if stop.is_set():
                break
            report.purchases += self._purchase(purchase)
        for txn_id in legacy:  # the projection may lag: adopt() decides from the aggregate
            if stop.is_set():
                break
            report.adopted += self.corrections.adopt(txn_id) is StepResult.SETTLED
        for line, customer, oldest, due in lines:
            if self.ownership is not None and not self.ownership.pushes(customer, oldest, now):
                report.others += 1  # its owner's
                continue
            self.scheduler.changed(line, customer=customer, changed_at=oldest, due=due)
            report.lines += 1
        return report

    def _purchase(self, purchase: OpenPurchase) -> int:
        """Start a requested top-up's purchase, then step its invoice. A purchase that
        cannot be driven now is logged and left for the next pass (its Stripe failures
        are recorded by the purchaser itself)."""
        assert self.purchaser is not None
        try:
            if purchase.state == "requested":
                self.purchaser.start_top_up(
                    purchase.customer_id, purchase.currency, purchase.grant_id
                )
            self.purchaser.step(purchase.purchase_id)
        except (ConcurrencyExhausted, ValueError) as exc:
            log.warning("purchase %s not driven: %s", purchase.purchase_id, exc)
            return 0
        return 1
