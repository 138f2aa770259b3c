"""Dead letters from the command line, against the real broker and PostgreSQL: ``produce``
warns of what a local check would set aside (and sends it all the same), ``dead-letters
list`` and ``show`` find a letter by reason, customer and usage id, and ``redrive``
sends a letter's bytes back to the usage topic once: after its meter is given a price,
the record is billed, exactly once, however many times it is re-driven."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from adapters.settings import DEFAULT_PRICE_LIST, Settings
from domain.ids import transaction_id
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import ingest_until, metered_usage_ids

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
RECORDS = [
    {"usage_id": "ok-1", "customer_id": "acme", "meter": "api.requests", "quantity": 10},
    {"usage_id": "neg-1", "customer_id": "acme", "meter": "api.requests", "quantity": -100},
    {"usage_id": "img-1", "customer_id": "acme", "meter": "vision.images", "quantity": 3},
]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


_ingest = ingest_until


def _usage_topic(settings: Settings) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    consumer = KafkaConsumer(
        settings.usage_topic,
        bootstrap_servers=settings.kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        return [(m.value, list(m.headers)) for m in consumer]
    finally:
        consumer.close()


def test_a_letter_is_found_shown_and_re_driven_once_after_its_cause_is_fixed(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    env = settings_env(settings)
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    at = (day + timedelta(hours=10)).isoformat()  # recent: within the ledger's window
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(json.dumps({**r, "occurred_at": at}) + "\n" for r in RECORDS))

    produced = _cli("produce", str(usage), env=env)
    assert produced.returncode == 0, produced.stderr
    warned = produced.stderr.splitlines()
    assert warned[0].startswith("line 2: would be a dead letter (") and "sent anyway" in warned[0]
    assert warned[1].startswith("line 3: would be a dead letter (unknown meter")
    assert "2 of them would be dead letters by a local check" in produced.stderr
    _ingest(settings, ingest_ledger, 3)

    listed = json.loads(_cli("dead-letters", "list", "--json", env=env).stdout)
    assert sorted(r["usage_id"] for r in listed) == ["img-1", "neg-1"]
    [image] = json.loads(
        _cli("dead-letters", "list", "--reason", "unknown_meter", "--json", env=env).stdout
    )
    assert (image["usage_id"], image["customer"], image["redriven_at"]) == ("img-1", "acme", None)
    assert _cli("dead-letters", "list", "--customer", "nobody", env=env).stdout == "(no rows)\n"
    shown = _cli("dead-letters", "show", image["letter"], env=env)
    assert shown.returncode == 0, shown.stderr
    assert "code            unknown_meter" in shown.stdout
    assert '"meter": "vision.images"' in shown.stdout and "payload_whole   True" in shown.stdout

    # The price is published (in force from before the usage); the letter is re-driven,
    # twice; the ledger that set it aside prices it, without a restart.
    prices = tmp_path / "prices.toml"
    prices.write_text(
        DEFAULT_PRICE_LIST.read_text()
        + '\n[meters."vision.images"]\nunit_price = "0.01"\nper = 1\ncurrency = "USD"\n'
    )
    published = _cli("prices", "publish", str(prices), "--effective-from", day.isoformat(), env=env)
    assert published.returncode == 0, published.stderr
    first = _cli("dead-letters", "redrive", "--reason", "unknown_meter", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"re-drove 1 letter(s) to {settings.usage_topic}")
    again = _cli("dead-letters", "redrive", image["letter"], env=env)
    assert again.stdout.startswith("re-drove 0 letter(s)")
    assert f"not re-driven: {image['letter']}: re-driven already at" in again.stdout
    _ingest(settings, ingest_ledger, 1)
    txn = ingest_ledger.transaction(transaction_id("acme", "img-1"))
    assert txn.state is TxnState.RESERVED and txn.amount == 3  # 3 x 0.01 USD: 3 cents
    assert txn.price_version == 2
    assert sorted(metered_usage_ids(settings.database_url)) == ["img-1", "ok-1"]

    messages = _usage_topic(settings)
    assert len(messages) == 4  # the three produced, and one re-drive
    value, headers = messages[-1]
    assert json.loads(value)["usage_id"] == "img-1"
    assert ("redriven_from", image["letter"].encode()) in headers
    [marked] = json.loads(
        _cli("dead-letters", "list", "--reason", "unknown_meter", "--json", env=env).stdout
    )
    assert marked["redriven_at"] is not None

    # produce's local check reads the price book: the published meter is no warning now;
    # without a readable ledger it checks against the configured file, and says so.
    later = tmp_path / "later.jsonl"
    later.write_text(json.dumps({**RECORDS[2], "usage_id": "img-2", "occurred_at": at}) + "\n")
    produced = _cli("produce", str(later), env=env)
    assert produced.returncode == 0, produced.stderr
    assert "would be a dead letter" not in produced.stderr, produced.stderr
    unread = {**env, "BILLING_LEDGER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    produced = _cli("produce", str(later), env=unread)
    assert produced.returncode == 0, produced.stderr
    assert "the price book cannot be read (" in produced.stderr
    assert "line 1: would be a dead letter (unknown meter" in produced.stderr


def test_misuse_of_the_dead_letter_commands_is_one_line_and_status_2(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    env = settings_env(settings)
    for args, said in [
        (["show", "nonsense"], "'nonsense' is not a letter id"),
        (["show", "usage/0@999"], "no dead letter usage/0@999"),
        (["redrive"], "give one letter's id, or filters"),
        (["redrive", "usage/0@1", "--reason", "x"], "give one letter's id, or filters"),
    ]:
        proc = _cli("dead-letters", *args, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_usage_dated_outside_the_window_is_warned_of_set_aside_and_named_by_its_reason(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    env = {**settings_env(settings), "BILLING_LEDGER_USAGE_MAX_AGE_DAYS": "30"}
    now = datetime.now(UTC)
    usage = tmp_path / "usage.jsonl"
    usage.write_text("".join(
        json.dumps({**RECORDS[0], "usage_id": usage_id, "occurred_at": at}) + "\n"
        for usage_id, at in (
            ("future", "9999-12-31T23:59:59Z"),
            ("old", (now - timedelta(days=31)).isoformat()),
            ("now", now.isoformat()),
        )
    ))  # fmt: skip
    produced = _cli("produce", str(usage), env=env)
    assert produced.returncode == 0, produced.stderr
    warned = produced.stderr.splitlines()
    assert warned[0].startswith("line 1: would be a dead letter (occurred_at too far ahead: ")
    assert warned[1].startswith("line 2: would be a dead letter (occurred_at too old: ")
    assert "is more than 30 days before the ledger's clock" in warned[1]

    _ingest(settings.model_copy(update={"usage_max_age_days": 30}), ingest_ledger, 3)
    letters = json.loads(_cli("dead-letters", "list", "--json", env=env).stdout)
    assert sorted((r["usage_id"], r["code"]) for r in letters) == [
        ("future", "too_far_ahead"), ("old", "too_old"),
    ]  # fmt: skip
    assert metered_usage_ids(settings.database_url) == ["now"]
