"""``health --watch``'s pieces that need no database: the sparkline, the last minute
of backlog it draws, and the backlog read from a report."""

from __future__ import annotations

from adapters.cli.health_watch import BARS, BacklogHistory, backlog, sparkline


def test_the_sparkline_puts_zero_on_the_lowest_bar_and_the_largest_on_the_highest() -> None:
    assert sparkline([0, 7, 14, 7, 0]) == BARS[0] + BARS[4] + BARS[7] + BARS[4] + BARS[0]
    assert sparkline([0, 0, 0]) == BARS[0] * 3
    assert sparkline([]) == ""


def test_more_values_than_bars_keep_each_group_s_largest_so_a_spike_shows() -> None:
    line = sparkline([0] * 50 + [99] + [0] * 49, width=10)
    assert line == BARS[0] * 5 + BARS[7] + BARS[0] * 4


def test_the_history_keeps_the_last_minute_only() -> None:
    history = BacklogHistory(span_s=60.0)
    for second in range(0, 100, 10):
        history.add(float(second), second)
    assert history.values() == [30, 40, 50, 60, 70, 80, 90]


def test_the_backlog_is_every_unfinished_transaction_and_absent_without_figures() -> None:
    figures = {"backlog_metered": 3, "backlog_reserved": 4, "backlog_charge_failed": 5}
    assert backlog(figures) == 12
    assert backlog({"status": "failing", "reasons": ["database unreachable"]}) is None
