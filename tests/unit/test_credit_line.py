"""The invoice's credit line: minus the credit, rounded once per usage line, never more
than the usage it pays for; and the usage lines it names are on its invoice."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from decimal import Decimal
from uuid import uuid4

import pytest

from domain.credit_line import CREDIT_METER, CreditLine
from domain.errors import IllegalTransition
from domain.invoice_line import InvoiceLine
from domain.money import round_minor
from domain.periods import PeriodPolicy

PERIOD = PeriodPolicy().period_of(datetime(2026, 12, 1, tzinfo=UTC))


def test_the_credit_is_rounded_once_per_usage_line_half_up() -> None:
    line = CreditLine.open_for("acme", "USD", PERIOD)
    a, b, c = uuid4(), uuid4(), uuid4()
    line.apply([(uuid4(), a, Decimal("0.25")), (uuid4(), a, Decimal("0.25"))])  # a: 0.5 -> 1
    line.apply([(uuid4(), b, Decimal("0.5")), (uuid4(), c, Decimal("0.4"))])  # 1, and 0
    # Not round(1.4) = 1: each usage line's credit is rounded as that line is.
    assert (line.billed, line.exact_total, line.transactions) == (-2, Decimal("-1.4"), 4)
    assert (
        line.meter == CREDIT_METER
        and line.invoice_id == InvoiceLine.open("acme", "USD", "api.requests", PERIOD).invoice_id
    )


def test_the_credit_never_exceeds_the_usage_it_pays_for() -> None:
    """Each usage line's credit is at most its exact total: then the rounded credit is at
    most the line's billed total, whatever the fractions (random usage, seeded)."""
    rng = random.Random(7)
    for _ in range(200):
        usage_lines = [uuid4() for _ in range(rng.randint(1, 6))]
        credit = CreditLine.open_for("acme", "USD", PERIOD)
        billed = 0
        for line in usage_lines:
            amounts = [Decimal(rng.randint(0, 300)) / 1000 for _ in range(rng.randint(1, 3))]
            taken = [a * Decimal(rng.randint(0, 100)) / 100 for a in amounts]
            billed += round_minor(sum(amounts, Decimal(0)))
            credit.apply([(uuid4(), line, t) for t in taken])
        assert 0 <= -credit.billed <= billed


def test_a_credit_line_takes_no_usage_and_no_credit_once_frozen() -> None:
    line = CreditLine.open_for("acme", "USD", PERIOD)
    with pytest.raises(IllegalTransition):
        line.settle([(uuid4(), Decimal(1))])
    line.freeze()
    with pytest.raises(IllegalTransition, match="frozen"):
        line.apply([(uuid4(), uuid4(), Decimal(1))])
    line.apply([(uuid4(), uuid4(), Decimal(0))])  # nothing to apply: nothing recorded
    assert line.billed == 0
