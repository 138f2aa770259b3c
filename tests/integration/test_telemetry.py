"""The exporters configured by settings, in real processes: console spans reach stdout
and are flushed on SIGTERM; OTLP spans reach an HTTP collector; a bad value is one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import psycopg
import pytest
from psycopg import sql

from adapters.bootstrap import migrate, open_ledger, prepare
from adapters.observability import telemetry
from adapters.settings import Settings
from store.schema import EVENTS_TABLE as EVENTS
from tests.conftest import settings_env
from tests.drills.support import reserve
from tests.integration.support import wait_for

pytestmark = pytest.mark.integration


def _relayed_everything(settings: Settings) -> bool:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT (SELECT max(notification_id) FROM {})"
                " <= (SELECT notification_id FROM billing.relay_position"
                " WHERE name = 'billing.events')"
            ).format(sql.Identifier(EVENTS))
        ).fetchone()
    return bool(row and row[0])


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The console exporter's output: indented JSON objects one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        obj, at = decoder.raw_decode(text, at)
        found.append(obj)
    return found


def test_run_with_the_console_exporter_writes_the_spans_to_stdout_and_flushes_them_on_sigterm(
    settings: Settings,
) -> None:
    migrate(settings)
    prepare(settings)
    with open_ledger(settings) as ledger:
        ids = reserve(ledger, 2)
    env = settings_env(settings) | {"BILLING_LEDGER_TRACE_EXPORTER": "console"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.cli", "run", "--role", "relay"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _relayed_everything(settings), what="the relay to publish everything")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]

    spans = [s for s in _json_objects(out) if s.get("name") == "relay publish"]
    published = {
        s["attributes"]["billing.transaction_id"]: s
        for s in spans
        if s["attributes"].get("billing.event") == "Reserved"
    }
    assert set(published) == {str(i) for i in ids}
    for txn_id in ids:
        span = published[str(txn_id)]
        assert span["context"]["trace_id"] == f"0x{txn_id.hex}"
        assert span["resource"]["attributes"]["service.name"] == "billing-ledger"


def test_an_unknown_trace_exporter_stops_run_with_one_line_naming_the_setting() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "run"],
        env={"BILLING_LEDGER_TRACE_EXPORTER": "jaeger", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2  # a bad setting is misuse
    assert proc.stderr == (
        "billing-ledger: error: setting BILLING_LEDGER_TRACE_EXPORTER: "
        "Input should be 'none', 'console' or 'otlp'\n"
    )


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    received: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1/traces", received
    server.shutdown()
    server.server_close()


def test_the_otlp_exporter_posts_the_spans_to_the_configured_endpoint(
    collector: tuple[str, list[tuple[str, str, bytes]]],
) -> None:
    endpoint, received = collector
    provider = telemetry.tracer_provider(Settings(trace_exporter="otlp", otlp_endpoint=endpoint))
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span(
        "stripe charge", attributes={telemetry.TRANSACTION_ID: "txn-otlp"}
    ):
        pass
    provider.shutdown()

    ((path, content_type, body),) = received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert b"stripe charge" in body and b"txn-otlp" in body and b"billing-ledger" in body
