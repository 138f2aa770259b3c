"""A pipeline run's timeline (``tools.timeline``): the series ``--plot`` draws, made
from what the benchmark recorded, in seconds from the start of the load."""

from __future__ import annotations

from tools.timeline import Timeline, latency_series, rate_series

STARTED = 1_700_000_000.0


def test_requests_are_counted_in_the_second_they_were_made_and_quiet_seconds_are_zero() -> None:
    assert rate_series([0.1, 0.9, 2.5, 2.6, 2.7, 9.0], end=3.2) == [
        (1.0, 2.0),
        (2.0, 0.0),
        (3.0, 3.0),
        (4.0, 0.0),
    ]


def test_latency_is_the_p50_and_p99_of_each_window_and_an_empty_window_has_no_point() -> None:
    charges = [(0.5, 1.0), (1.0, 3.0), (1.5, 2.0), (6.5, 9.0)]
    assert latency_series(charges, end=8.0, window=2.0) == [(2.0, 2.0, 3.0), (8.0, 9.0, 9.0)]


def test_a_run_is_measured_from_its_start_with_its_outage_and_limit() -> None:
    timeline = Timeline.measure(
        started=STARTED,
        backlog=[(STARTED + 0.25, 10), (STARTED + 2.5, 40), (STARTED + 4.0, 0)],
        charges=[(STARTED + 1.0, 0.5), (STARTED + 3.5, 2.5)],
        requests=[STARTED + 0.5, STARTED + 3.2, STARTED + 3.4],
        stripe_rate_limit_per_s=25,
        usage_rate_per_s=40.0,
        load_end=STARTED + 3.0,
        outage=(STARTED + 1.0, STARTED + 2.0),
    )
    assert timeline.backlog == [(0.25, 10), (2.5, 40), (4.0, 0)]
    assert timeline.latency == [(2.0, 0.5, 0.5), (4.0, 2.5, 2.5)]
    assert timeline.stripe_requests_per_s == [
        (1.0, 1.0),
        (2.0, 0.0),
        (3.0, 0.0),
        (4.0, 2.0),
        (5.0, 0.0),
    ]
    assert (timeline.outage, timeline.load_end_s) == ((1.0, 2.0), 3.0)
    assert Timeline.from_json(timeline.to_json()) == timeline
