"""Fixtures of the integration tests that use Stripe (the emulator is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.bootstrap import migrate, open_ledger
from adapters.settings import Settings
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger


@pytest.fixture
def stripe_settings(settings: Settings, emulator: StripeEmulator) -> Settings:
    return settings.model_copy(
        update={"stripe_api_base": emulator.url, "stripe_timeout_s": 3.0, "retry_base_s": 30.0}
    )


@pytest.fixture
def ledger(stripe_settings: Settings) -> Iterator[BillingLedger]:
    migrate(stripe_settings)
    with open_ledger(stripe_settings) as app:
        yield app
