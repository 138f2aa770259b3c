"""A pipeline benchmark's run over time (``tools.bench_charge``), for ``--plot``
(``tools.plots``) and the incident picture (``tools.incident_picture``).

Three series, in seconds from the start of the load:

* the backlog (records produced, not yet charged), as the benchmark sampled it
  while it ran, every quarter of a second;
* usage -> Charged latency p50 and p99 of the charges made in each window, from each
  Charged event's time and its usage's ``occurred_at`` (exact: every charge counted,
  none sampled away);
* Stripe API requests a second, from the time of each request the emulator received.

Beside them, the usage rate of the load and what the plot marks: the emulator's
enforced rate limit, the outage
window if there was one, and when the load stopped. A timeline is kept as JSON
(``to_json``, ``from_json``) so that a picture can be redrawn without a new run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tools.measure import percentile

__all__ = ["LATENCY_WINDOW_S", "Timeline", "latency_series", "rate_series"]

# Wide enough for a percentile of a few dozen charges at the tests' 40 records/s.
LATENCY_WINDOW_S = 2.0


@dataclass(frozen=True)
class Timeline:
    """What a pipeline benchmark measured over time (seconds from the load's start)."""

    backlog: list[tuple[float, int]]
    latency: list[tuple[float, float, float]]  # (window end, p50 s, p99 s)
    stripe_requests_per_s: list[tuple[float, float]]  # (second's end, requests)
    stripe_rate_limit_per_s: int
    usage_rate_per_s: float
    load_end_s: float
    outage: tuple[float, float] | None = None  # (start, end)

    @classmethod
    def measure(
        cls,
        *,
        started: float,
        backlog: Iterable[tuple[float, int]],
        charges: Iterable[tuple[float, float]],
        requests: Iterable[float],
        stripe_rate_limit_per_s: int,
        usage_rate_per_s: float,
        load_end: float,
        outage: tuple[float, float] | None,
    ) -> Timeline:
        """The timeline of a run that started at ``started`` (epoch seconds, as every
        other time given): ``backlog`` its samples, ``charges`` each charge's time and
        latency, ``requests`` each Stripe request's time."""
        since = [(at - started, b) for at, b in backlog]
        end = since[-1][0] if since else load_end - started
        return cls(
            backlog=[(round(t, 2), b) for t, b in since],
            latency=latency_series([(at - started, s) for at, s in charges], end),
            stripe_requests_per_s=rate_series([at - started for at in requests], end),
            stripe_rate_limit_per_s=stripe_rate_limit_per_s,
            usage_rate_per_s=usage_rate_per_s,
            load_end_s=round(load_end - started, 2),
            outage=(round(outage[0] - started, 2), round(outage[1] - started, 2))
            if outage
            else None,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Timeline:
        outage = doc.get("outage")
        return cls(
            backlog=[(float(t), int(b)) for t, b in doc["backlog"]],
            latency=[(float(t), float(p50), float(p99)) for t, p50, p99 in doc["latency"]],
            stripe_requests_per_s=[(float(t), float(n)) for t, n in doc["stripe_requests_per_s"]],
            stripe_rate_limit_per_s=int(doc["stripe_rate_limit_per_s"]),
            usage_rate_per_s=float(doc["usage_rate_per_s"]),
            load_end_s=float(doc["load_end_s"]),
            outage=(float(outage[0]), float(outage[1])) if outage else None,
        )


def latency_series(
    charges: Sequence[tuple[float, float]], end: float, window: float = LATENCY_WINDOW_S
) -> list[tuple[float, float, float]]:
    """(window end, p50, p99) of the latencies of the charges made in each ``window``
    from 0 to ``end``; a window without a charge has no point (the line has a gap)."""
    bins: dict[int, list[float]] = {}
    for at, latency in charges:
        if 0 <= at <= end + window:
            bins.setdefault(int(at // window), []).append(latency)
    series = []
    for k in sorted(bins):
        values = sorted(bins[k])
        p50, p99 = percentile(values, 50), percentile(values, 99)
        series.append(((k + 1) * window, round(p50, 3), round(p99, 3)))
    return series


def rate_series(times: Sequence[float], end: float) -> list[tuple[float, float]]:
    """Events a second, for each second from 0 to ``end`` (zero where there were none)."""
    counts = [0] * (int(end) + 1)
    for at in times:
        if 0 <= at < len(counts):
            counts[int(at)] += 1
    return [(float(k + 1), float(n)) for k, n in enumerate(counts)]
