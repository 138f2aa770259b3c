"""Invoice drills: a closer killed (SIGKILL) between Stripe's finalize and its record,
against real PostgreSQL, the broker and the Stripe emulator over HTTP. The restarted
closer reads Stripe's answer back (same key, or the invoice itself) and records the
invoice ``Finalized`` once; Stripe executed the finalize once; the audit is clean."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest

from adapters.bootstrap import build_projector, build_pusher
from adapters.settings import Settings
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.drills.support import Worker, reserve
from tests.integration.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]


def _finalizes(emulator: StripeEmulator) -> list[dict[str, object]]:
    """Finalizes Stripe executed (a replayed key is not executed again)."""
    return [e for e in emulator.ledger() if str(e["path"]).endswith("/finalize")]


def _invoice(ledger: BillingLedger, txn: UUID) -> Invoice:
    line_id = ledger.transaction(txn).line_id
    assert line_id is not None
    invoice = ledger.invoice_by_id(ledger.line_by_id(line_id).invoice_id)
    assert invoice is not None
    return invoice


def test_a_closer_killed_after_stripe_finalized_records_the_invoice_once_on_restart(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator, tmp_path: Path
) -> None:
    settings = charge_settings.model_copy(
        update={"billing_period": "day", "invoice_grace_s": 0.0, "reconcile_interval_s": 0.2}
    )
    ledger.periods = settings.periods()
    txns = reserve(ledger, 3, "acme")  # usage on a past day: its period is due to close
    pusher = build_pusher(settings, ledger)
    for line in {ledger.transaction(t).line_id for t in txns}:
        assert line is not None
        pusher.push(line)
    wait_for(lambda: all(ledger.transaction(t).state.is_terminal for t in txns), what="charges")
    invoice_id = _invoice(ledger, txns[0]).id

    killed = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "run", "--role", "reconcile",
         "--drill", "kill_after_finalize"],
        env=settings_env(settings), capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert len(_finalizes(emulator)) == 1  # Stripe finalized it; the answer died with us
    assert _invoice(ledger, txns[0]).state is InvoiceState.FINALIZING

    worker = Worker(settings, "reconcile", tmp_path / "closer.log")
    try:
        wait_for(
            lambda: worker.alive() and _invoice(ledger, txns[0]).state is InvoiceState.FINALIZED,
            timeout=120,
            what="the restarted closer to record the invoice finalized",
        )
    finally:
        assert worker.stop() == 0, worker.stderr()[-3000:]

    final = _invoice(ledger, txns[0])
    history = ledger.history(invoice_id)
    assert [type(e) for e in history].count(Invoice.Finalized) == 1
    [executed] = _finalizes(emulator)
    [stripe_invoice] = emulator.invoices()
    assert executed["object_id"] == stripe_invoice["id"] == final.stripe_invoice_id
    assert stripe_invoice["status"] == "open"
    asked = [r for r in emulator.requests() if str(r["path"]).endswith("/finalize")]
    assert len(asked) == 2  # killed, then asked again with the same key: replayed
    assert {r["idempotency_key"] for r in asked} == {f"invoice-finalize:{invoice_id}"}
    lines = [ledger.line_by_id(line) for line in final.lines]
    assert (final.number, final.total) == (stripe_invoice["number"], stripe_invoice["total"])
    assert final.total == final.expected_total == sum(line.billed for line in lines) > 0

    with build_projector(settings, ledger) as projector:
        projector.pump_all()  # the read models the audit checks against the history
    audit = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "audit", "--stripe", "--json"],
        env=settings_env(settings), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-3000:]
    assert json.loads(audit.stdout)["findings"] == []
