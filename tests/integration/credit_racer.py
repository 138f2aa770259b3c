"""Run as a process by ``test_credits.py`` and ``test_credit_top_ups.py``: record one
customer's usage in batches as fast as it can, so two of them race for the customer's
account (and its credit). A batch that keeps losing the race is recorded again, as an
ingest worker records a batch again after a failed save (its records' ids are the same)."""

from __future__ import annotations

import sys

from adapters.bootstrap import open_ledger
from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source
from store.errors import ConcurrencyExhausted
from tests.integration.support import usage

AGAIN = 20  # a batch recorded again at most this many times


def main(customer: str, prefix: str, batches: int, size: int, quantity: int) -> None:
    with open_ledger(Settings()) as ledger:
        for b in range(batches):
            batch = [
                Metering(usage(f"{prefix}-{b}-{i}", customer=customer, quantity=quantity),
                         Source("usage", 0, b * size + i))
                for i in range(size)
            ]  # fmt: skip
            for again in range(AGAIN + 1):
                try:
                    ledger.record_usage(batch)
                    break
                except ConcurrencyExhausted:
                    if again == AGAIN:
                        raise


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
