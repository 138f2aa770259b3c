"""``billing-ledger audit --metrics-file``: the series the audit alert reads."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from adapters.audit.report import AuditReport
from adapters.audit.textfile import write_textfile
from domain.audit import Finding


def _report(*findings: Finding) -> AuditReport:
    return AuditReport(
        scope={}, events=1234, aggregates=5, transactions=4, balances=2, stripe_items=None,
        seconds=0.1, findings=list(findings),
    )  # fmt: skip


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(path.read_text())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_findings_are_counted_by_kind_with_the_time_and_the_events(tmp_path: Path) -> None:
    path = tmp_path / "audit.prom"
    found = [
        Finding("chain", "t1 v3", "hash differs"),
        Finding("projection", "t2", "missing"),
        Finding("chain", "t4 v1", "hash differs"),
    ]
    write_textfile(_report(*found), path, finished_at=1_765_000_000.0)
    assert _samples(path) == {
        ("billing_audit_findings", (("kind", "chain"),)): 2,
        ("billing_audit_findings", (("kind", "projection"),)): 1,
        ("billing_audit_last_run_timestamp_seconds", ()): 1_765_000_000.0,
        ("billing_audit_events", ()): 1234,
    }


def test_a_clean_audit_leaves_no_finding_series_and_replaces_the_last_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.prom"
    write_textfile(_report(Finding("chain", "t1 v3", "hash differs")), path, finished_at=1.0)
    write_textfile(_report(), path, finished_at=2.0)
    assert _samples(path) == {
        ("billing_audit_last_run_timestamp_seconds", ()): 2.0,
        ("billing_audit_events", ()): 1234,
    }
    assert [p.name for p in tmp_path.iterdir()] == ["audit.prom"]  # no temporary left
