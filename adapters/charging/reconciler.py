"""The reconciler: every transaction whose next step is due or overdue is driven.

Every ``reconcile_interval_s`` it finds the open transactions (through the read
model's query ``projections.transactions.open_transaction_ids``, which also sees what
the projector has not reached), asks the domain which are due (a retry due, a
reservation nobody charged within ``stale_after``, a transaction past its horizon)
and drives them with the ``Charger``, a few at a time. Forward progress never
depends on a message being delivered again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

from adapters.charging.charger import Charger
from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from domain.saga import Step, StepResult, is_stale, next_step
from domain.transaction import TxnState
from projections.transactions import open_transaction_ids
from store.connections import Database

__all__ = ["ReconcileReport", "Reconciler"]

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    examined: int = 0
    driven: int = 0
    results: dict[str, int] = field(default_factory=dict)


class Reconciler:
    """Finds transactions whose next step is due or overdue and drives them."""

    def __init__(self, charger: Charger, database: Database, *, parallel: int = 8) -> None:
        self.charger = charger
        self.database = database
        self.parallel = parallel

    def pass_once(self, stop: threading.Event | None = None) -> ReconcileReport:
        """Drive every transaction whose step is due, ``parallel`` at a time (the Stripe
        client's own limits still bound the pressure on Stripe). When ``stop`` is set,
        the transactions in flight finish and no other is started."""
        stop = stop or threading.Event()
        report = ReconcileReport()
        now = self.charger.clock()
        due: list[UUID] = []
        for txn_id in self.open_transactions():
            if stop.is_set():
                break
            report.examined += 1
            txn = self.charger.ledger.transaction(txn_id)
            step = next_step(txn, now, self.charger.policy)
            if step is Step.COMPENSATE or (
                step is Step.CHARGE
                and (txn.state is TxnState.CHARGE_FAILED or is_stale(txn, now, self.charger.policy))
            ):
                due.append(txn_id)
        report.driven = len(due)
        if due:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="reconcile") as pool:
                driven = pool.map(
                    lambda txn_id: None if stop.is_set() else self._drive(txn_id), due
                )
                results = Counter(str(r) for r in driven if r is not None)
            report.results = dict(results)
            report.driven = sum(results.values())
        return report

    def open_transactions(self) -> list[UUID]:
        """Transactions that are neither Charged nor Compensated (see the query)."""
        with self.database.connection() as conn:
            return open_transaction_ids(conn)

    def _drive(self, txn_id: UUID) -> StepResult:
        """One reconciler action: a ``reconcile`` span in the transaction's trace."""
        with telemetry.span(
            "reconcile",
            telemetry.transaction_context(txn_id),
            billing__transaction_id=str(txn_id),
        ) as current:
            result = self.charger.drive(txn_id)
            current.set_attribute("billing.result", str(result))
            log.info(
                "transaction reconciled",
                extra=step_fields("reconcile", str(result), transaction_id=txn_id),
            )
        return result
