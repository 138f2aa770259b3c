"""The minimum commitments' true-up in ``billing.invoice_preview`` (migration 13), against a
real PostgreSQL and the Stripe emulator: the view, the CLI preview and the invoice the
close then finalizes (Stripe's total read back through the SDK) agree for a contract
customer with meter and invoice minimums beside a list-price customer and a customer above
its minimum; the view's true-up is ``domain.closing.true_ups`` over many generated
invoices; and the contract versions set before migration 13 are in its read model."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from adapters.bootstrap import build_closer, build_projector, build_pusher, open_ledger
from adapters.settings import Settings
from adapters.stripe.client import StripeGateway
from domain.closing import TRUE_UP_METER, TRUE_UP_PREFIX, true_ups
from domain.contract import ContractSchedule, ContractVersion, check_terms
from domain.credit_line import CREDIT_METER
from domain.price_book import EPOCH
from infra.stripe_emulator import StripeEmulator
from projections.invoices import invoice_preview
from projections.projector import PROJECTIONS, Projector, rebuild
from store.connections import Database
from store.ledger import BillingLedger
from store.migrations.runner import migrate as run_migrations
from store.migrations.status import migrations
from store.roles import READER
from tests.integration.roles import as_role
from tests.integration.support import finalize, line_of, record, run_cli

pytestmark = pytest.mark.integration

METER_TRUE_UP = f"{TRUE_UP_PREFIX}api.requests"


@pytest.fixture
def day_ledger(stripe_settings: Settings, ledger: BillingLedger) -> Iterator[Settings]:
    settings = stripe_settings.model_copy(update={"billing_period": "day", "invoice_grace_s": 0.0})
    ledger.periods = settings.periods()
    yield settings


def _project(settings: Settings, ledger: BillingLedger) -> None:
    with build_projector(settings, ledger) as projector:
        projector.pump_all()


def _view(settings: Settings, customer: str) -> list[dict[str, Any]]:
    with psycopg.connect(settings.database_url) as conn:
        return invoice_preview(conn, customer=customer)


def _lines(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["meter"], r["billed"]) for r in rows]


def test_the_view_the_cli_and_the_finalized_invoice_agree_on_true_ups_beside_list_prices(
    day_ledger: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    settings = day_ledger
    listed = ledger.refresh_prices().latest.prices
    minimums = {"USD": "25.00", "meters": {"api.requests": "12.00", "gpt-4o.input_tokens": "1.00"}}
    discount = {"api.requests": {"discount": "10"}}
    ledger.set_contract("acme", check_terms(discount, minimums, listed), EPOCH)
    # In force only after the period ends: its lower minimum does not apply to it.
    later = datetime(2026, 12, 2, tzinfo=UTC)
    ledger.set_contract("acme", check_terms({}, {"USD": "1.00"}, listed), later)
    ledger.set_contract("gamma", check_terms({}, {"USD": "1.00"}, listed), EPOCH)
    acme = record(ledger, "acme", ["m-1", "m-2"], qty=5000)  # 4.50 + 4.5009 USD: 9.00
    beta = record(ledger, "beta", ["b-1"], qty=2500)  # no contract: 2.50 USD
    gamma = record(ledger, "gamma", ["g-1"], qty=5000)  # 5.00 USD, above its 1.00
    _project(settings, ledger)

    view = _view(settings, "acme")
    assert _lines(view) == [
        ("api.requests", 900),
        (METER_TRUE_UP, 300),  # 12.00 less 9.00
        (f"{TRUE_UP_PREFIX}gpt-4o.input_tokens", 100),  # no usage of it at all
        (TRUE_UP_METER, 1200),  # 25.00 less 9.00, 3.00 and 1.00
    ]
    assert {(r["invoice_total"], r["invoice_lines"]) for r in view} == {(2500, 4)}
    true_up = view[1]
    assert (true_up["transactions"], true_up["exact_total"], true_up["late"]) == (0, 300, False)
    assert (true_up["model"], true_up["quantity"], true_up["tier"]) == (None, None, None)
    assert _lines(_view(settings, "beta")) == [("api.requests", 250)]
    assert _lines(_view(settings, "gamma")) == [("api.requests", 500)]  # no true-up row

    closer = build_closer(settings, build_pusher(settings, ledger))
    stripe = StripeGateway(settings.stripe()).client
    for customer, txn in (("acme", acme[0]), ("beta", beta[0]), ("gamma", gamma[0])):
        before = _view(settings, customer)
        shown = run_cli(settings, "invoices", "preview", "--customer", customer, "--json")
        assert shown.returncode == 0, shown.stderr
        cli = json.loads(shown.stdout)
        assert [(r["meter"], r["billed"], r["invoice_total"]) for r in cli] == [
            (r["meter"], r["billed"], r["invoice_total"]) for r in before
        ]
        invoice = finalize(closer, ledger, ledger.line_by_id(line_of(ledger, txn)).invoice_id)
        finalized = sorted((ledger.line_by_id(i).meter, ledger.line_by_id(i).billed)
                           for i in invoice.lines)  # fmt: skip
        assert finalized == sorted(_lines(before)), customer
        assert invoice.stripe_invoice_id is not None
        read_back = stripe.v1.invoices.retrieve(invoice.stripe_invoice_id)
        assert read_back.total == invoice.total == before[0]["invoice_total"], customer
    _project(settings, ledger)
    assert _view(settings, "acme") == []  # finalized: no longer previewed


def test_the_cli_preview_of_a_contract_customer_needs_only_the_reader_login(
    day_ledger: Settings, ledger: BillingLedger
) -> None:
    listed = ledger.refresh_prices().latest.prices
    ledger.set_contract("acme", check_terms({}, {"USD": "25.00"}, listed), EPOCH)
    record(ledger, "acme", ["r-1"], qty=5000)
    _project(day_ledger, ledger)
    reader = day_ledger.model_copy(
        update={"database_url": as_role(day_ledger.database_url, READER)}
    )
    shown = run_cli(reader, "invoices", "preview", "--customer", "acme", "--json")
    assert shown.returncode == 0, shown.stderr
    assert _lines(json.loads(shown.stdout)) == [("api.requests", 500), (TRUE_UP_METER, 2000)]


# -- the view's rule against the domain's, over generated invoices -------------------------

_PERIOD = timedelta(days=1)
_METERS = ("api.requests", "gpt-4o.input_tokens", "eu.gpu.h100.seconds")


def _invoice_row(invoice: UUID, customer: str, currency: str, start: datetime) -> dict[str, Any]:
    return {"invoice_id": invoice, "customer_id": customer, "currency": currency,
            "start": start, "end": start + _PERIOD}  # fmt: skip


def _insert_invoice(conn: psycopg.Connection[Any], row: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO billing.invoices (invoice_id, customer_id, currency, period_start,"
        " period_end, state, lines, expected_total, total, amount_paid, credited,"
        " credits_pending, payment_attempts, finalize_attempts, close_deadline, updated_at,"
        " repairs) VALUES (%(invoice_id)s, %(customer_id)s, %(currency)s, %(start)s, %(end)s,"
        " 'open', 1, 0, 0, 0, 0, 0, 0, 0, %(end)s, now(), 0)",
        row,
    )


def _insert_line(
    conn: psycopg.Connection[Any], invoice: dict[str, Any], meter: str, billed: int, late: bool
) -> None:
    conn.execute(
        "INSERT INTO billing.invoice_lines (line_id, customer_id, currency, meter,"
        " period_start, period_end, exact_total, billed, transactions, sequence,"
        " pushed_sequence, stripe_amount, stripe_item_ids, charged_through, push_attempts,"
        " stripe_requests, updated_at, late_of_start)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, 1, 0, 0, '{}', 0, 0, 0, now(), %s)",
        (uuid.uuid4(), invoice["customer_id"], invoice["currency"], meter, invoice["start"],
         invoice["end"], billed, billed, invoice["start"] - _PERIOD if late else None),
    )  # fmt: skip


def _random_version(
    rng: random.Random, customer: str, number: int, start: datetime
) -> ContractVersion:
    # Around the period's end, to the microsecond: before, at and after its last moment.
    offset = rng.choice([-_PERIOD, -timedelta(microseconds=1), timedelta(0), timedelta(hours=-3)])
    whole = {c: rng.randint(0, 3000) for c in rng.sample(["USD", "EUR"], rng.randint(0, 2))}
    per_meter = {
        c: {m: rng.randint(0, 1500) for m in rng.sample(_METERS, rng.randint(1, 3))}
        for c in rng.sample(["USD", "EUR"], rng.randint(0, 2))
    }
    return ContractVersion(customer, number, start + _PERIOD + offset, {}, whole, per_meter)


def test_the_views_true_ups_are_domain_closing_true_ups_over_generated_invoices(
    stripe_settings: Settings, ledger: BillingLedger
) -> None:
    rng = random.Random(27)
    start = datetime(2026, 11, 3, tzinfo=UTC)
    expected: dict[UUID, dict[str, int]] = {}
    with psycopg.connect(stripe_settings.database_url) as conn:
        for n in range(150):
            customer = f"gen-{n}"
            currency = rng.choice(["USD", "EUR"])
            invoice = _invoice_row(uuid.uuid4(), customer, currency, start)
            _insert_invoice(conn, invoice)
            billed: dict[str, int] = {}
            for meter in rng.sample(_METERS, rng.randint(1, 3)):
                amount = rng.randint(0, 1200)
                billed[meter] = billed.get(meter, 0) + amount
                _insert_line(conn, invoice, meter, amount, late=False)
                if rng.random() < 0.2:  # late usage of the meter counts toward it too
                    _insert_line(conn, invoice, meter, 40, late=True)
                    billed[meter] += 40
            if rng.random() < 0.3:  # prepaid credit pays the invoice: not usage
                _insert_line(conn, invoice, CREDIT_METER, -rng.randint(1, 500), late=False)
            versions = [_random_version(rng, customer, v, start) for v in range(1, 4)]
            versions = versions[: rng.randint(0, 3)]
            for v in versions:
                conn.execute(
                    "INSERT INTO billing.contract_versions VALUES"
                    " (%s, %s, %s, %s, %s, %s, now())",
                    (customer, uuid.uuid4(), v.number, v.effective_from,
                     psycopg.types.json.Jsonb(v.minimums),
                     psycopg.types.json.Jsonb(v.meter_minimums)),
                )  # fmt: skip
            schedule = ContractSchedule(customer, versions) if versions else None
            expected[invoice["invoice_id"]] = true_ups(schedule, invoice["end"], currency, billed)
        rows = conn.execute(
            "SELECT invoice_id, meter, billed, invoice_total, invoice_lines,"
            " sum(billed) OVER (PARTITION BY invoice_id), count(*) OVER (PARTITION BY invoice_id)"
            " FROM billing.invoice_preview WHERE customer_id LIKE 'gen-%'"
        ).fetchall()
        conn.rollback()
    got: dict[UUID, dict[str, int]] = {i: {} for i in expected}
    for invoice_id, meter, billed, total, count, summed, counted in rows:
        assert (total, count) == (summed, counted)
        if meter == TRUE_UP_METER or meter.startswith(TRUE_UP_PREFIX):
            got[invoice_id][meter] = billed
    assert got == expected
    assert sum(map(bool, expected.values())) > 50  # most invoices owe some true-up...
    assert sum(not owed for owed in expected.values()) > 20  # ...and many none


# -- migration 13 on a ledger with contracts ---------------------------------------------


def test_contract_versions_set_before_migration_13_are_in_its_read_model(
    stripe_settings: Settings,
) -> None:
    url = stripe_settings.database_url
    known = migrations()
    with psycopg.connect(url, autocommit=True) as conn:
        run_migrations(conn, [m for m in known if m.number < 13])
    # The read models of migrations 1 to 12 (13 adds the contract versions', 14 the
    # purchases').
    older = [p for p in PROJECTIONS if p.name not in ("contract_versions", "credit_purchases")]
    with open_ledger(stripe_settings) as ledger:
        listed = ledger.refresh_prices().latest.prices
        terms = check_terms({}, {"USD": "25.00", "meters": {"api.requests": "1.00"}}, listed)
        ledger.set_contract("acme", terms, EPOCH)
        ledger.set_contract("acme", check_terms({}, {"EUR": "3.00"}, listed), EPOCH + _PERIOD)
        record(ledger, "acme", ["before"], qty=5000)
        with Projector(Database(url), ledger.mapper.to_domain_event, projections=older) as p:
            p.pump_all()
        ledger.set_contract("beta", terms, EPOCH)  # after the projections' position

        with psycopg.connect(url, autocommit=True) as conn:
            assert 13 in [m.number for m in run_migrations(conn, known)]
            backfilled = conn.execute(
                "SELECT customer_id, version FROM billing.contract_versions ORDER BY 1, 2"
            ).fetchall()
            behind = conn.execute(
                "SELECT count(*) FROM billingledger_events e, billing.projection_positions p"
                " WHERE p.name = 'contract_versions' AND (e.xid, e.notification_id) >"
                " (p.xid, p.notification_id)"
            ).fetchone()
        assert backfilled == [("acme", 1), ("acme", 2)]
        assert behind is not None and behind[0] > 0  # beta's, for the projector
        with Projector(Database(url), ledger.mapper.to_domain_event) as projector:
            projector.pump_all()
        with psycopg.connect(url) as conn:
            live = conn.execute(
                "SELECT * FROM billing.contract_versions ORDER BY customer_id, version"
            ).fetchall()
        assert [(r[0], r[2]) for r in live] == [("acme", 1), ("acme", 2), ("beta", 1)]
        rebuild(Database(url), "contract_versions", ledger.mapper.to_domain_event, batch=3)
        with psycopg.connect(url) as conn:
            rebuilt = conn.execute(
                "SELECT * FROM billing.contract_versions ORDER BY customer_id, version"
            ).fetchall()
        assert rebuilt == live  # the migration's rows are the projector's, to the column
