"""The incident's model (``tools.incident_model``): retries without backoff against a
rate-limited Stripe. Steady before the outage; requests explode during it; past the
tipping point the backlog never drains; a blip short of that point recovers."""

from __future__ import annotations

from tools.incident_model import IncidentModel

MODEL = IncidentModel(demand_per_s=16.0, records_per_call=12.5, limit_per_s=25.0)


def _at(points: list[tuple[float, float]], t: float) -> float:
    return next(v for at, v in points if at >= t)


def test_before_the_outage_the_model_sends_what_is_needed_and_holds_a_steady_backlog() -> None:
    run = MODEL.run(until_s=10.0, outage=(20.0, 30.0), load_end_s=40.0)
    assert {round(v, 6) for _, v in run.requests_per_s} == {16.0}
    assert {round(v, 6) for _, v in run.backlog} == {16.0 * 0.25 * 12.5}


def test_requests_explode_during_the_outage_and_the_backlog_never_drains_after_it() -> None:
    run = MODEL.run(until_s=60.0, outage=(10.0, 20.0), load_end_s=40.0)
    assert _at(run.requests_per_s, 19.9) > 20 * MODEL.limit_per_s
    after = [v for t, v in run.backlog if t >= 20.0]
    assert all(later >= after[0] * 0.9 for later in after)  # still there at the end
    assert _at(run.backlog, 40.0) > _at(run.backlog, 20.0)  # and grew while the load lasted


def test_a_blip_short_of_the_tipping_point_recovers() -> None:
    run = MODEL.run(until_s=30.0, outage=(10.0, 10.2), load_end_s=40.0)
    assert _at(run.backlog, 10.3) > _at(run.backlog, 5.0)
    assert round(_at(run.backlog, 29.0), 6) == round(_at(run.backlog, 5.0), 6)
    assert round(_at(run.requests_per_s, 29.0), 6) == MODEL.demand_per_s


def test_past_the_limit_fewer_calls_complete_the_more_are_sent() -> None:
    assert MODEL.goodput(20.0) == 20.0
    assert MODEL.goodput(25.0) == 25.0
    assert MODEL.goodput(50.0) == 12.5 > MODEL.goodput(100.0) == 6.25
