"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

import domain.account


@pytest.fixture(params=[False, True], ids=["credit-event", "credit-on-reservation"])
def carried(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each way the usual batch's credit can be recorded
    (``domain.account.RESERVATION_CARRIES_CREDIT``): its own ``CreditsConsumed``, as this
    release writes it, or on its reservation, as it reads it; the test runs in both."""
    monkeypatch.setattr(domain.account, "RESERVATION_CARRIES_CREDIT", request.param)
    return bool(request.param)
