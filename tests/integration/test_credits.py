"""Prepaid credits against real PostgreSQL and the Stripe emulator over HTTP: the
credit usage consumed comes off its invoice as a "Prepaid credits applied" item, read
back with the other items and finalized at usage minus credits, equal to the ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain.account import CustomerAccount
from domain.credit_line import CREDIT_METER, CreditLine
from tests.integration.support import record
from tests.integration.test_invoices import Parts, _audit_clean, _invoice_of, parts

__all__ = ["parts"]  # the fixture, shared with the invoices' tests

GRANT = 500  # 5.00 USD, of 7.503 USD of usage


def _grant(account: CustomerAccount, amount: int = GRANT, grant_id: str = "promo") -> bool:
    return account.grant_credit(
        grant_id, amount, effective_at=datetime.now(UTC) - timedelta(days=1),
        source="promotional", reason="welcome",
    )  # fmt: skip


def test_a_finalized_invoice_is_usage_minus_the_credit_consumed_equal_to_the_ledger(
    parts: Parts,
) -> None:
    parts.ledger.change_account("acme", "USD", _grant)
    txns = record(parts.ledger, "acme", ["a-1", "a-2", "a-3"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txns[0])
    final = parts.finalize(invoice_id)
    lines = [parts.ledger.line_by_id(line) for line in final.lines]
    credit = [ln for ln in lines if isinstance(ln, CreditLine)]
    usage = sum(ln.billed for ln in lines if not isinstance(ln, CreditLine))
    assert [ln.billed for ln in credit] == [-GRANT] and usage > GRANT
    [stripe_invoice] = parts.emulator.invoices()
    assert final.total == final.expected_total == stripe_invoice["total"] == usage - GRANT
    items = {
        i["description"].split(" 20")[0]: i["amount"] for i in parts.emulator.live_invoice_items()
    }
    assert items[CREDIT_METER] == -GRANT
    account = parts.ledger.account("acme", "USD")
    assert account is not None and account.credit_remaining == 0
    _audit_clean(parts)
