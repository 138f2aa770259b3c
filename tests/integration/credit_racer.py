"""Run as a process by ``test_credits.py``: record one customer's usage in batches as
fast as it can, so two of them race for the customer's account (and its credit)."""

from __future__ import annotations

import sys

from adapters.bootstrap import open_ledger
from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source
from tests.integration.support import usage


def main(customer: str, prefix: str, batches: int, size: int, quantity: int) -> None:
    with open_ledger(Settings()) as ledger:
        for b in range(batches):
            ledger.record_usage([
                Metering(usage(f"{prefix}-{b}-{i}", customer=customer, quantity=quantity),
                         Source("usage", 0, b * size + i))
                for i in range(size)
            ])  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
