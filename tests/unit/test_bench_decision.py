"""``python -m tools.bench_decision``: each kind of account decides what its name says
(the figures themselves are never asserted)."""

from __future__ import annotations

import subprocess
import sys

from domain.account import CustomerAccount, consumption
from domain.credit_line import CreditLine
from tools.bench_decision import _Decider, run_decision


def _event_names(kind: str) -> set[str]:
    """The events one batch records, by name; "credit line" when it moves one,
    "watched" when its reservations move the alerts' period spend, and "burnt" when
    they consumed credit (``consumption``: on the reservation or its own event)."""
    decider = _Decider(kind, customers=3, batches=1)
    touched = decider._decide(decider.batches[0])
    events = [e for a in touched for e in a.collect_events()]
    names = {type(e).__name__ for e in events}
    if any(isinstance(a, CreditLine) for a in touched):
        names.add("credit line")
    if any(getattr(e, "alert_period", None) for e in events):
        names.add("watched")
    if [taken for e in events for taken in consumption(e)]:
        names.add("burnt")
    return names


def test_each_kind_burns_credit_and_checks_alerts_as_named(carried: bool) -> None:
    none, grant = _event_names("none"), _event_names("grant")
    alerts, credits = _event_names("alerts"), _event_names("credits")
    assert "AmountsReserved" in none and not none & {"burnt", "watched"}
    assert {"burnt", "credit line"} <= grant and "watched" not in grant
    assert "watched" in alerts and "burnt" not in alerts
    assert {"burnt", "credit line", "watched"} <= credits
    # The period's spend moves with the reservation: no event of its own in a quiet
    # batch; nor has the usual batch's credit, where the reservation carries it.
    assert "AlertPeriodSpent" not in alerts | credits
    assert ("CreditsConsumed" in grant & credits) is not carried


def test_a_run_reports_each_kind_against_none() -> None:
    result = run_decision(("none", "credits"), customers=3, batches=1, repeat=1)
    assert set(result["us_per_record"]) == {"none", "credits"}
    assert set(result["more_than_none"]) == {"credits"}


def test_the_accounts_are_as_the_first_batch_left_them() -> None:
    decider = _Decider("grant", customers=3, batches=1)
    account = decider.accounts[("c0", "USD")]
    assert isinstance(account, CustomerAccount) and account.reserved > 0
    assert not account.pending_events  # stored, as the ingest's reads hand them out


def test_the_command_prints_each_kind() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench_decision", "--kinds", "none", "grant",
         "--customers", "3", "--batches", "1", "--repeat", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "none" in proc.stdout and "grant" in proc.stdout and "µs a record" in proc.stdout
