"""Fixtures for the charging drills: a ledger with reserved transactions and a Stripe emulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.ledger import BillingLedger
from adapters.runtime import open_ledger, prepare
from adapters.settings import Settings
from infra.stripe_emulator import StripeEmulator


@pytest.fixture
def charge_settings(settings: Settings, emulator: StripeEmulator) -> Settings:
    return settings.model_copy(
        update={
            "stripe_api_base": emulator.url,
            "stale_after_s": 0.2,
            "retry_base_s": 0.05,
            "retry_max_delay_s": 0.2,
            "stripe_timeout_s": 3.0,
            "breaker_reset_s": 0.5,
        }
    )


@pytest.fixture
def ledger(charge_settings: Settings) -> Iterator[BillingLedger]:
    prepare(charge_settings)
    with open_ledger(charge_settings) as app:
        yield app
