"""``domain.health``: the invoice-line figures, the boundaries of each threshold, and the
backlog that needs a live worker, pinned with asymmetric figures."""

from __future__ import annotations

import pytest

from domain.health import DEGRADED, FAILING, OK, Thresholds, assess
from tests.unit.test_health_policy import figures, worker


def test_lines_failing_past_the_horizon_make_billing_failing() -> None:
    status, reasons = assess(figures(lines_past_deadline=3))
    assert (status, reasons) == (
        FAILING,
        ["3 invoice line(s) failing to reach Stripe for longer than the retry horizon"],
    )


def test_lines_failing_within_the_horizon_make_billing_degraded() -> None:
    assert assess(figures(lines_failing=2)) == (
        DEGRADED,
        ["2 invoice line(s) failing to reach Stripe"],
    )


@pytest.mark.parametrize(("age", "late"), [(119.0, False), (120.0, False), (120.5, True)])
def test_an_unsent_line_change_is_late_only_past_the_limit(age: float, late: bool) -> None:
    status, reasons = assess(figures(oldest_unsent_age_s=age, lines_unsent=4))
    if late:
        assert (status, reasons) == (
            DEGRADED,
            ["the oldest change Stripe has not seen is 120 s old (4 line(s) waiting)"],
        )
    else:
        assert (status, reasons) == (OK, [])


def test_an_unsent_age_without_a_line_count_says_zero_lines() -> None:
    limits = Thresholds(max_unsent_age_s=10.0)
    assert assess(figures(oldest_unsent_age_s=61.0), limits)[1] == [
        "the oldest change Stripe has not seen is 61 s old (0 line(s) waiting)"
    ]


@pytest.mark.parametrize(
    ("metered", "reserved", "failed"), [(2, 0, 0), (0, 3, 0), (0, 0, 4), (3, 3, 0), (1, 0, 1)]
)
def test_any_unfinished_transaction_without_a_live_worker_is_failing(
    metered: int, reserved: int, failed: int
) -> None:
    quiet = figures(workers_alive=0, workers=[])
    stuck = quiet | {
        "backlog_metered": metered,
        "backlog_reserved": reserved,
        "backlog_charge_failed": failed,
    }
    assert assess(quiet) == (OK, [])
    assert assess(stuck) == (FAILING, ["no live worker while transactions are unfinished"])


@pytest.mark.parametrize(
    ("field", "limit", "reason"),
    [
        ("projector_behind", "max_projector_behind", "projector 7 events behind: these figures"),
        ("max_consumer_lag", "max_consumer_lag", "consumer lag 7"),
    ],
)
def test_a_lag_at_its_limit_is_ok_and_one_above_is_degraded(
    field: str, limit: str, reason: str
) -> None:
    at_limit = Thresholds(**{limit: 7})
    above = Thresholds(**{limit: 6})
    assert assess(figures(**{field: 7}), at_limit) == (OK, [])
    status, reasons = assess(figures(**{field: 7}), above)
    assert (status, len(reasons)) == (DEGRADED, 1)
    assert reasons[0].startswith(reason)


@pytest.mark.parametrize(("age", "hung"), [(300.0, False), (301.0, True)])
def test_a_role_is_hung_only_past_the_loop_age_limit(age: float, hung: bool) -> None:
    busy = worker() | {"stats": {"loop_age_s": {"charge": age, "ingest": 1.0}}}
    status, reasons = assess(figures(workers=[busy]))
    assert reasons == (["worker w1: charge has not gone round for 301 s"] if hung else [])
    assert status == (DEGRADED if hung else OK)


def test_figures_from_before_workers_and_lines_were_reported_are_ok() -> None:
    """Figures of an older projection: no ``workers`` list and no line figures at all."""
    old = figures()
    del old["workers"]
    assert assess(old, Thresholds(max_unsent_age_s=0.5)) == (OK, [])
