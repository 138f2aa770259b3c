"""The control API over HTTP and the command line."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator, main
from infra.stripe_emulator.cli import build_parser

from .support import (
    API_KEY,
    http,
    new_customer,
    open_invoice,
)

pytestmark = pytest.mark.integration


def test_control_api_faults_reset_and_health(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    status, _, health = http(emulator, "GET", "/_emulator/health")
    assert (status, health["ok"]) == (200, True)

    status, _, faults = http(emulator, "POST", "/_emulator/faults", {"latency_ms": 5})
    assert (status, faults["latency_ms"], faults["error_rate"]) == (200, 5.0, 0.0)
    status, _, error = http(emulator, "POST", "/_emulator/faults", {"error_rate": 2})
    assert status == 400 and "error_rate" in error["error"]["message"]
    status, _, error = http(emulator, "POST", "/_emulator/faults", {"no_such_fault": 1})
    assert status == 400
    assert emulator.faults()["latency_ms"] == 5.0  # rejected updates change nothing

    customer = new_customer(client)
    status, _, ledger = http(emulator, "GET", "/_emulator/ledger")
    assert [(e["method"], e["path"], e["object_id"]) for e in ledger] == [
        ("POST", "/v1/customers", customer.id)
    ]
    status, _, requests = http(emulator, "GET", "/_emulator/requests")
    assert [(r["path"], r["status"]) for r in requests] == [("/v1/customers", 200)]

    status, _, _ = http(emulator, "POST", "/_emulator/reset")
    assert status == 200
    assert emulator.faults()["latency_ms"] == 0.0
    assert emulator.ledger() == [] and emulator.requests() == []
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.customers.retrieve(customer.id)


def test_cli_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--error-rate", "2"])
    assert info.value.code == 2
    assert "error_rate must be between 0 and 1" in capsys.readouterr().err


def test_cli_serves_until_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.stripe_emulator", "--port", "0", "--latency-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.strip().rsplit(" ", 1)[-1]
        sdk = stripe.StripeClient(API_KEY, base_addresses={"api": url}, max_network_retries=0)
        assert sdk.v1.customers.create(params={"name": "cli"}).id.startswith("cus_")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_control_api_views_of_invoices_credit_notes_and_card_switch(
    emulator: StripeEmulator, client: stripe.StripeClient
) -> None:
    invoice = open_invoice(client, 300)
    client.v1.credit_notes.create(params={"invoice": invoice.id, "amount": 100})
    customer_id = str(invoice.customer)

    status, _, invoices = http(emulator, "GET", f"/_emulator/invoices?customer={customer_id}")
    assert (status, [(i["id"], i["amount_due"]) for i in invoices]) == (200, [(invoice.id, 200)])
    _, _, notes = http(emulator, "GET", f"/_emulator/credit_notes?invoice={invoice.id}")
    assert [n["amount"] for n in notes] == [100]

    path = f"/_emulator/customers/{customer_id}/card_declined"
    assert http(emulator, "POST", path, {"declined": True})[0] == 200
    with pytest.raises(stripe.CardError):
        client.v1.invoices.pay(invoice.id)
    assert http(emulator, "POST", path, {"declined": False})[0] == 200
    assert client.v1.invoices.pay(invoice.id).status == "paid"
    assert http(emulator, "POST", path, {"declined": "yes"})[0] == 400
    assert http(emulator, "POST", "/_emulator/customers/cus_nobody/card_declined")[0] == 404

    emulator.reset()
    assert emulator.invoices() == [] and emulator.credit_notes() == [] and emulator.events() == []


def test_cli_takes_the_new_settings_and_rejects_bad_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(
        ["--endpoint-rate-limit-per-s", "25", "--payment-failures", "2", "--webhook-reorder", "3"]
    )
    assert (args.endpoint_rate_limit_per_s, args.payment_failures, args.webhook_reorder) == (
        25,
        2,
        3,
    )
    for flags, message in [
        (["--webhook-max-attempts", "0"], "webhook_max_attempts must be >= 1"),
        (["--endpoint-rate-limit-per-s", "1.5"], "not an integer"),
        (["--webhook-duplicate-probability", "2"], "between 0 and 1"),
    ]:
        with pytest.raises(SystemExit) as info:
            main(flags)
        assert info.value.code == 2
        assert message in capsys.readouterr().err
