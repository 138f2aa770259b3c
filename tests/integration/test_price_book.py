"""The price book against a real PostgreSQL and broker: ``migrate`` starts it with the
configured file, ``prices publish`` adds versions through the command line, a running
ingest worker prices each record by the version in force when it occurred, picking up a
new version without a restart, and the audit recomputes every amount from the version
its record names."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

from adapters.audit.export import export_events
from adapters.bootstrap import build_ingest_worker, close_worker, migrate, open_ledger
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.metering import Metering
from domain.price_book import EPOCH, PRICE_BOOK_ID, PriceBook
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import audit_findings, price_file, produce_records, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
NEW_PRICE_AT = datetime(2026, 12, 3, tzinfo=UTC)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_migrate_starts_the_book_with_the_configured_file_once(settings: Settings) -> None:
    migrate(settings)
    migrate(settings)  # again: the book is there, nothing is published twice
    with open_ledger(settings) as ledger:
        book = ledger.price_book()
    assert book is not None
    assert book.id == PRICE_BOOK_ID
    assert [(v.number, v.effective_from) for v in book.versions] == [(1, EPOCH)]
    assert book.versions[0].prices == settings.load_prices()


def test_prices_publish_list_and_show_through_the_command_line(
    settings: Settings, tmp_path: Path
) -> None:
    env = settings_env(settings)
    migrated = _cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "price book started: version 1 is " in migrated.stdout

    published = _cli(
        env, "prices", "publish", str(price_file(tmp_path, "0.002")),
        "--effective-from", "2027-01-01T00:00:00Z",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    assert published.stdout == (
        "published price book version 2, in force from 2027-01-01T00:00:00+00:00 (8 meters)\n"
    )

    listed = _cli(env, "prices", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    versions = json.loads(listed.stdout)["versions"]
    assert [(v["version"], v["effective_from"], v["meters"]) for v in versions] == [
        (1, "1970-01-01T00:00:00+00:00", 8),
        (2, "2027-01-01T00:00:00+00:00", 8),
    ]
    assert versions[0]["currencies"] == "EUR, USD"

    before = _cli(env, "prices", "show", "--at", "2026-12-31T23:59:59Z")
    assert before.stdout.splitlines()[0] == (
        "price book version 1, in force from 1970-01-01T00:00:00+00:00"
    )
    header, *rows = before.stdout.splitlines()[1:]
    assert header.split() == ["meter", "model", "price", "per"]
    table = {row.split()[0]: row.split()[1:] for row in rows}
    assert table["api.requests"] == ["per_unit", "0.001", "USD", "1"]  # format_money, major
    assert table["gpt-4o.input_tokens"] == ["per_unit", "2.50", "USD", "1,000,000"]
    assert table["eu.gpu.h100.seconds"] == ["per_unit", "0.0025", "EUR", "1"]
    assert len(table) == 8
    at = _cli(env, "prices", "show", "--at", "2027-01-01T00:00:00Z", "--json")
    shown = json.loads(at.stdout)
    assert (shown["version"], shown["meters"]["api.requests"]["unit_price"]) == (2, "0.002")


def test_an_invalid_price_file_is_refused_with_its_reason_and_nothing_published(
    settings: Settings, tmp_path: Path
) -> None:
    migrate(settings)
    env = settings_env(settings)
    bad = tmp_path / "bad.toml"
    bad.write_text('[meters."api.requests"]\nunit_price = "0.01"\ncurrency = "USD"\nper = 3\n')
    refused = _cli(env, "prices", "publish", str(bad))
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"billing-ledger: error: {bad}: meter 'api.requests': one unit cannot be priced: "
    )
    assert refused.stderr.endswith("; nothing was published\n")
    missing = _cli(env, "prices", "publish", str(tmp_path / "none.toml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("billing-ledger: error: cannot read the price file ")
    unknown = _cli(env, "prices", "show", "--version", "7")
    assert (unknown.returncode, unknown.stderr) == (
        2,
        "billing-ledger: error: the price book has no version 7: it has 1 to 1"
        " (`billing-ledger prices list`)\n",
    )
    with open_ledger(settings) as ledger:
        book = ledger.price_book()
    assert book is not None and len(book.versions) == 1


def _at(usage_id: str, occurred_at: datetime, customer: str = "acme") -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer,
        meter="api.requests",
        quantity=Decimal(1000),
        occurred_at=occurred_at,
    )


def test_a_running_ingest_prices_by_the_version_in_force_when_the_usage_occurred(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    worker = build_ingest_worker(settings, ingest_ledger)
    stop = threading.Event()
    runner = threading.Thread(target=worker.run, args=(stop,))
    runner.start()
    try:
        produce_records(settings, [_at("first", NEW_PRICE_AT + timedelta(seconds=1))])
        wait_for(lambda: worker.stats.records == 1, what="the first record")

        # Published by another process while the worker runs, for a moment in the past.
        with open_ledger(settings) as publisher:
            prices = PriceList.from_toml(price_file(tmp_path, "0.002").read_text())
            assert publisher.publish_prices(prices, NEW_PRICE_AT).number == 2

        produce_records(
            settings,
            [
                _at("late-but-before", NEW_PRICE_AT - timedelta(seconds=1)),
                _at("at-the-moment", NEW_PRICE_AT),
                _at("after", NEW_PRICE_AT + timedelta(hours=1)),
            ],
        )
        wait_for(lambda: worker.stats.records == 4, what="the records after the new version")
    finally:
        stop.set()
        runner.join(30)
        close_worker(worker)
    assert not runner.is_alive()

    def priced(usage_id: str) -> tuple[int, Decimal]:
        txn = ingest_ledger.transaction(transaction_id("acme", usage_id))
        assert txn.price_book_id == PRICE_BOOK_ID
        return txn.price_version, txn.amount

    # Recorded before the version was published: it keeps version 1 (no re-pricing).
    assert priced("first") == (1, Decimal(100))  # 1,000 x 0.001 USD = 100 cents
    # Arrived after the new version, but occurred before its moment: the old price.
    assert priced("late-but-before") == (1, Decimal(100))
    assert priced("at-the-moment") == (2, Decimal(200))
    assert priced("after") == (2, Decimal(200))


def test_the_audit_recomputes_each_amount_from_the_version_it_names(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    ledger = ingest_ledger
    prices = PriceList.from_toml(price_file(tmp_path, "0.002").read_text())
    ledger.publish_prices(prices, NEW_PRICE_AT)
    ledger.record_usage(
        [
            Metering(_at("old-price", NEW_PRICE_AT - timedelta(days=1)), Source("usage", 0, 1)),
            Metering(_at("new-price", NEW_PRICE_AT), Source("usage", 0, 2)),
        ]
    )
    assert audit_findings(settings, ledger) == []

    # A Metered event that names a version the book never published, and one whose
    # amount is not its version's price x quantity (each on a transaction of its own).
    schedule = ledger.refresh_prices()
    made = [
        BillingTransaction.from_usage(_at(usage_id, NEW_PRICE_AT), schedule, Source("usage", 0, i))
        for i, usage_id in enumerate(("forged-version", "forged-amount"), start=3)
    ]
    forged_version = replace(made[0].collect_events()[0], price_version=9)
    forged_amount = replace(made[1].collect_events()[0], amount=Decimal(100))
    ledger.save(forged_version, forged_amount)

    book = PRICE_BOOK_ID
    price_findings = [f for f in audit_findings(settings, ledger) if f.startswith("price ")]
    assert price_findings == [
        f"price {made[0].id}: priced by price book {book} version 9, which does not exist",
        f"price {made[1].id}: amount 1.00 USD, but price book {book} version 2 prices 1000 of"
        " 'api.requests' at 2.00 USD",
    ]


def test_two_workers_mid_stream_price_each_record_by_a_version_published_before_it(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    """A version published while two ingest processes take a stream straddling its
    moment: every record is priced by the version in force when it occurred, by the book
    as it stood before or after the publication (a batch decided just before it keeps the
    old book), never by a version published after it was recorded; every record produced
    after the publication returned is priced by the new book."""
    moment = datetime(2026, 12, 3, tzinfo=UTC)
    straddle = [moment - timedelta(microseconds=1), moment, moment + timedelta(hours=1)]
    ledgers = [open_ledger(settings) for _ in range(2)]
    workers = [build_ingest_worker(settings, ledger) for ledger in ledgers]
    stop = threading.Event()
    runners = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for runner in runners:
        runner.start()
    try:
        before = [_at(f"u{n}", straddle[n % 3], f"c{n % 7}") for n in range(300)]
        produce_records(settings, before)
        wait_for(lambda: sum(w.stats.records for w in workers) >= 30, what="some records")
        prices = PriceList.from_toml(price_file(tmp_path, "0.002").read_text())
        assert ingest_ledger.publish_prices(prices, moment).number == 2
        after = [_at(f"u{n}", straddle[n % 3], f"c{n % 7}") for n in range(300, 600)]
        produce_records(settings, after)
        ids = [transaction_id(r.customer_id, r.usage_id) for r in [*before, *after]]
        wait_for(lambda: len(ingest_ledger.latest_versions(ids)) == 600, what="every record")
    finally:
        stop.set()
        for runner in runners:
            runner.join(30)
        for worker, ledger in zip(workers, ledgers, strict=True):
            close_worker(worker)
            ledger.close()

    published_at: dict[int, int] = {}  # version -> its Published event's place in the log
    recorded: dict[str, tuple[int, int, Decimal]] = {}  # usage id -> place, version, amount
    for place, event in enumerate(ingest_ledger.all_events()):
        if isinstance(event, PriceBook.Published):
            published_at[event.number] = place
        elif isinstance(event, BillingTransaction.Metered):
            recorded[event.usage_id] = (place, event.price_version, event.amount)
    assert len(recorded) == 600
    new_price = {1: Decimal(100), 2: Decimal(200)}  # 1,000 at 0.001 or 0.002 USD, in cents
    for record in [*before, *after]:
        place, version, amount = recorded[record.usage_id]
        assert published_at[version] < place, record  # published before it was recorded
        assert amount == new_price[version], record
        in_force = 2 if record.occurred_at >= moment else 1
        if record in after:
            assert version == in_force, record
        else:
            assert version in {1, in_force}, record
    assert audit_findings(settings, ingest_ledger) == []


def _edit_history(
    settings: Settings, originator: UUID, version: int, path: str, value: str
) -> None:
    """One stored event's field set to ``value`` (JSON) behind the ledger's back."""
    with psycopg.connect(settings.database_url) as conn:  # history edited, trigger off
        conn.execute("ALTER TABLE billingledger_events DISABLE TRIGGER events_append_only")
        conn.execute(
            "UPDATE billingledger_events SET state = convert_to(jsonb_set("
            "convert_from(state, 'UTF8')::jsonb, %s, %s::jsonb)::text, 'UTF8')"
            " WHERE originator_id = %s AND originator_version = %s",
            (path, value, originator, version),
        )
        conn.execute("ALTER TABLE billingledger_events ENABLE TRIGGER events_append_only")


def test_the_audit_finds_a_version_or_a_price_edited_in_the_database(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    ledger = ingest_ledger
    ledger.publish_prices(
        PriceList.from_toml(price_file(tmp_path, "0.002").read_text()), NEW_PRICE_AT
    )
    ledger.record_usage(
        [
            Metering(_at("old", NEW_PRICE_AT - timedelta(days=1)), Source("usage", 0, 1)),
            Metering(_at("new", NEW_PRICE_AT), Source("usage", 0, 2)),
        ]
    )
    assert audit_findings(settings, ledger) == []
    old, new = (transaction_id("acme", u) for u in ("old", "new"))

    _edit_history(settings, new, 1, "{price_version}", "1")
    found = audit_findings(settings, ledger)
    book = PRICE_BOOK_ID
    assert (
        f"price {new}: amount 2.00 USD, but price book {book} version 1 prices 1000 of"
        " 'api.requests' at 1.00 USD"
    ) in found
    assert f"chain {new} v1: content does not match its hash (edited)" in found

    _edit_history(settings, new, 1, "{price_version}", "2")  # put back: chain whole again
    # Version 2 is the book's third event (Opened, then version 1's Published).
    _edit_history(settings, PRICE_BOOK_ID, 3, '{meters,"api.requests",unit_price}', '"0.003"')
    found = audit_findings(settings, ledger)
    assert (
        f"price {new}: amount 2.00 USD, but price book {book} version 2 prices 1000 of"
        " 'api.requests' at 3.00 USD"
    ) in found
    assert not any(f.startswith(f"price {old}") for f in found), found
    assert f"chain {book} v3: content does not match its hash (edited)" in found


def test_a_meter_that_changes_currency_is_removed_and_comes_back_free_audits_clean(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    """Version 2 prices api.requests in EUR, version 3 removes it, version 4 brings it
    back at 0: its usage of one period goes to one line per currency (never a sum
    across currencies), a record after the removal is set aside with its reason and
    priced once a version has its meter again, and the audit finds nothing."""
    ledger = ingest_ledger
    usd = ledger.refresh_prices().latest.prices
    eur = replace(usd, prices={**usd.prices, "api.requests": Price(Decimal("0.001"), "EUR")})
    gone = replace(usd, prices={k: v for k, v in usd.prices.items() if k != "api.requests"})
    free = replace(usd, prices={**usd.prices, "api.requests": Price(Decimal(0), "USD")})
    hour = timedelta(hours=1)
    ledger.publish_prices(eur, NEW_PRICE_AT)
    ledger.publish_prices(gone, NEW_PRICE_AT + 2 * hour)
    batch = [
        Metering(_at(f"r{n}", NEW_PRICE_AT + (n - 1) * hour), Source("usage", 0, n))
        for n in range(4)
    ]  # one before version 2, two in it, one after version 3
    decided = ledger.record_usage(batch)
    assert [(m.record.usage_id, why) for m, why in decided.rejected] == [
        ("r3", "unknown meter 'api.requests'")
    ]
    assert sorted((t.fields["currency"], t.amount) for t in decided.transactions) == [
        ("EUR", Decimal(100)), ("EUR", Decimal(100)), ("USD", Decimal(100)),
    ]  # fmt: skip
    lines = {(line.currency, line.meter): line.exact_total for line in decided.lines}
    assert lines == {("USD", "api.requests"): Decimal(100), ("EUR", "api.requests"): 200}

    ledger.publish_prices(free, NEW_PRICE_AT + 2 * hour)  # the fix, for the same moment
    redriven = ledger.record_usage([batch[3]])
    assert redriven.rejected == []
    [txn] = redriven.transactions
    assert (txn.fields["price_version"], txn.fields["currency"], txn.amount) == (4, "USD", 0)
    assert audit_findings(settings, ledger) == []


def test_a_per_beyond_64_bits_is_audited_as_it_was_published(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    """A price per 10^23 units (no 64-bit integer holds it): stored as the library writes
    it, and read back by the audit as the same whole number, not a float."""
    ledger = ingest_ledger
    usd = ledger.refresh_prices().latest.prices
    huge = Price(Decimal(10) ** 21, "USD", 10**23)  # 0.01 USD a unit: 1 cent
    ledger.publish_prices(replace(usd, prices={**usd.prices, "api.requests": huge}), EPOCH)
    decided = ledger.record_usage([Metering(_at("huge-per", NEW_PRICE_AT), Source("usage", 0, 1))])
    assert [t.amount for t in decided.transactions] == [Decimal(1000)]
    assert audit_findings(settings, ledger) == []
    exported = export_events(Database(settings.database_url), "acme")
    [metered] = [e for e in exported if e["event"].endswith("Metered")]
    assert metered["data"]["per"] == 10**23


def test_the_audit_finds_a_transaction_naming_a_version_published_after_it(
    settings: Settings, ingest_ledger: BillingLedger, tmp_path: Path
) -> None:
    """A Metered that names version 2 before version 2 was published (what no worker
    does: it prices only by versions it has read), its chain whole."""
    ledger = ingest_ledger
    prices = PriceList.from_toml(price_file(tmp_path, "0.002").read_text())
    ahead = PriceBook.of(ledger.refresh_prices())
    ahead.publish(prices, NEW_PRICE_AT)  # the book as it will be, not as it is
    txn = BillingTransaction.from_usage(
        _at("ahead", NEW_PRICE_AT), ahead.schedule, Source("usage", 0, 1)
    )
    assert txn.price_version == 2
    ledger.save(txn)
    ledger.record_usage([Metering(_at("in-time", NEW_PRICE_AT), Source("usage", 0, 2))])
    ledger.publish_prices(prices, NEW_PRICE_AT)
    ledger.record_usage([Metering(_at("after", NEW_PRICE_AT), Source("usage", 0, 3))])
    assert [
        ledger.transaction(transaction_id("acme", u)).price_version for u in ("in-time", "after")
    ] == [1, 2]
    assert [f for f in audit_findings(settings, ledger) if f.startswith("price ")] == [
        f"price {txn.id}: priced by price book {PRICE_BOOK_ID} version 2, published after it"
        " was recorded"
    ]
