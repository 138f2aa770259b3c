"""The audit's result as Prometheus series, for a scheduled audit to leave where
node_exporter's textfile collector reads it (``billing-ledger audit --metrics-file``).

The audit is a command, not a worker: it has no ``/metrics`` to scrape. A scheduled run
writes its outcome to a ``.prom`` file instead (atomically: a temporary file renamed),
and the ``BillingAuditFinding`` alert of ``infra/alerts.yml`` fires on it:

==================================================  ===================================
``billing_audit_findings{kind}``                    findings of the last audit by kind
                                                    (chain, projection, stripe, ...);
                                                    no series when it found nothing
``billing_audit_last_run_timestamp_seconds``        when the last audit finished
``billing_audit_events``                            events it replayed
==================================================  ===================================
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from adapters.audit.report import AuditReport

__all__ = ["SERIES", "write_textfile"]

SERIES = (
    "billing_audit_findings",
    "billing_audit_last_run_timestamp_seconds",
    "billing_audit_events",
)


def write_textfile(report: AuditReport, path: Path, *, finished_at: float) -> None:
    """Write ``report``'s series to ``path`` (replaced whole, never seen half-written)."""
    registry = CollectorRegistry()
    findings = Gauge(SERIES[0], "findings of the last audit, by kind", ["kind"], registry=registry)
    for kind, count in sorted(Counter(f.kind for f in report.findings).items()):
        findings.labels(kind=kind).set(count)
    Gauge(SERIES[1], "when the last audit finished (Unix time)", registry=registry).set(finished_at)
    Gauge(SERIES[2], "events the last audit replayed", registry=registry).set(report.events)
    write_to_textfile(str(path), registry)
