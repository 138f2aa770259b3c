"""``python -m tools.bench_decision``: what the ingest's decision costs a record, with and
without prepaid credit and alerts, in this process alone (no database, no broker).

The part of an ingest save that credit and alerts add to is the decision
(``domain.metering_events.meter_batch_events``) and the encoding of the accounts' and
lines' events; the transactions' own rows are the same either way. This runs exactly
that, on the same batches, for four kinds of account:

* ``none``: no grant, no threshold;
* ``grant``: a grant that never runs out (every record burns credit, every invoice gets
  a credit line);
* ``alerts``: a spend threshold only (checked for every record, never reached);
* ``credits``: the grant and the four thresholds of ``bench ingest --credits``.

``--batches`` batches of 2,000 records over ``--customers`` customers (two meters), each
decided on copies of the accounts and lines the first batch left (as the ingest's reads
hand them out, ``store.batch_reads.clone``), every touched aggregate's new events encoded
by the ledger's mapper. Printed per kind: microseconds a record, the best of ``--repeat``
runs (CPU time of this process), and the share more than ``none``. Numbers, no verdict.

Timings on a shared machine move by a tenth from run to run. For figures that do not,
count instructions (each kind alone, one run after the warm-up; the difference between
two kinds over twice the records is what one record costs more)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python -m tools.bench_decision --kinds grant --repeat 1
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from adapters.runtime import tune_gc
from domain.account import CustomerAccount
from domain.metering import Metering
from domain.metering_events import meter_batch_events
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import Source
from domain.usage import UsageRecord
from store.batch_reads import clone
from store.ledger import BillingLedger
from tools.bench_ingest import CREDIT_ALERTS
from tools.measure import cores

__all__ = ["KINDS", "main", "run_decision"]

KINDS = ("none", "grant", "alerts", "credits")
BATCH = 2000
PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.01"), "USD"),
        "gpt.tokens": Price(Decimal("2.50"), "USD", per=1_000_000),
    }
)
GRANT_MINOR = 10**13  # never runs out


def _accounts(kind: str, customers: int, now: datetime) -> dict[tuple[str, str], Any]:
    accounts: dict[tuple[str, str], Any] = {}
    for c in range(customers):
        account = CustomerAccount.open(f"c{c}", "USD", None)
        if kind in ("grant", "credits"):
            account.grant_credit(
                "bench", GRANT_MINOR, effective_at=now - timedelta(days=1),
                source="promotional", reason="bench",
            )  # fmt: skip
        if kind == "credits":
            account.set_alerts(CREDIT_ALERTS)
        elif kind == "alerts":
            account.set_alerts(["spend:10000000"])
        account.collect_events()
        accounts[(account.customer_id, account.currency)] = account
    return accounts


def _batch(number: int, customers: int, at: datetime) -> list[Metering]:
    batch = []
    for i in range(BATCH):
        n = number * BATCH + i
        record = UsageRecord(
            usage_id=f"u{n}",
            customer_id=f"c{n % customers}",
            meter="gpt.tokens" if n % 2 else "api.requests",
            quantity=Decimal(1 + n % 977),
            occurred_at=at,
        )
        batch.append(Metering(record, Source("usage", 0, n)))
    return batch


class _Decider:
    """One kind's accounts and lines as the first batch left them, and its batches."""

    def __init__(self, kind: str, customers: int, batches: int) -> None:
        self.now = datetime.now(UTC)
        at = self.now - timedelta(minutes=1)
        self.accounts = _accounts(kind, customers, self.now)
        self.lines: dict[UUID, Any] = {}
        self.mapper = BillingLedger(PRICES, env={"PERSISTENCE_MODULE": "eventsourcing.popo"}).mapper
        for aggregate in self._decide(_batch(0, customers, at)):  # opens the lines
            aggregate.collect_events()
            if isinstance(aggregate, CustomerAccount):
                self.accounts[(aggregate.customer_id, aggregate.currency)] = aggregate
            else:
                self.lines[aggregate.id] = aggregate
        self.batches = [_batch(b, customers, at) for b in range(1, batches + 1)]

    def _decide(self, batch: Sequence[Metering]) -> list[Any]:
        decision = meter_batch_events(
            batch,
            PRICES,
            load_account=lambda customer, currency: clone(self.accounts[(customer, currency)]),
            load_line=lambda i: clone(self.lines[i]) if i in self.lines else None,
            load_invoice=lambda i: clone(self.lines[i]) if i in self.lines else None,
            periods=PeriodPolicy(),
            now=self.now,
        )
        return list(decision.touched)

    def run(self) -> None:
        for batch in self.batches:
            for aggregate in self._decide(batch):
                for event in aggregate.collect_events():
                    self.mapper.to_stored_event(event)


def run_decision(
    kinds: Sequence[str] = KINDS, customers: int = 100, batches: int = 10, repeat: int = 7
) -> dict[str, Any]:
    """µs a record for each kind, the best of ``repeat`` runs (see the module docstring)."""
    per_record: dict[str, float] = {}
    for kind in kinds:
        decider = _Decider(kind, customers, batches)
        decider.run()  # warm-up
        best = float("inf")
        for _ in range(repeat):
            started = time.process_time()
            decider.run()
            best = min(best, time.process_time() - started)
        per_record[kind] = round(best / (batches * BATCH) * 1e6, 2)
    base = per_record.get("none")
    return {
        "cores": cores(),
        "records": batches * BATCH,
        "customers": customers,
        "us_per_record": per_record,
        "more_than_none": {
            k: round(v / base - 1, 3) for k, v in per_record.items() if base and k != "none"
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"the ingest's decision, {result['records']:,} records of {result['customers']}"
        f" customers a run, best of the runs, {result['cores']} cores",
    ]
    more = result["more_than_none"]
    for kind, us in result["us_per_record"].items():
        extra = f"  (+{more[kind]:.0%})" if kind in more else ""
        lines.append(f"  {kind:<8} {us:>8.2f} µs a record{extra}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_decision", description=__doc__)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--customers", type=int, default=100)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tune_gc()  # as ``billing-ledger run`` does after start-up
    result = run_decision(args.kinds, args.customers, args.batches, args.repeat)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
