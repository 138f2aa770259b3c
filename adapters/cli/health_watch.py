"""``billing-ledger health --watch``: the queue health redrawn in the terminal every
``--interval`` seconds, for an operator without Grafana.

Each redraw reads the same report as ``billing-ledger health`` (``HealthProbe.report``:
the ``billing.queue_health`` query, judged by ``domain.health``) and draws it with
rich: the status and its reasons, a table of the figures, and a sparkline of the
backlog (unfinished transactions: metered, reserved, charge failed) over the last
minute. On a terminal the picture is redrawn in place; written to a pipe or a file,
each redraw follows the last as plain text (no escape codes), so a log of it reads.
Ctrl-C (or SIGTERM) ends it with status 0: stopping a watch is how it is used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from adapters.observability.health_server import FIGURES, HealthProbe

__all__ = ["BARS", "BacklogHistory", "backlog", "frame", "sparkline", "watch"]

BARS = "▁▂▃▄▅▆▇█"
SPAN_S = 60.0
STYLES = {"ok": "bold green", "degraded": "bold yellow", "failing": "bold red"}


class BacklogHistory:
    """The backlog as seen at each redraw, the last ``span_s`` seconds of it."""

    def __init__(self, span_s: float = SPAN_S) -> None:
        self.span_s = span_s
        self._points: deque[tuple[float, int]] = deque()

    def add(self, at: float, value: int) -> None:
        self._points.append((at, value))
        while self._points and self._points[0][0] < at - self.span_s:
            self._points.popleft()

    def values(self) -> list[int]:
        return [value for _, value in self._points]


def backlog(report: Mapping[str, Any]) -> int | None:
    """The unfinished transactions in ``report`` (None when it has no figures)."""
    if "backlog_reserved" not in report:
        return None
    return int(
        report["backlog_metered"] + report["backlog_reserved"] + report["backlog_charge_failed"]
    )


def sparkline(values: Sequence[int], width: int = 60) -> str:
    """``values`` as at most ``width`` bars, 0 the lowest bar and the largest the
    highest; when there are more values than bars, each bar is the largest of its own."""
    if len(values) > width:
        n = len(values)
        values = [max(values[i * n // width : (i + 1) * n // width]) for i in range(width)]
    top = max(values, default=0)
    if top <= 0:
        return BARS[0] * len(values)
    return "".join(BARS[round(v / top * (len(BARS) - 1))] for v in values)


def frame(report: Mapping[str, Any], history: BacklogHistory, interval: float) -> Group:
    """One redraw: the status and reasons, the backlog's sparkline, the figures (in two
    columns: the whole of it fits a terminal of 24 lines)."""
    status = str(report["status"])
    parts: list[RenderableType] = [Text(f"status: {status}", style=STYLES.get(status, "bold"))]
    parts += [Text(f"  - {reason}") for reason in report["reasons"]]
    values = history.values()
    now = f"now {values[-1]}, max {max(values)}" if values else "no figures yet"
    parts.append(Text.assemble(
        ("backlog, last minute  ", "bold"), (sparkline(values), "cyan"), f"  {now}"
    ))  # fmt: skip
    if "backlog_reserved" in report:
        parts.append(_figures(report))
    parts.append(Text(
        f"{datetime.now().astimezone():%H:%M:%S}, every {interval:g}s; Ctrl-C to stop",
        style="dim",
    ))  # fmt: skip
    return Group(*parts)


def _figures(report: Mapping[str, Any]) -> Table:
    rows = [
        (label, f"{v:.1f}" if isinstance(v := report[key], float) else str(v))
        for key, label in FIGURES
    ]
    rows += [
        (f"Stripe {name}, 1/5/15 min", f"{c['1m']}/{c['5m']}/{c['15m']}")
        for name, c in sorted(report["stripe_errors_by_class"].items())
    ]
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
    for label in (True, False, True, False):  # a narrow terminal shortens labels, not lines
        table.add_column(justify="left" if label else "right", no_wrap=True,
                         overflow="ellipsis" if label else "fold")  # fmt: skip
    half = (len(rows) + 1) // 2
    for i in range(half):
        right = rows[half + i] if half + i < len(rows) else ("", "")
        table.add_row(*rows[i], "   " + right[0], right[1])
    return table


def watch(probe: HealthProbe, interval: float, console: Console | None = None) -> int:
    """Redraw the health every ``interval`` seconds until Ctrl-C; then 0."""
    console = console or Console()
    history = BacklogHistory()
    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(_next(probe, history, interval), refresh=True)
                    time.sleep(interval)
        else:  # no cursor to move: one redraw after the other
            while True:
                console.print(_next(probe, history, interval))
                console.print()
                console.file.flush()
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _next(probe: HealthProbe, history: BacklogHistory, interval: float) -> Group:
    report = probe.report()
    value = backlog(report)
    if value is not None:
        history.add(time.monotonic(), value)
    return frame(report, history, interval)
