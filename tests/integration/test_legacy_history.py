"""A history written by the ledger before exact amounts and invoice lines existed
(version 1 events: integer amounts rounded per record, one Stripe invoice item per
transaction) loads, audits clean against Stripe, and its open transactions join lines.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from adapters.audit.report import stripe_invoice_items
from adapters.bootstrap import build_pusher, build_reconciler, build_scheduler
from adapters.settings import Settings
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.integration.legacy import CHARGED, RESERVED, old_stripe_item, version_1_history
from tests.integration.support import audit_findings

pytestmark = pytest.mark.integration


def test_a_history_from_before_lines_audits_clean_and_its_open_transaction_joins_a_line(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ledger.recorder.insert_events(version_1_history(old_stripe_item(emulator)))
    charged, reserved = CHARGED, RESERVED
    assert ledger.transaction(charged).amount == Decimal(25)
    assert ledger.transaction(reserved).line_id is None

    def audited() -> list[str]:
        return audit_findings(
            stripe_settings, ledger, lambda: stripe_invoice_items(stripe_settings.stripe())
        )

    assert audited() == []

    pusher = build_pusher(stripe_settings, ledger)
    reconciler = build_reconciler(stripe_settings, pusher, build_scheduler(stripe_settings, pusher))
    assert reconciler.pass_once().adopted == 1
    adopted = ledger.transaction(reserved)
    assert adopted.line_id is not None and adopted.state is TxnState.RESERVED
    pusher.push(adopted.line_id)
    assert ledger.transaction(reserved).state is TxnState.CHARGED
    assert reconciler.pass_once().adopted == 0  # joined one line, once
    assert audited() == []
    lines = [i for i in emulator.live_invoice_items() if "line_id" in i["metadata"]]
    assert [i["amount"] for i in lines] == [40]  # the old integer amount, now on a line
