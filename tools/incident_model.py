"""A model, not a measurement: how a Stripe client that retries without backoff behaves
through the same outage a measured run went through (``tools.incident_picture`` draws
it beside that run, labelled as a model).

The model's assumptions, each stated so that a reader can disagree with one:

* Demand: while the load lasts, new Stripe calls are needed at ``demand_per_s``, the
  rate the ledger made them before the outage; each call carries
  ``records_per_call`` records (the usage rate over that demand), so both sides bill
  the same usage. The backlog is the records of the calls not yet done.
* No backoff: every unfinished call is sent again each ``retry_every_s`` (as soon as
  its failure comes back), on top of the new ones; nothing limits the client's rate.
* Stripe: during the outage nothing succeeds. Otherwise up to ``limit_per_s`` calls a
  second succeed; past the limit the 429s and the timeouts of an overloaded limiter
  leave only ``limit_per_s ** 2 / offered`` calls a second completing (goodput falls
  as the offered load grows: the metastable failure of a retry storm).

From these: the calls wait in a pool that grows during the outage; once the requests
it sends pass ``limit_per_s ** 2 / demand_per_s`` a second, fewer calls complete than
are needed and the pool never drains, even after Stripe has recovered. A short
outage stays below that point and recovers; the model says so too
(tests/unit/test_incident_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["IncidentModel", "ModelRun"]


@dataclass(frozen=True)
class ModelRun:
    """The model's series, each point (seconds, value), a point every ``step_s``."""

    backlog: list[tuple[float, float]]  # records not yet charged
    requests_per_s: list[tuple[float, float]]  # calls sent to Stripe a second


@dataclass(frozen=True)
class IncidentModel:
    """Retry without backoff against a rate-limited Stripe (the module says why)."""

    demand_per_s: float
    records_per_call: float
    limit_per_s: float
    retry_every_s: float = 0.25
    step_s: float = 0.1

    def run(self, *, until_s: float, outage: tuple[float, float], load_end_s: float) -> ModelRun:
        """The model from 0 to ``until_s``: Stripe down during ``outage``, no new
        calls from ``load_end_s`` on."""
        pool = self.demand_per_s * self.retry_every_s  # calls not done, in flight too
        backlog: list[tuple[float, float]] = []
        requests: list[tuple[float, float]] = []
        for k in range(round(until_s / self.step_s) + 1):
            t = k * self.step_s
            demand = self.demand_per_s if t < load_end_s else 0.0
            offered = pool / self.retry_every_s
            done = 0.0 if outage[0] <= t < outage[1] else self.goodput(offered)
            # In flight: a call sent now is done within the retry interval at best.
            pool = max(demand * self.retry_every_s, pool + (demand - done) * self.step_s)
            backlog.append((round(t, 3), pool * self.records_per_call))
            requests.append((round(t, 3), offered))
        return ModelRun(backlog=backlog, requests_per_s=requests)

    def goodput(self, offered: float) -> float:
        """Calls a second that complete when ``offered`` are sent (Stripe up)."""
        if offered <= self.limit_per_s:
            return offered
        return self.limit_per_s**2 / offered
