"""Contracts against a real PostgreSQL and broker: ``contracts set`` checks a file whole and
records nothing on error, ``contracts show`` and ``prices show --customer`` say what a
customer pays, a running ingest worker prices a contract customer beside a list-price
customer (each by its own price, a contract set while it runs and effective mid-period
picked up without a restart), and the audit recomputes each amount from the contract
version it names."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from adapters.bootstrap import build_ingest_worker, close_worker, migrate, open_ledger
from adapters.settings import Settings
from domain.contract import ContractTerms
from domain.ids import transaction_id
from domain.usage import UsageRecord
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import audit_findings, produce_records, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
# Mid-period (of a day, or of an hour), and recent: usage is within the ledger's window.
MID = (datetime.now(UTC) - timedelta(days=1)).replace(hour=12, minute=30, second=0, microsecond=0)
CONTRACT = """
[meters."api.requests"]
discount = "12.5"

[meters."gpt-4o.input_tokens"]
unit_price = "2.00"
currency = "USD"
per = 1000000

[minimum]
USD = "25.00"

[minimum.meters]
"eu.gpu.h100.seconds" = "3.00"
"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_contracts_set_show_and_the_prices_a_customer_pays_through_the_command_line(
    settings: Settings, tmp_path: Path
) -> None:
    migrate(settings)
    env = settings_env(settings)
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[meters.nope]\ndiscount = "5"\n'
        '[meters."api.requests"]\ndiscount = "101"\n'
        '[meters."eu.gpu.h100.seconds"]\nunit_price = "0.002"\ncurrency = "USD"\n'
        '[meters."gpt-4o.input_tokens"]\nunit_price = "-1"\ncurrency = "USD"\n'
    )
    refused = _cli(env, "contracts", "set", "--customer", "acme", str(bad))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1  # one line
    assert refused.stderr.startswith(f"billing-ledger: error: {bad}: 4 problem(s): ")
    for reason in (
        "meter 'nope': not in the price book",
        "discount '101' is not a percentage from 0 to 100",
        "currency USD differs from its list price's (EUR)",
        "unit_price must be a number >= 0",
    ):
        assert reason in refused.stderr
    assert refused.stderr.endswith("; nothing was recorded\n")
    no_zone = _cli(env, "contracts", "set", "--customer", "acme", str(bad), "--effective-from",
                   "2027-01-01T00:00:00")  # fmt: skip
    assert no_zone.returncode == 2
    assert "has no time zone" in no_zone.stderr
    with open_ledger(settings) as ledger:
        assert ledger.contract("acme") is None

    good = tmp_path / "acme.toml"
    good.write_text(CONTRACT)
    done = _cli(env, "contracts", "set", "--customer", "acme", str(good),
                "--effective-from", "2026-12-15T13:00:00+01:00")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "set contract version 1 of acme, in force from 2026-12-15T12:00:00+00:00"
        " (2 meters overridden, 2 minimums)\n"
    )
    shown = json.loads(
        _cli(
            env, "contracts", "show", "--customer", "acme", "--json", "--at", "2026-12-16T00:00Z"
        ).stdout
    )
    assert shown["version"] == 1
    assert shown["meters"]["api.requests"] == {"discount": "12.5"}
    assert shown["minimum"] == {"USD": "25.00 USD"}
    assert shown["meter_minimums"] == {"eu.gpu.h100.seconds": "3.00 EUR"}  # its list currency
    before = _cli(env, "contracts", "show", "--customer", "acme", "--at", "2026-12-15T11:59:59Z")
    assert before.returncode == 2
    assert "acme has no contract in force at 2026-12-15T11:59:59+00:00" in before.stderr

    pays = _cli(env, "prices", "show", "--customer", "acme", "--at", "2026-12-16T00:00:00Z")
    assert pays.returncode == 0, pays.stderr
    lines = pays.stdout.splitlines()
    assert lines[0].endswith("price book version 1, contract version 1")
    table = {row.split()[0]: row.split()[1:] for row in lines[2:]}
    assert table["api.requests"] == ["0.000875", "USD", "1", "contract", "v1"]  # 0.001 less 12.5 %
    assert table["gpt-4o.input_tokens"] == ["2.00", "USD", "1,000,000", "contract", "v1"]
    assert table["eu.gpu.h100.seconds"] == ["0.0025", "EUR", "1", "list"]
    listed = json.loads(_cli(env, "prices", "show", "--customer", "beta", "--json").stdout)
    assert listed["contract_version"] is None
    assert {m["source"] for m in listed["meters"]} == {"list"}


def _usage(usage_id: str, customer: str, meter: str, quantity: int, at: datetime) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id, customer_id=customer, meter=meter,
        quantity=Decimal(quantity), occurred_at=at,
    )  # fmt: skip


def test_a_running_ingest_prices_a_contract_customer_beside_a_list_price_customer(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    worker = build_ingest_worker(settings, ingest_ledger)
    stop = threading.Event()
    runner = threading.Thread(target=worker.run, args=(stop,))
    runner.start()
    try:
        produce_records(settings, [_usage("warm", "acme", "api.requests", 1000, MID)])
        wait_for(lambda: worker.stats.records == 1, what="the first record")
        # Set by another process while the worker runs, effective mid-period (MID).
        with open_ledger(settings) as operator:
            listed = operator.refresh_prices().price_at(MID).prices
            operator.set_contract("acme", ContractTerms.from_toml(CONTRACT, listed), MID)
        records = [
            _usage(f"{customer}-{when}-{meter}", customer, meter, quantity, at)
            for customer in ("acme", "beta")
            for when, at in (("before", MID - timedelta(seconds=1)), ("after", MID))
            for meter, quantity in (("api.requests", 1000), ("gpt-4o.input_tokens", 1_000_000))
        ]
        produce_records(settings, records)
        wait_for(lambda: worker.stats.records == 9, what="the records after the contract")
    finally:
        stop.set()
        runner.join(30)
        close_worker(worker)
    assert not runner.is_alive()

    def priced(customer: str, usage_id: str) -> tuple[Decimal, int | None]:
        txn = ingest_ledger.transaction(transaction_id(customer, usage_id))
        return txn.amount, txn.contract_version

    api, tokens = "api.requests", "gpt-4o.input_tokens"
    assert priced("acme", "warm") == (Decimal(100), None)  # recorded before it was set
    for customer in ("acme", "beta"):  # before its moment: list prices for both
        assert priced(customer, f"{customer}-before-{api}") == (Decimal(100), None)
        assert priced(customer, f"{customer}-before-{tokens}") == (Decimal(250), None)
    assert priced("beta", f"beta-after-{api}") == (Decimal(100), None)  # 1,000 x 0.001 USD
    assert priced("beta", f"beta-after-{tokens}") == (Decimal(250), None)  # 2.50 USD per M
    assert priced("acme", f"acme-after-{api}") == (Decimal("87.5"), 1)  # less 12.5 %
    assert priced("acme", f"acme-after-{tokens}") == (Decimal(200), 1)  # 2.00 USD per M
    assert audit_findings(settings, ingest_ledger) == []
