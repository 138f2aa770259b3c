"""Fixtures of the emulator tests: an emulator per test, the SDK client, a webhook receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import stripe

from infra.stripe_emulator import StripeEmulator

from .support import Receiver, client_for


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    with StripeEmulator(seed=1) as emu:
        yield emu


@pytest.fixture
def client(emulator: StripeEmulator) -> stripe.StripeClient:
    return client_for(emulator)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver().running() as running:
        yield running
