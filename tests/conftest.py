"""Shared fixtures: a real PostgreSQL and a real Kafka-protocol broker, started here.

* PostgreSQL: ``BILLING_LEDGER_TEST_DATABASE_URL`` (a server URL whose user may create
  databases) when set, otherwise an embedded PostgreSQL started for the session. Each
  test gets a database of its own.
* Kafka: a Tansu broker (memory storage) for the session; each test gets topics and a
  consumer group of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from adapters.settings import Settings
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
        usage_partitions=4,
        batch_max_records=200,
        health_port=0,  # a test that wants the health server picks a free port
    )


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    """A Stripe emulator on a free loopback port."""
    with StripeEmulator(port=0) as emu:
        yield emu


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a ``billing-ledger`` subprocess needs to use ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_LEDGER_")}
    for key, value in settings.model_dump().items():
        env[f"BILLING_LEDGER_{key.upper()}"] = str(value)
    return env
