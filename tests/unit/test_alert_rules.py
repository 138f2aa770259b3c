"""``infra/alerts.yml`` names only series the code exports, and each alert a runbook.

The series are collected from the code itself: a ``Metrics`` registry with a sample on
every instrument and every queue gauge, rendered as ``/metrics`` renders it, plus the
series ``billing-ledger audit --metrics-file`` writes. A metric renamed in the code
and not in the rules (or the other way round) fails here, not in production silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from adapters.audit.textfile import SERIES as AUDIT_SERIES
from adapters.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra/alerts.yml"
RULE_TESTS = ROOT / "infra/alerts.test.yml"
RUNBOOKS = ROOT / "docs/operate/runbooks"
NAME = re.compile(r"\bbilling_[a-z0-9_]+")


class _EveryFigure(Mapping[str, Any]):
    """Queue-health figures with a value for every key a gauge reads."""

    def __getitem__(self, key: str) -> Any:
        if key == "consumer_lag":
            return [{"fresh": True, "lag": 1, "group_name": "g", "topic": "t", "partition": 0}]
        return 1

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 1


class _Breaker:
    state = "open"


def exported_series() -> set[str]:
    """Every sample name a worker's ``/metrics`` can show, from the code's registry."""
    metrics = Metrics()
    for instrument in vars(metrics).values():
        if hasattr(instrument, "add"):
            instrument.add(1)
        elif hasattr(instrument, "record"):
            instrument.record(0.5)
    metrics.use_figures(_EveryFigure)
    breaker = _Breaker()  # watched weakly: kept alive until rendered
    metrics.watch_breaker(breaker)
    text = metrics.render().decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert breaker.state == "open"
    return names


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_series_the_alerts_use_is_one_the_code_exports() -> None:
    known = exported_series() | set(AUDIT_SERIES)
    used = {name for rule in _rules() for name in NAME.findall(rule["expr"])}
    assert len(used) >= 10
    assert used <= known, f"not exported by the code: {sorted(used - known)}"


def test_every_series_the_rule_tests_feed_is_one_the_code_exports() -> None:
    known = exported_series() | set(AUDIT_SERIES)
    fed = {
        name
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for series in case["input_series"]
        for name in NAME.findall(series["series"])
    }
    assert fed <= known, f"not exported by the code: {sorted(fed - known)}"


def test_the_registry_shows_every_series_the_metrics_module_lists() -> None:
    """The collection above is complete: the module docstring's table, rendered."""
    import adapters.observability.metrics as module

    listed = set(NAME.findall(module.__doc__ or ""))
    exported = exported_series()
    histograms = {n.removesuffix("_count") for n in exported if n.endswith("_count")}
    assert listed <= exported | histograms, sorted(listed - exported - histograms)


def test_each_alert_links_its_own_runbook_page_and_each_page_has_an_alert() -> None:
    urls = {rule["alert"]: rule["annotations"]["runbook_url"] for rule in _rules()}
    base = {url.rpartition("operate/runbooks/")[0] for url in urls.values()}
    assert len(base) == 1, f"every runbook_url on one site: {base}"
    pages = {url.rpartition("operate/runbooks/")[2].removesuffix("/") for url in urls.values()}
    assert len(pages) == len(urls), "one runbook per alert"
    on_disk = {p.stem for p in RUNBOOKS.glob("*.md")} - {"index"}
    assert pages == on_disk
    for alert, url in urls.items():
        page = RUNBOOKS / (url.rstrip("/").rpartition("/")[2] + ".md")
        assert alert in page.read_text(), f"{page.name} does not name {alert}"
