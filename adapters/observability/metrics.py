"""Prometheus metrics, through OpenTelemetry's Prometheus exporter. One set per process.

The instruments are created once per process (``metrics()``) and recorded where the
work happens: ingest, the Stripe client, the breaker, the charger. The health server
serves ``render()`` at ``/metrics``. Gauges of the shared queue state (backlog, lag,
oldest unfinished transaction) are read from ``billing.queue_health`` at scrape time
through the figures source the health server installs.

Exposed series (Prometheus names; the dashboard in ``infra/grafana`` uses them and a
test checks it names only these):

======================================================  ===================================
``billing_ingest_records_total{outcome}``               usage records consumed: reserved,
                                                        refused, duplicate, dead_letter
``billing_dead_letters_total``                          usage records quarantined and
                                                        billing events set aside
``billing_events_set_aside_total{code}``                ``billing.events`` messages set
                                                        aside: not_json, invalid, ...
``billing_stripe_requests_total{operation,outcome}``    Stripe calls; outcome ok or the
                                                        error class (http_503, ...)
``billing_stripe_request_duration_seconds``             their latency (histogram)
``billing_charge_steps_total{result}``                  line pushes: pushed, retry, abandoned
``billing_transactions_charged_total``                  transactions recorded Charged
``billing_charge_retries_total``                        failed pushes that will be retried
``billing_charge_latency_seconds``                      metered to charged (histogram)
``billing_breaker_transitions_total{from_state,to_state}``  circuit breaker moves
``billing_breaker_state{client}``                       0 closed, 1 half-open, 2 open
``billing_backlog{state}``                              unfinished transactions by state
``billing_oldest_open_age_seconds``                     age of the oldest unfinished one
``billing_retries_due``                                 failed attempts due now
``billing_consumer_lag{group,topic,partition}``         messages not yet consumed
``billing_lines_unsent``, ``billing_lines_failing``     invoice lines waiting for Stripe
``billing_oldest_unsent_age_seconds``                   the oldest change Stripe has not seen
``billing_invoices_closing``                            invoices closed, not yet finalized
``billing_invoices_past_deadline``                      not finalized by their close deadline
``billing_invoices_needing_attention``                  stopped (or finalized at another
                                                        total) until an operator settles it
``billing_invoice_payment_failures_24h``                payment failures in the last 24 h
``billing_webhook_signature_failures_1h``               webhooks refused for their signature
``billing_role_restarts_total{role}``                   roles restarted after a failure
``billing_invoice_steps_total{step}``                   invoices closed, verified,
                                                        drift_found, needs_attention,
                                                        finalized, mismatch,
                                                        finalize_failed, credited
``billing_webhooks_total{outcome,type}``                Stripe webhook requests: applied,
                                                        duplicate, stale, unknown_invoice,
                                                        ignored_type, bad_signature, ...
======================================================  ===================================
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["CONTENT_TYPE", "Metrics", "metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
_BREAKER_LEVEL = {"closed": 0, "half_open": 1, "open": 2}

Figures = Callable[[], Mapping[str, Any] | None]


# (name, queue_health column, unit, description): the invoices' and webhooks' figures.
_INVOICE_GAUGES = (
    ("billing.invoices.closing", "invoices_closing", "{invoice}",
     "invoices closed and not yet finalized"),
    ("billing.invoices.past_deadline", "invoices_past_deadline", "{invoice}",
     "invoices not finalized by their close deadline"),
    ("billing.invoices.needing_attention", "invoices_needing_attention", "{invoice}",
     "invoices stopped, or finalized at another total, until an operator settles them"),
    ("billing.invoice.payment_failures_24h", "payment_failures_24h", "{failure}",
     "invoice payment failures Stripe reported in the last 24 hours"),
    ("billing.webhook.signature_failures_1h", "webhook_signature_failures_1h", "{request}",
     "webhook requests refused for their signature in the last hour"),
)  # fmt: skip


class Metrics:
    """The process's instruments and the registry ``/metrics`` renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry
        )
        self.provider = MeterProvider(metric_readers=[reader])
        meter = self.provider.get_meter("billing-ledger")
        self.ingested = meter.create_counter(
            "billing.ingest.records", unit="{record}", description="usage records consumed"
        )
        self.dead_letters = meter.create_counter(
            "billing.dead_letters", unit="{record}", description="records and messages set aside"
        )
        self.events_set_aside = meter.create_counter(
            "billing.events.set_aside", unit="{message}",
            description="billing.events messages set aside, by reason code",
        )  # fmt: skip
        self.stripe_requests = meter.create_counter(
            "billing.stripe.requests", unit="{request}", description="Stripe API calls"
        )
        self.stripe_latency = meter.create_histogram(
            "billing.stripe.request.duration",
            unit="s",
            description="Stripe API call latency",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.charge_steps = meter.create_counter(
            "billing.charge.steps", unit="{step}", description="line pushes by result"
        )
        self.charged = meter.create_counter(
            "billing.transactions.charged",
            unit="{transaction}",
            description="transactions recorded Charged (their line's push acknowledged)",
        )
        self.retries = meter.create_counter(
            "billing.charge.retries", unit="{attempt}", description="failed pushes to retry"
        )
        self.charge_latency = meter.create_histogram(
            "billing.charge.latency",
            unit="s",
            description="from Metered to Charged",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
        )
        self.invoices = meter.create_counter(
            "billing.invoice.steps", unit="{step}",
            description="invoice steps: closed, finalized, finalize_failed, credited",
        )  # fmt: skip
        self.webhooks = meter.create_counter(
            "billing.webhooks", unit="{request}",
            description="Stripe webhook requests by outcome",
        )  # fmt: skip
        self.role_restarts = meter.create_counter(
            "billing.role.restarts", unit="{restart}",
            description="worker roles restarted after a failure",
        )  # fmt: skip
        self.breaker_transitions = meter.create_counter(
            "billing.breaker.transitions", unit="{transition}", description="breaker moves"
        )
        meter.create_observable_gauge(
            "billing.breaker.state",
            [self._observe_breakers],
            description="0 closed, 1 half-open, 2 open",
        )
        meter.create_observable_gauge(
            "billing.backlog", [self._observe_backlog], unit="{transaction}",
            description="unfinished transactions by state",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.oldest_open_age", [self._figure("oldest_open_age_s")], unit="s",
            description="age of the oldest unfinished transaction",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.retries_due", [self._figure("retries_due")], unit="{transaction}",
            description="failed attempts due now",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.consumer.lag", [self._observe_lag], unit="{message}",
            description="messages on a partition not yet consumed by the group",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.lines.unsent", [self._figure("lines_unsent")], unit="{line}",
            description="invoice lines with a change Stripe has not acknowledged",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.oldest_unsent_age", [self._figure("oldest_unsent_age_s")], unit="s",
            description="age of the oldest change Stripe has not acknowledged",
        )  # fmt: skip
        meter.create_observable_gauge(
            "billing.lines.failing", [self._figure("lines_failing")], unit="{line}",
            description="invoice lines whose last push failed",
        )  # fmt: skip
        for name, key, unit, description in _INVOICE_GAUGES:
            meter.create_observable_gauge(
                name, [self._figure(key)], unit=unit, description=description
            )
        self._breakers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._numbers = itertools.count(1)
        self._figures: Figures = lambda: None
        self._guard = threading.Lock()

    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)

    def watch_breaker(self, breaker: Any) -> str:
        """Report ``breaker.state`` in ``billing_breaker_state``; returns its label."""
        with self._guard:
            name = f"stripe-{next(self._numbers)}"
            self._breakers[name] = breaker
        return name

    def use_figures(self, figures: Figures) -> None:
        """Where the queue gauges come from (the health server's cached queue_health)."""
        self._figures = figures

    def _observe_breakers(self, _: CallbackOptions) -> Iterable[Observation]:
        for name, breaker in list(self._breakers.items()):
            yield Observation(_BREAKER_LEVEL.get(breaker.state, 2), {"client": name})

    def _observe_backlog(self, _: CallbackOptions) -> Iterable[Observation]:
        figures = self._figures()
        if figures:
            for state in ("metered", "reserved", "charge_failed"):
                yield Observation(figures[f"backlog_{state}"], {"state": state})

    def _figure(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """A gauge callback observing one queue-health figure (nothing when unknown)."""

        def observe(_: CallbackOptions) -> Iterable[Observation]:
            figures = self._figures()
            if figures:
                yield Observation(figures[key])

        return observe

    def _observe_lag(self, _: CallbackOptions) -> Iterable[Observation]:
        figures = self._figures()
        for row in (figures or {}).get("consumer_lag", ()):
            if not row["fresh"]:  # its consumer stopped reporting: no current value
                continue
            yield Observation(
                row["lag"],
                {"group": row["group_name"], "topic": row["topic"], "partition": row["partition"]},
            )


_METRICS = Metrics()


def metrics() -> Metrics:
    """This process's metrics."""
    return _METRICS
