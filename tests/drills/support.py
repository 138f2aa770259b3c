"""Invariant checks shared by the drills (I1-I4)."""

from __future__ import annotations

from uuid import UUID

from domain.metering import Metering
from domain.transaction import Source, TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
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
