"""Pictures of a pipeline benchmark's timeline (``tools.timeline``): ``bench charge
--plot`` and ``bench outage --plot``, and the panels ``tools.incident_picture`` reuses.

The format follows the file's extension (``FORMATS``). ``check_target`` says whether a
file can be written there before a run starts, so that a long run never ends in a
refused write. matplotlib is imported only when a picture is drawn, on the Agg
canvas (no display, no global pyplot state). In SVG the text stays text (not
outlines): searchable, and the legend readable by a test.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from tools.timeline import LATENCY_WINDOW_S, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FORMATS",
    "LABELS",
    "PlotTargetError",
    "check_target",
    "draw_backlog",
    "draw_latency",
    "draw_requests",
    "new_figure",
    "plot_run",
    "save",
]

FORMATS = {".svg": "svg", ".png": "png"}

# The series' names in the legends (a test reads them from the SVG).
LABELS = {
    "backlog": "backlog (records not yet charged)",
    "p50": "usage -> charged latency p50",
    "p99": "usage -> charged latency p99",
    "requests": "Stripe requests/s",
    "limit": "Stripe rate limit",
    "outage": "Stripe outage",
    "load_end": "load stopped",
}


class PlotTargetError(ValueError):
    """Raised when a picture cannot be written to the path given: an extension that
    names no format we draw, or a place where no file can be written."""


def check_target(path: Path) -> str:
    """The format ``path`` asks for, once it is known a file can be written there
    (its directory exists and takes a new file, or the file exists and takes writes);
    nothing is left behind by the check."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise PlotTargetError(
            f"cannot draw {path}: the extension must be one of {', '.join(FORMATS)}"
        )
    if path.is_dir():
        raise PlotTargetError(f"cannot write {path}: it is a directory")
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise PlotTargetError(f"cannot write {path}: {exc.strerror}") from None
    if not existed:
        path.unlink()
    return fmt


def plot_run(timeline: Timeline, path: Path) -> None:
    """The run's backlog, latency and Stripe requests a second, one above the other on
    one time axis, with the outage shaded and the rate limit drawn."""
    fig = new_figure(figsize=(9.0, 8.0))
    backlog, latency, requests = fig.subplots(3, 1, sharex=True)
    draw_backlog(backlog, timeline)
    draw_latency(latency, timeline)
    draw_requests(requests, timeline)
    requests.set_xlabel("seconds from the start of the load")
    title = "billing-ledger bench " + ("outage" if timeline.outage else "charge")
    fig.suptitle(title)
    save(fig, path)


def new_figure(figsize: tuple[float, float]) -> Figure:
    """An empty figure on the Agg canvas, its SVG text kept as text."""
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mpl.rcParams["svg.fonttype"] = "none"
    mpl.rcParams["svg.hashsalt"] = "billing-ledger"  # the same run, the same file
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> None:
    fmt = check_target(path)
    # No creation date in an SVG: a picture kept in the repository changes only when
    # what it shows does.
    metadata = {"Date": None} if fmt == "svg" else None
    fig.savefig(path, format=fmt, metadata=metadata, dpi=110)


def draw_backlog(ax: Axes, timeline: Timeline) -> None:
    ax.plot(*_columns(timeline.backlog), color="tab:blue", label=LABELS["backlog"])
    ax.set_ylabel("records")
    ax.set_ylim(bottom=0)
    _marks(ax, timeline)
    ax.legend(loc="upper left", fontsize="small")


def draw_latency(ax: Axes, timeline: Timeline) -> None:
    times, p50s, p99s = _with_gaps(timeline.latency)
    ax.plot(times, p50s, "o-", markersize=3, color="tab:green", label=LABELS["p50"])
    ax.plot(times, p99s, "o-", markersize=3, color="tab:red", label=LABELS["p99"])
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    _marks(ax, timeline, labelled=False)
    ax.legend(loc="upper left", fontsize="small")


def draw_requests(ax: Axes, timeline: Timeline) -> None:
    ends, counts = _columns(timeline.stripe_requests_per_s)
    # Each second drawn over its whole width: from its start, the last one to its end.
    ax.step([e - 1 for e in ends] + ends[-1:], counts + counts[-1:], where="post",
            color="tab:purple", label=LABELS["requests"])  # fmt: skip
    limit = timeline.stripe_rate_limit_per_s
    ax.axhline(limit, color="black", linestyle="--", linewidth=1,
               label=f"{LABELS['limit']} ({limit}/s)")  # fmt: skip
    ax.set_ylabel("requests/s")
    peak = max((n for _, n in timeline.stripe_requests_per_s), default=0.0)
    ax.set_ylim(0, max(peak, limit) * 1.2)  # the limit always in sight, below the top
    _marks(ax, timeline, labelled=False)
    ax.legend(loc="upper left", fontsize="small")


def _marks(ax: Axes, timeline: Timeline, *, labelled: bool = True) -> None:
    """The outage shaded and the end of the load, on every panel (named on one)."""
    if timeline.outage is not None:
        ax.axvspan(*timeline.outage, color="tab:orange", alpha=0.2,
                   label=LABELS["outage"] if labelled else None)  # fmt: skip
    ax.axvline(timeline.load_end_s, color="grey", linestyle=":", linewidth=1,
               label=LABELS["load_end"] if labelled else None)  # fmt: skip


def _with_gaps(
    latency: list[tuple[float, float, float]],
) -> tuple[list[float], list[float], list[float]]:
    """The windows' times, p50s and p99s, a gap (NaN) where windows had no charge (an
    outage): no line is drawn across a time nothing was charged."""
    times: list[float] = []
    p50s: list[float] = []
    p99s: list[float] = []
    for at, p50, p99 in latency:
        if times and at - times[-1] > LATENCY_WINDOW_S * 1.5:
            times.append(at - LATENCY_WINDOW_S)
            p50s.append(math.nan)
            p99s.append(math.nan)
        times.append(at)
        p50s.append(p50)
        p99s.append(p99)
    return times, p50s, p99s


def _columns(
    points: list[tuple[float, int]] | list[tuple[float, float]],
) -> tuple[list[float], list[float]]:
    return [float(p[0]) for p in points], [float(p[1]) for p in points]
