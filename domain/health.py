"""The health status policy: what the queue-health figures mean (ok, degraded, failing).

Pure: the figures come from ``billing.queue_health`` (``projections.queue_health``);
this module only judges them, with a reason for each finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEGRADED", "FAILING", "OK", "Thresholds", "assess"]

OK, DEGRADED, FAILING = "ok", "degraded", "failing"


@dataclass(frozen=True)
class Thresholds:
    """When a figure makes billing degraded rather than ok."""

    max_consumer_lag: int = 10_000
    max_stripe_errors_5m: int = 0
    max_projector_behind: int = 10_000
    max_loop_age_s: float = 300.0  # a role whose loop has not turned this long is hung
    max_unsent_age_s: float = 120.0  # a line change Stripe has not seen for this long is late
    # A rate, not one letter: a producer sending bad records now and then is not an
    # incident (each letter is kept with its reason); one a minute for an hour is.
    max_dead_letters_last_hour: int = 60


def assess(figures: Mapping[str, Any], limits: Thresholds = Thresholds()) -> tuple[str, list[str]]:
    """The status (ok, degraded, failing) the figures mean, and why.

    Failing: a transaction is past its deadline (invariant I2 is broken) or nothing is
    alive to do the work. Degraded: something is late or refused but still recoverable.
    """
    failing: list[str] = []
    degraded: list[str] = []
    if figures["past_deadline"]:
        failing.append(f"{figures['past_deadline']} transaction(s) past their deadline")
    failing += _lines_failing(figures)
    open_work = figures["backlog_metered"] + figures["backlog_reserved"]
    if not figures["workers_alive"] and open_work + figures["backlog_charge_failed"]:
        failing.append("no live worker while transactions are unfinished")
    for worker in figures.get("workers", ()):
        degraded += _worker_reasons(worker, limits)
    degraded += _lines_late(figures, limits)
    degraded += _invoices(figures)
    if figures["retries_overdue"]:
        degraded.append(f"{figures['retries_overdue']} retry(ies) overdue")
    if figures["stale_reserved"]:
        degraded.append(f"{figures['stale_reserved']} reserved transaction(s) not charged")
    if figures["dead_letters_last_hour"] > limits.max_dead_letters_last_hour:
        degraded.append(
            f"{figures['dead_letters_last_hour']} dead letter(s) in the last hour (more than"
            f" {limits.max_dead_letters_last_hour}): `billing-ledger dead-letters list` says why"
        )
    if figures["conflicting_duplicates_last_hour"]:
        degraded.append(
            f"{figures['conflicting_duplicates_last_hour']} conflicting duplicate(s) in the last"
            " hour: a producer sent a usage_id again with another body"
        )
    if figures["stripe_errors_5m"] > limits.max_stripe_errors_5m:
        by_class = ", ".join(
            f"{name}: {counts['5m']}"
            for name, counts in sorted(figures["stripe_errors_by_class"].items())
            if counts["5m"]
        )
        degraded.append(f"{figures['stripe_errors_5m']} Stripe error(s) in 5 min ({by_class})")
    if figures["max_consumer_lag"] > limits.max_consumer_lag:
        degraded.append(f"consumer lag {figures['max_consumer_lag']}")
    if figures["projector_behind"] > limits.max_projector_behind:
        degraded.append(
            f"projector {figures['projector_behind']} events behind: these figures lag the log"
        )
    if failing:
        return FAILING, failing + degraded
    return (DEGRADED, degraded) if degraded else (OK, [])


def _lines_failing(figures: Mapping[str, Any]) -> list[str]:
    if figures.get("lines_past_deadline"):
        return [
            f"{figures['lines_past_deadline']} invoice line(s) failing to reach Stripe"
            " for longer than the retry horizon"
        ]
    return []


def _lines_late(figures: Mapping[str, Any], limits: Thresholds) -> list[str]:
    reasons = []
    if figures.get("lines_failing"):
        reasons.append(f"{figures['lines_failing']} invoice line(s) failing to reach Stripe")
    if figures.get("oldest_unsent_age_s", 0) > limits.max_unsent_age_s:
        reasons.append(
            f"the oldest change Stripe has not seen is {figures['oldest_unsent_age_s']:.0f} s old"
            f" ({figures.get('lines_unsent', 0)} line(s) waiting)"
        )
    return reasons


def _invoices(figures: Mapping[str, Any]) -> list[str]:
    """Invoices stopped for an operator (Stripe's draft or finalized total differs from the
    ledger in a way no push can repair), credit purchases paid after their grant was
    voided, invoices not closed or finalized by their
    deadline, and webhooks refused for their signature (a wrong secret, a rotation gone
    wrong, or someone forging them)."""
    reasons = _attention(
        figures, "invoices", "invoice(s)", command="billing-ledger invoices settle",
        subject="invoice_id", why="attention",
    )  # fmt: skip
    reasons += _attention(
        figures, "purchases", "credit purchase(s) paid after their grant was voided",
        command="billing-ledger credits reinstate", subject="purchase_id", why="reason",
    )  # fmt: skip
    if figures.get("invoices_past_deadline"):
        reasons.append(
            f"{figures['invoices_past_deadline']} invoice(s) past their close deadline and"
            " not finalized"
        )
    if figures.get("webhook_signature_failures_1h"):
        reasons.append(
            f"{figures['webhook_signature_failures_1h']} webhook(s) with a bad signature in the"
            " last hour"
        )
    return reasons


def _attention(
    figures: Mapping[str, Any], what: str, label: str, *, command: str, subject: str, why: str
) -> list[str]:
    """``{what}_needing_attention`` as a reason naming the first of ``{what}_attention``
    (its ``subject`` and ``why``) and the ``command`` that settles it; none when 0."""
    count = figures.get(f"{what}_needing_attention")
    if not count:
        return []
    first = (figures.get(f"{what}_attention") or [{}])[0]
    return [f"{count} {label} need attention ({command}); first: {first.get(subject)}:"
            f" {first.get(why)}"]  # fmt: skip


def _worker_reasons(worker: Mapping[str, Any], limits: Thresholds) -> list[str]:
    """Silent; or alive with a breaker not closed, a role that failed and waits to
    restart, or a role whose loop stopped turning."""
    name = worker["worker_id"]
    if not worker["alive"]:
        return [f"worker {name} silent since {worker['heartbeat_at']}"]
    reasons = []
    stats = worker.get("stats") or {}
    if worker["breaker_state"] not in (None, "closed"):
        reasons.append(f"Stripe circuit breaker {worker['breaker_state']} in worker {name}")
    for role, restart in sorted(stats.get("restarting", {}).items()):
        reasons.append(
            f"worker {name}: {role} failed ({restart['error']}) and is restarting"
            f" (failure {restart['failures']} in the window)"
        )
    for role, age in stats.get("loop_age_s", {}).items():
        if age > limits.max_loop_age_s:
            reasons.append(f"worker {name}: {role} has not gone round for {age:.0f} s")
    return reasons
