"""The incident and its cure in one picture:

    python -m tools.incident_picture docs/images/incident.svg

Left, measured: a real ``bench outage`` run of this ledger (every role in its own
process, the Stripe emulator enforcing Stripe's rate limit and failing every call
for the outage): the backlog through the outage drains after recovery, and the
Stripe requests stay under the limit. Right, a model and labelled so, not a
measurement (``tools.incident_model``): a client that retries without backoff,
given the same usage, the same outage and the same limit: its requests a second
explode during the outage and its backlog never drains.

A run takes about a minute. ``--save-series FILE`` keeps the measured timeline (and
the command that measured it); ``--series FILE`` draws from a kept one, without a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tools.incident_model import IncidentModel, ModelRun
from tools.plots import LABELS, check_target, draw_backlog, draw_requests, new_figure, save
from tools.timeline import Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["draw_incident", "main", "model_of"]

MODEL_TITLE = "MODEL, not a measurement: retries without backoff"
MODEL_LABELS = {
    "backlog": "backlog (model)",
    "requests": "Stripe requests/s (model)",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_target(args.out)
    except ValueError as exc:
        print(f"incident_picture: {exc}", file=sys.stderr)
        return 2
    if args.series:
        doc = json.loads(args.series.read_text())
        timeline, measured_with = Timeline.from_dict(doc["timeline"]), doc["measured_with"]
    else:
        timeline, measured_with = _measure(args)
        if args.save_series:
            kept = {"measured_with": measured_with, "timeline": timeline.as_dict()}
            args.save_series.write_text(json.dumps(kept) + "\n")
    draw_incident(timeline, measured_with, args.out)
    print(args.out)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.incident_picture", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("out", type=Path, help="the picture (.svg or .png)")
    p.add_argument("--series", type=Path, help="draw from a kept timeline: no run")
    p.add_argument("--save-series", type=Path, help="keep the measured timeline here")
    p.add_argument("--rate", type=float, default=200.0, help="usage records/s")
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--outage-at", type=float, default=10.0)
    p.add_argument("--outage-s", type=float, default=10.0)
    p.add_argument("--customers", type=int, default=40)
    p.add_argument("--meters", type=int, default=2)
    p.add_argument("--settle-interval", type=float, default=5.0)
    p.add_argument("--stripe-rate", type=int, default=25)
    return p


def _measure(args: argparse.Namespace) -> tuple[Timeline, str]:
    from tools.bench_charge import Pipeline, measure_load

    pipe = Pipeline(
        stripe_rate=args.stripe_rate,
        customers=args.customers,
        meters=args.meters,
        settle_interval_s=args.settle_interval,
    )
    result, timeline = measure_load(
        pipe, rate=args.rate, seconds=args.seconds, outage_at=args.outage_at,
        outage_s=args.outage_s,
    )  # fmt: skip
    if not (result["drained"] and result["lost"] == 0 and result["duplicates"] == 0):
        raise SystemExit(f"the measured run did not end clean: {json.dumps(result)}")
    measured_with = (
        f"billing-ledger bench outage --rate {args.rate:g} --seconds {args.seconds:g}"
        f" --outage-at {args.outage_at:g} --outage-s {args.outage_s:g}"
        f" --customers {args.customers} --meters {args.meters}"
        f" --settle-interval {args.settle_interval:g} --stripe-rate {args.stripe_rate}"
    )
    return timeline, measured_with


def model_of(timeline: Timeline) -> ModelRun:
    """The model given what the measured run had: its usage, its outage, its limit, and
    the Stripe calls it needed a second before the outage (its demand)."""
    assert timeline.outage is not None, "the picture is of a run with an outage"
    start = timeline.outage[0]
    before = [n for t, n in timeline.stripe_requests_per_s if max(2.0, start - 8) < t <= start]
    demand = sum(before) / max(len(before), 1) or 1.0
    model = IncidentModel(
        demand_per_s=demand,
        records_per_call=timeline.usage_rate_per_s / demand,
        limit_per_s=timeline.stripe_rate_limit_per_s,
    )
    end = timeline.backlog[-1][0] if timeline.backlog else timeline.load_end_s
    return model.run(until_s=end, outage=timeline.outage, load_end_s=timeline.load_end_s)


def draw_incident(timeline: Timeline, measured_with: str, path: Path) -> None:
    """Measured on the left, the model on the right, on the same axes."""
    model = model_of(timeline)
    fig = new_figure(figsize=(12.0, 7.5))
    (backlog, model_backlog), (requests, model_requests) = fig.subplots(
        2, 2, sharex=True, sharey="row"
    )
    draw_backlog(backlog, timeline)
    draw_requests(requests, timeline)
    backlog.set_title("MEASURED: this ledger (bench outage)", fontweight="bold")
    _model_panel(model_backlog, timeline, model.backlog, MODEL_LABELS["backlog"])
    limit = timeline.stripe_rate_limit_per_s
    model_requests.axhline(limit, color="black", linestyle="--", linewidth=1,
                           label=f"{LABELS['limit']} ({limit}/s)")  # fmt: skip
    _model_panel(model_requests, timeline, model.requests_per_s, MODEL_LABELS["requests"])
    model_backlog.set_title(MODEL_TITLE, fontweight="bold", color="tab:red")
    # One scale a row, both sides on it: the model's backlog is not cut off.
    most = max([b for _, b in timeline.backlog] + [b for _, b in model.backlog])
    backlog.set_ylim(0, most * 1.1)
    peak = max([n for _, n in model.requests_per_s] + [timeline.stripe_rate_limit_per_s])
    requests.set_yscale("symlog", linthresh=10)
    requests.set_ylim(0, peak * 3)
    for ax in (requests, model_requests):
        ax.set_xlabel("seconds from the start of the load")
    fig.suptitle(
        "A Stripe outage, with this ledger (measured) and without backoff (a model)",
        fontsize="large",
    )
    fig.text(0.01, 0.003, _caption(measured_with), fontsize="x-small", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.07, 1, 0.93))  # type: ignore[union-attr, call-arg]
    save(fig, path)


def _model_panel(ax: Axes, timeline: Timeline, points: list[tuple[float, float]],
                 label: str) -> None:  # fmt: skip
    ax.plot([t for t, _ in points], [v for _, v in points], color="tab:red", linestyle="--",
            label=label)  # fmt: skip
    if timeline.outage is not None:
        ax.axvspan(*timeline.outage, color="tab:orange", alpha=0.2, label=LABELS["outage"])
    ax.axvline(timeline.load_end_s, color="grey", linestyle=":", linewidth=1,
               label=LABELS["load_end"])  # fmt: skip
    ax.legend(loc="upper left", fontsize="small")


def _caption(measured_with: str) -> str:
    return "\n".join((
        f"Measured: {measured_with} (every role in its own process, the Stripe emulator"
        " enforcing the limit).",
        "Model (tools/incident_model.py), not measured: the same usage, outage and limit;"
        " the Stripe calls a second the ledger needed before the outage;",
        "every unfinished call re-sent every 0.25 s, no backoff; past the limit only"
        " limit²/offered calls a second complete.",
    ))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
