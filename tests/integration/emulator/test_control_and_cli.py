"""The control API over HTTP and the command line."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator, main

from .support import (
    API_KEY,
    http,
    new_customer,
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
