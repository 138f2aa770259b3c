"""The health status rules: what makes billing ok, degraded or failing, and why."""

from __future__ import annotations

from typing import Any

from adapters.observability.health_server import render
from adapters.observability.heartbeat import Pulses
from domain.health import DEGRADED, FAILING, OK, Thresholds, assess


def figures(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "backlog_metered": 0,
        "backlog_reserved": 0,
        "backlog_charge_failed": 0,
        "oldest_open_age_s": 0.0,
        "retries_due": 0,
        "retries_overdue": 0,
        "stale_reserved": 0,
        "past_deadline": 0,
        "dead_letters_last_hour": 0,
        "conflicting_duplicates_last_hour": 0,
        "dead_letters_total": 0,
        "stripe_errors_1m": 0,
        "stripe_errors_5m": 0,
        "stripe_errors_15m": 0,
        "stripe_errors_by_class": {},
        "charges_last_minute": 0,
        "max_consumer_lag": 0,
        "workers_alive": 1,
        "workers_silent": 0,
        "breakers_not_closed": 0,
        "projector_behind": 0,
        "workers": [worker()],
        "consumer_lag": [],
    }
    base.update(changes)
    return base


def worker(
    name: str = "w1", *, alive: bool = True, breaker: str | None = "closed"
) -> dict[str, Any]:
    return {
        "worker_id": name,
        "alive": alive,
        "breaker_state": breaker,
        "heartbeat_at": "2026-12-02T10:00:00+00:00",
    }


def test_quiet_figures_are_ok_with_no_reasons() -> None:
    assert assess(figures(backlog_reserved=3, retries_due=2)) == (OK, [])


def test_conflicting_duplicates_are_degraded_beside_the_dead_letters_they_are() -> None:
    status, reasons = assess(
        figures(dead_letters_last_hour=3, conflicting_duplicates_last_hour=2, dead_letters_total=9),
        Thresholds(max_dead_letters_last_hour=0),
    )
    assert (status, reasons) == (
        DEGRADED,
        [
            "3 dead letter(s) in the last hour (more than 0): `billing-ledger dead-letters"
            " list` says why",
            "2 conflicting duplicate(s) in the last hour: a producer sent a usage_id again"
            " with another body",
        ],
    )


def test_dead_letters_of_long_ago_alone_are_ok() -> None:
    assert assess(figures(dead_letters_total=1_000)) == (OK, [])


def test_a_role_waiting_to_restart_is_degraded_and_named_with_its_error() -> None:
    restarting = worker("w1")
    restarting["stats"] = {
        "restarting": {"charge": {"error": "KafkaError: gone", "failures": 2, "restart_in_s": 1.5}},
        "restarts": {"charge": 2},
    }
    assert assess(figures(workers=[restarting])) == (
        DEGRADED,
        ["worker w1: charge failed (KafkaError: gone) and is restarting (failure 2 in the window)"],
    )


def test_roles_restarted_earlier_and_running_again_are_ok() -> None:
    recovered = worker("w1")
    recovered["stats"] = {"restarting": {}, "restarts": {"charge": 2}}
    assert assess(figures(workers=[recovered])) == (OK, [])


def test_an_open_breaker_is_degraded_and_names_the_worker() -> None:
    status, reasons = assess(figures(workers=[worker("w1"), worker("w2", breaker="open")]))
    assert (status, reasons) == (DEGRADED, ["Stripe circuit breaker open in worker w2"])


def test_a_half_open_breaker_is_degraded_but_one_of_a_silent_worker_is_not_counted() -> None:
    status, reasons = assess(
        figures(
            workers=[worker("w1", breaker="half_open"), worker("w2", alive=False, breaker="open")]
        )
    )
    assert status == DEGRADED
    assert reasons == [
        "Stripe circuit breaker half_open in worker w1",
        "worker w2 silent since 2026-12-02T10:00:00+00:00",
    ]


def test_each_late_or_refused_thing_is_a_reason_for_degraded() -> None:
    status, reasons = assess(
        figures(
            retries_overdue=2,
            stale_reserved=5,
            dead_letters_last_hour=1,
            stripe_errors_5m=4,
            stripe_errors_by_class={
                "http_503": {"1m": 1, "5m": 3, "15m": 3},
                "rate_limited": {"1m": 0, "5m": 1, "15m": 1},
                "connection": {"1m": 0, "5m": 0, "15m": 7},
            },
            max_consumer_lag=11,
        ),
        Thresholds(max_consumer_lag=10, max_dead_letters_last_hour=0),
    )
    assert status == DEGRADED
    assert reasons == [
        "2 retry(ies) overdue",
        "5 reserved transaction(s) not charged",
        "1 dead letter(s) in the last hour (more than 0): `billing-ledger dead-letters"
        " list` says why",
        "4 Stripe error(s) in 5 min (http_503: 3, rate_limited: 1)",
        "consumer lag 11",
    ]


def test_dead_letters_degrade_above_a_rate_not_for_one_bad_record() -> None:
    assert assess(figures(dead_letters_last_hour=1)) == (OK, [])
    assert assess(figures(dead_letters_last_hour=60)) == (OK, [])  # the default: 60 an hour
    assert assess(figures(dead_letters_last_hour=61)) == (
        DEGRADED,
        [
            "61 dead letter(s) in the last hour (more than 60): `billing-ledger dead-letters"
            " list` says why"
        ],
    )


def test_lag_and_errors_up_to_their_thresholds_are_ok() -> None:
    limits = Thresholds(max_consumer_lag=10, max_stripe_errors_5m=4)
    assert assess(figures(max_consumer_lag=10, stripe_errors_5m=4), limits) == (OK, [])


def test_past_deadline_is_failing_first_and_keeps_the_other_reasons() -> None:
    status, reasons = assess(
        figures(past_deadline=3, dead_letters_last_hour=2, workers=[worker(breaker="open")]),
        Thresholds(max_dead_letters_last_hour=0),
    )
    assert status == FAILING
    assert reasons == [
        "3 transaction(s) past their deadline",
        "Stripe circuit breaker open in worker w1",
        "2 dead letter(s) in the last hour (more than 0): `billing-ledger dead-letters"
        " list` says why",
    ]


def test_no_live_worker_is_failing_only_when_work_is_waiting() -> None:
    idle = figures(workers_alive=0, workers=[])
    assert assess(idle) == (OK, [])
    status, reasons = assess({**idle, "backlog_charge_failed": 1})
    assert (status, reasons) == (FAILING, ["no live worker while transactions are unfinished"])


def test_the_terminal_table_shows_status_reasons_figures_and_error_classes() -> None:
    report = {
        "status": DEGRADED,
        "reasons": ["1 dead letter(s) in the last hour"],
        **figures(
            dead_letters_last_hour=1,
            oldest_open_age_s=12.345,
            stripe_errors_by_class={"http_503": {"1m": 1, "5m": 2, "15m": 3}},
            consumer_lag=[
                {
                    "group_name": "g",
                    "topic": "usage",
                    "partition": 2,
                    "lag": 7,
                    "committed_offset": 3,
                    "end_offset": 10,
                }
            ],
        ),
    }
    text = render(report)
    lines = text.splitlines()
    assert lines[:2] == ["status: degraded", "  - 1 dead letter(s) in the last hour"]
    assert any(line.split() == ["dead", "letters,", "last", "hour", "1"] for line in lines)
    assert any(line.split() == ["oldest", "unfinished", "(s)", "12.3"] for line in lines)
    assert any(line.split() == ["http_503", "1", "/", "2", "/", "3"] for line in lines)
    assert "  g usage[2]: 7 (committed 3, end 10)" in lines
    assert any(line.startswith("  w1") and "alive" in line for line in lines)


def test_an_unreachable_database_renders_just_the_status_and_reason() -> None:
    report = {"status": FAILING, "reasons": ["database unreachable: OperationalError: refused"]}
    assert render(report) == "status: failing\n  - database unreachable: OperationalError: refused"


def test_a_role_whose_loop_stopped_turning_is_named_but_not_one_at_the_limit() -> None:
    hung = {**worker("w1"), "stats": {"loop_age_s": {"charge": 400.0, "relay": 300.0}}}
    silent = {**worker("w2", alive=False), "stats": {"loop_age_s": {"ingest": 900.0}}}
    status, reasons = assess(figures(workers=[hung, silent]))
    assert (status, reasons) == (
        DEGRADED,
        [
            "worker w1: charge has not gone round for 400 s",
            "worker w2 silent since 2026-12-02T10:00:00+00:00",  # its ages are old news
        ],
    )


def test_pulses_report_how_long_ago_each_role_went_round() -> None:
    now = [100.0]
    pulses = Pulses(clock=lambda: now[0])
    relay, charge = pulses.of("relay"), pulses.of("charge")
    assert pulses.ages() == {}
    relay()
    now[0] = 103.0
    charge()
    now[0] = 110.25
    assert pulses.ages() == {"charge": 7.2, "relay": 10.2}
    relay()
    assert pulses.ages() == {"charge": 7.2, "relay": 0.0}


def test_invoices_past_their_deadline_and_bad_webhook_signatures_degrade_with_their_counts() -> (
    None
):
    base = figures()
    assert assess(base) == (OK, [])
    late = {**base, "invoices_past_deadline": 3}
    assert assess(late) == (
        DEGRADED, ["3 invoice(s) past their close deadline and not finalized"]
    )  # fmt: skip
    forged = {**base, "webhook_signature_failures_1h": 2}
    assert assess(forged) == (DEGRADED, ["2 webhook(s) with a bad signature in the last hour"])
    both = {**late, "webhook_signature_failures_1h": 1}
    assert assess(both)[1] == [
        "3 invoice(s) past their close deadline and not finalized",
        "1 webhook(s) with a bad signature in the last hour",
    ]


def test_invoices_needing_attention_degrade_naming_the_first_and_the_command() -> None:
    base = figures()
    stopped = {
        **base,
        "invoices_needing_attention": 2,
        "invoices_attention": [
            {
                "invoice_id": "inv-1",
                "attention": "Stripe finalized 150 where the ledger expected 100",
            }
        ],
    }
    assert assess(stopped) == (
        DEGRADED,
        [
            "2 invoice(s) need attention (billing-ledger invoices settle); first: inv-1:"
            " Stripe finalized 150 where the ledger expected 100"
        ],
    )
    assert assess({**base, "invoices_needing_attention": 0}) == (OK, [])


def test_purchases_paid_after_their_void_degrade_naming_the_first_and_the_command() -> None:
    base = figures()
    paid = {
        **base,
        "purchases_needing_attention": 3,
        "purchases_attention": [{"purchase_id": "p-1", "reason": "its invoice in_1 was paid"}],
    }
    assert assess(paid) == (
        DEGRADED,
        [
            "3 credit purchase(s) paid after their grant was voided need attention"
            " (billing-ledger credits reinstate); first: p-1: its invoice in_1 was paid"
        ],
    )
    assert assess({**base, "purchases_needing_attention": 0}) == (OK, [])
    assert assess({**base, "purchases_needing_attention": 1})[1] == [
        "1 credit purchase(s) paid after their grant was voided need attention"
        " (billing-ledger credits reinstate); first: None: None"
    ]
