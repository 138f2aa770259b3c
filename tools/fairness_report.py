"""What ``billing-ledger bench fairness`` reports, from its transactions' moments: the
other customers' latencies in each window (before, during and after the burst) and the
text rendering of the result."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from tools.measure import percentile

__all__ = ["WINDOWS", "Txn", "render_fairness", "window"]

WINDOWS = ("before", "during", "after")


@dataclass(frozen=True)
class Txn:
    """One transaction: its customer, when its usage occurred, was recorded and charged
    (epoch seconds), and where its Metered event stands in the log."""

    customer: str
    occurred: float
    recorded: float
    position: tuple[int, int]
    charged: float | None


def window(
    txns: list[Txn],
    lo: float,
    hi: float,
    positions: list[tuple[float, tuple[int, int], tuple[int, int]]],
) -> dict[str, Any]:
    inside = [t for t in txns if lo <= t.occurred < hi]
    return {
        "records": len(inside),
        "usage_to_recorded_s": _stats([t.recorded - t.occurred for t in inside]),
        "recorded_to_relayed_s": _stats(_reached(inside, [(at, r) for at, r, _ in positions])),
        "recorded_to_projected_s": _stats(_reached(inside, [(at, p) for at, _, p in positions])),
        "recorded_to_charged_s": _stats([t.charged - t.recorded for t in inside if t.charged]),
        "usage_to_charged_s": _stats([t.charged - t.occurred for t in inside if t.charged]),
    }


def _reached(txns: list[Txn], samples: list[tuple[float, tuple[int, int]]]) -> list[float]:
    """How long after its recording a follower's sampled position first covered each
    transaction's Metered event (positions only move forward)."""
    positions = [p for _, p in samples]
    waits: list[float] = []
    for t in txns:
        i = bisect_left(positions, t.position)
        if i < len(samples):
            waits.append(samples[i][0] - t.recorded)
    return waits


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(percentile(ordered, 50), 2),
        "p99": round(percentile(ordered, 99), 2),
        "max": round(ordered[-1], 2) if ordered else 0.0,
    }


def render_fairness(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"{s['steady_customers']} steady customers at {s['steady_rate_per_s']:g} records/s"
        f" in total, {s['meters_per_customer']} meters each; a burst of"
        f" {s['burst_records']:,} records from one more; Stripe {s['stripe_rate_limit_per_s']}"
        f" requests/s, settle interval {s['settle_interval_s']:g}s; {result['cores']} cores,"
        f" load average {_load(result, 'start')} -> {_load(result, 'end')}",
        "",
        f"{'others (p50 / p99 / max, s)':<30}" + "".join(f"{w:>22}" for w in WINDOWS),
    ]
    windows = result["others"]
    for label, key in (
        ("usage -> recorded", "usage_to_recorded_s"),
        ("recorded -> relayed", "recorded_to_relayed_s"),
        ("recorded -> projected", "recorded_to_projected_s"),
        ("recorded -> Charged", "recorded_to_charged_s"),
        ("usage -> Charged", "usage_to_charged_s"),
    ):
        cells = (windows[w][key] for w in WINDOWS)
        lines.append(
            f"{label:<30}" + "".join(f"{c['p50']:>8} /{c['p99']:>6} /{c['max']:>5}" for c in cells)
        )
    for label, key in (("records", "records"), ("window, s", "seconds"),
                       ("Stripe requests", "stripe_requests")):  # fmt: skip
        lines.append(f"{label:<30}" + "".join(f"{windows[w][key]:>22}" for w in WINDOWS))
    b = result["burst"]
    lines += [
        "",
        f"{'others p99 during - before, s':<38} {result['others_p99_during_minus_before_s']}",
        f"{'burst sent / recorded / charged in, s':<38} {b['sent_in_s']} / {b['recorded_in_s']}"
        f" / {b['charged_in_s']}",
    ]
    for key in ("produced", "charged", "compensated", "drained", "lost", "stripe_requests",
                "lines", "stripe_holds", "lines_billed", "stripe_equals_billed", "duplicates",
                "max_abs_billed_minus_exact", "workers_ended"):  # fmt: skip
        if key in result:
            lines.append(f"{key:<38} {result[key]}")
    return "\n".join(lines)


def _load(result: dict[str, Any], when: str) -> str:
    return " ".join(f"{x:.2f}" for x in result["load_average_1_5_15"][when])
