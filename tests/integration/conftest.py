"""Fixtures of the integration tests that use Stripe (the emulator is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.bootstrap import migrate, open_ledger, prepare
from adapters.settings import Settings
from infra.embedded import OWNER
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from store.roles import WRITER
from tests.integration.roles import as_role, owned_database


@pytest.fixture
def stripe_settings(settings: Settings, emulator: StripeEmulator) -> Settings:
    return settings.model_copy(
        update={
            "stripe_api_base": emulator.url,
            "stripe_timeout_s": 3.0,
            "stripe_landing_margin_s": 0.5,
            "retry_base_s": 30.0,
        }
    )


@pytest.fixture
def ledger(stripe_settings: Settings) -> Iterator[BillingLedger]:
    migrate(stripe_settings)
    with open_ledger(stripe_settings) as app:
        yield app


@pytest.fixture
def ingest_ledger(settings: Settings) -> Iterator[BillingLedger]:
    """A ledger on a migrated database with the usage topics made (no Stripe)."""
    migrate(settings)
    prepare(settings)
    with open_ledger(settings) as app:
        yield app


@pytest.fixture
def server(pg_server_url: str) -> Iterator[str]:
    """A database owned by billing_owner (not a superuser); yields the superuser's URL
    of it (for what a test does behind the roles' backs)."""
    with owned_database(pg_server_url) as url:
        yield url


@pytest.fixture
def roles_settings(server: str, settings: Settings, emulator: StripeEmulator) -> Settings:
    """Workers log in as billing_writer; migrate as the owner (no superuser anywhere)."""
    return settings.model_copy(
        update={
            "database_url": as_role(server, WRITER),
            "migrate_database_url": as_role(server, OWNER),
            "stripe_api_base": emulator.url,
            "stripe_timeout_s": 3.0,
            "stripe_landing_margin_s": 0.5,
            "retry_base_s": 30.0,
        }
    )
