"""``bench ingest --credits --rounds N``: each credit run against the runs without credit
on either side of it, and the median of those ratios."""

from __future__ import annotations

from typing import Any

from tools.bench_ingest import _ratios, credit_ratios, render


def _round(credits: float, none_after: float) -> dict[str, Any]:
    return {"credits_records_per_s": credits, "none_after_records_per_s": none_after}


def test_each_credit_run_is_set_against_the_runs_without_on_either_side() -> None:
    rounds = [_round(90, 110), _round(80, 90), _round(95, 100)]
    assert credit_ratios(90, rounds) == [90 / 100, 80 / 100, 95 / 95]


def _result(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    run = {"records_per_s": 100.0, "events_per_s": 200.0, "batch_commit_ms_p50": 1,
           "batch_commit_ms_p99": 2, "workers": 2}  # fmt: skip
    first = {**run, "records_per_s": rounds[0]["credits_records_per_s"]}
    after = {**run, "records_per_s": rounds[0]["none_after_records_per_s"]}
    return {
        "records": 10, "batch": 5, "workers": 2, "customers": 2, "cores": 2, "server": "18",
        "produce": {"records_per_s": 1.0}, "end_to_end": run, "end_to_end_workers": run,
        "end_to_end_credits": first, "end_to_end_after_credits": after,
        "credit_rounds": rounds, "raw_copy": {"rows_per_s": 1000.0},
    }  # fmt: skip


def test_the_ratio_reported_is_the_median_of_the_rounds_and_each_is_shown() -> None:
    result = _result([_round(70, 100), _round(95, 100), _round(90, 100)])
    result["ratios"] = _ratios(result, 0)
    assert result["ratios"]["end_to_end_credits_vs_none"] == 0.9  # not the first, 0.7
    assert [r["vs_none"] for r in result["credit_rounds"]] == [0.7, 0.95, 0.9]
    text = render(result)
    assert "median of 0.70, 0.95, 0.90" in text
    assert "round 3: none again" in text


def test_one_round_reports_its_ratio_as_before() -> None:
    result = _result([_round(90, 100)])
    result["ratios"] = _ratios(result, 0)
    assert result["ratios"]["end_to_end_credits_vs_none"] == 0.9
    assert "median" not in render(result)


def test_the_cpu_a_record_is_shown_with_credit_and_without_as_the_rounds_median() -> None:
    rounds = [_round(90, 100), _round(95, 100), _round(92, 100)]
    for r, (credit, none) in zip(rounds, [(30, 20), (34, 21), (31, 40)], strict=True):
        r["cpu_us_per_record"] = {"credits": [credit, credit / 2], "none": [none, None]}
    result = _result(rounds)
    result["ratios"] = _ratios(result, 0)
    text = render(result)
    assert "CPU a record, with credit: ingest / PostgreSQL" in text
    assert "31.0 / 15.5 µs" in text  # medians of 30, 34, 31 and 15, 17, 15.5
    assert "21.0 / - µs" in text  # a server whose CPU could not be read: a dash
