"""Fixtures for the charging drills: a ledger with reserved transactions and a Stripe emulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adapters.bootstrap import migrate, open_ledger, prepare
from adapters.settings import Settings
from store.ledger import BillingLedger


@pytest.fixture
def ledger(charge_settings: Settings) -> Iterator[BillingLedger]:
    migrate(charge_settings)
    prepare(charge_settings)
    with open_ledger(charge_settings) as app:
        yield app
