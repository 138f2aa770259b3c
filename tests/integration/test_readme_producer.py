"""The documented Python producer (README.md and docs/reference/usage-records.md) runs as
written (against the test's broker), and what it sends is a record the ledger bills."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters.bootstrap import build_ingest_worker, close_worker
from adapters.settings import Settings
from domain.ids import transaction_id
from store.ledger import BillingLedger
from tests.integration.support import drive

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("page", "usage_id", "quantity"),
    [("docs/reference/usage-records.md", "req-8812", 1520), ("README.md", "req-42", 1200)],
)
def test_the_documented_python_producer_sends_a_record_the_ledger_bills(
    settings: Settings, ingest_ledger: BillingLedger, page: str, usage_id: str, quantity: int
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
    [block] = [b for b in blocks if "UsageProducer" in b]
    here = f"UsageProducer({settings.kafka_bootstrap!r}, {settings.usage_topic!r},"
    block = re.sub(r'UsageProducer\("127\.0\.0\.1:9092",( "usage")?', here, block)
    exec(block, {})  # noqa: S102
    worker = build_ingest_worker(settings, ingest_ledger)
    try:
        drive(worker, until=lambda: worker.stats.records >= 1)
    finally:
        close_worker(worker)
    txn = ingest_ledger.transaction(transaction_id("acme", usage_id))
    assert txn.quantity == quantity and txn.meter == "gpt-4o.input_tokens"
