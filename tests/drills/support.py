"""Invariant checks shared by the drills (I1-I4), and a worker process to watch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source, TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import usage
from tools.summary import Balances


def reserve(ledger: BillingLedger, n: int, customer: str = "acme") -> list[UUID]:
    """Record ``n`` usage records (Metered + Reserved) straight through the ledger."""
    batch = [
        Metering(usage(f"d-{i}", customer=customer, quantity=1000 + i), Source("usage", 0, i))
        for i in range(n)
    ]
    decision = ledger.record_usage(batch)
    return [t.id for t in decision.transactions]


def assert_invariants(
    ledger: BillingLedger, emulator: StripeEmulator, txn_ids: list[UUID]
) -> dict[str, int]:
    """Every transaction terminal, at most one live charge each, none for a compensated
    one, the charged ones' items match, and money conserved per customer and currency."""
    states: dict[str, int] = {}
    for txn_id in txn_ids:
        txn = ledger.transaction(txn_id)
        states[str(txn.state)] = states.get(str(txn.state), 0) + 1
        assert txn.state.is_terminal, (txn_id, txn.state, txn.last_error)
        live = emulator.live_invoice_items(str(txn_id))
        if txn.state is TxnState.CHARGED:
            assert [i["id"] for i in live] == [txn.stripe_object_id], (txn_id, live)
            assert live[0]["amount"] == txn.amount
        else:
            assert live == [], (txn_id, live)
    balances = Balances().apply_all(ledger.all_events())
    for currencies in balances.by_customer.values():
        for bal in currencies.values():
            assert bal.conserved, bal
            assert bal.in_flight == 0, bal
    return states


class Worker:
    """A ``billing-ledger run`` process whose stderr goes to a file read at any time."""

    def __init__(self, settings: Settings, role: str, log: Path, *args: str) -> None:
        self.log = log
        with log.open("wb") as out:  # the child has its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "adapters.cli", "run", "--role", role, *args],
                env=settings_env(settings),
                stderr=out,
            )

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        """True while the process runs; fails the drill at once when it has ended."""
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the worker ended with {self.proc.returncode}: {self.stderr()[-3000:]}"
            )
        return True

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(30)

    def lines(self, message: str) -> list[dict[str, Any]]:
        """The JSON log lines with this message."""
        found = []
        for line in self.stderr().splitlines():
            try:
                body = json.loads(line)
            except ValueError:
                continue
            if isinstance(body, dict) and body.get("message") == message:
                found.append(body)
        return found
