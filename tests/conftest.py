"""Shared fixtures: a real PostgreSQL and a real Kafka-protocol broker, started here.

* PostgreSQL: ``BILLING_LEDGER_TEST_DATABASE_URL`` (a server URL whose user may create
  databases) when set, otherwise an embedded PostgreSQL started for the session. Each
  test gets a database of its own.
* Kafka: a Tansu broker (memory storage) for the session; each test gets topics and a
  consumer group of its own.
* Traces: ``spans`` records the spans of one test in memory. The tracer provider is
  process-wide and can be set once, so it is installed once per session with a sampler
  that records nothing outside the tests that ask for ``spans``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes
from psycopg import sql

from adapters.settings import Settings, child_env
from infra.embedded import EmbeddedPostgres, TansuBroker
from infra.stripe_emulator import StripeEmulator


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    url = os.environ.get("BILLING_LEDGER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    with EmbeddedPostgres() as pg:
        yield pg.url


@pytest.fixture
def database_url(pg_server_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(pg_server_url, dbname=name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    with TansuBroker() as b:
        yield b


@pytest.fixture
def settings(database_url: str, broker: TansuBroker) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return Settings(
        database_url=database_url,
        kafka_bootstrap=broker.bootstrap,
        usage_topic=f"usage-{tag}",
        dlq_topic=f"usage-{tag}.dlq",
        ingest_group=f"ingest-{tag}",
        events_topic=f"events-{tag}",
        charge_group=f"charge-{tag}",
        alerts_topic=f"alerts-{tag}",
        alert_webhook_group=f"alert-webhooks-{tag}",
        usage_partitions=4,
        batch_max_records=200,
        ingest_processes=1,  # ingest in the run process (its drills kill that one process)
        health_port=0,  # a test that wants the health server picks a free port
        settle_interval_s=10.0,  # the tests' waits were sized for pushes this often
    )


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    """A Stripe emulator on a free loopback port."""
    with StripeEmulator(port=0) as emu:
        yield emu


@pytest.fixture
def charge_settings(settings: Settings, emulator: StripeEmulator) -> Settings:
    """Settings for charging against the emulator, with deadlines short enough to test."""
    return settings.model_copy(
        update={
            "stripe_api_base": emulator.url,
            "stale_after_s": 0.2,
            "retry_base_s": 0.05,
            "retry_max_delay_s": 0.2,
            "stripe_timeout_s": 3.0,
            "stripe_landing_margin_s": 0.5,
            "breaker_reset_s": 0.5,
        }
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a ``billing-ledger`` subprocess needs to use ``settings``."""
    return child_env(settings)


class _Switch(Sampler):
    """Records every span while ``on``, none otherwise."""

    on = False

    def should_sample(  # noqa: PLR0917 (the SDK's signature)
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)  # the span keeps these

    def get_description(self) -> str:
        return "switch"


@pytest.fixture(scope="session")
def _tracing() -> Iterator[tuple[_Switch, InMemorySpanExporter]]:
    switch, memory = _Switch(), InMemorySpanExporter()
    provider = TracerProvider(sampler=switch)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    yield switch, memory
    provider.shutdown()


@pytest.fixture
def spans(_tracing: tuple[_Switch, InMemorySpanExporter]) -> Iterator[InMemorySpanExporter]:
    """The finished spans of this test (``spans.get_finished_spans()``)."""
    switch, memory = _tracing
    memory.clear()
    switch.on = True
    yield memory
    switch.on = False
    memory.clear()
