"""How commands print: plain tables for people, JSON for programs."""

from __future__ import annotations

from typing import Any

__all__ = ["event_row", "print_table"]


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(no rows)")
        return
    cells = [[("" if r[c] is None else str(r[c])) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def event_row(event: Any) -> dict[str, Any]:
    """One domain event as a row of ``history``: version, time, name, its fields."""
    data = {
        k: v
        for k, v in vars(event).items()
        if k not in ("originator_id", "originator_version", "timestamp", "originator_topic")
    }
    return {
        "version": event.originator_version,
        "timestamp": event.timestamp.isoformat(),
        "event": type(event).__name__,
        "data": {k: str(v) if v is not None else None for k, v in data.items()},
    }
