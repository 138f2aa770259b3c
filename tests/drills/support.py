"""Invariant checks shared by the drills (I1-I4, I8), ending with the audit itself, and
a worker process to watch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from adapters.audit.report import stripe_invoice_items
from adapters.settings import Settings
from domain.metering import Metering
from domain.money import round_minor
from domain.transaction import Source, TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import audit_findings, usage
from tools.summary import Balances


def reserve(
    ledger: BillingLedger, n: int, customer: str = "acme", *, prefix: str = "d"
) -> list[UUID]:
    """Record ``n`` usage records (Metered + Reserved, and their line) through the ledger."""
    batch = [
        Metering(
            usage(f"{prefix}-{i}", customer=customer, quantity=1000 + i), Source("usage", 0, i)
        )
        for i in range(n)
    ]
    decision = ledger.record_usage(batch)
    return [t.id for t in decision.transactions]


def assert_invariants(
    ledger: BillingLedger, emulator: StripeEmulator, txn_ids: list[UUID], settings: Settings
) -> dict[str, int]:
    """Every transaction terminal; per line, Stripe holds exactly the newest acknowledged
    total, which is the line's exact total rounded once; money conserved per customer
    and currency; and the audit (chains, lifecycle, lines, read models, Stripe) clean."""
    states: dict[str, int] = {}
    lines: set[UUID] = set()
    for txn_id in txn_ids:
        txn = ledger.transaction(txn_id)
        states[str(txn.state)] = states.get(str(txn.state), 0) + 1
        assert txn.state.is_terminal, (txn_id, txn.state, txn.last_error)
        if txn.line_id is not None:
            lines.add(txn.line_id)
    for line_id in lines:
        line = ledger.line_by_id(line_id)
        push = ledger.line_push(line_id)
        assert push is not None and push.pushed_sequence == line.sequence, line_id
        assert line.billed == round_minor(line.exact_total)
        held = [
            i for i in emulator.live_invoice_items() if i["metadata"].get("line_id") == str(line_id)
        ]
        assert sorted(i["id"] for i in held) == sorted(push.item_ids), line_id
        assert sum(i["amount"] for i in held) == line.billed, line_id
    balances = Balances().apply_all(ledger.all_events())
    for currencies in balances.by_customer.values():
        for bal in currencies.values():
            assert bal.conserved, bal
            assert bal.in_flight == 0, bal
    findings = audit_findings(settings, ledger, lambda: stripe_invoice_items(settings.stripe()))
    assert findings == []
    return states


def settled(states: dict[str, int]) -> bool:
    return set(states) <= {str(TxnState.CHARGED), str(TxnState.COMPENSATED)}


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
