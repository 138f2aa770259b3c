"""Progress lines on stderr for long work: rewritten in place on a terminal, every 10% otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``Progress(total, "ingested").update(done)`` prints how far along the work is."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._last_decile = -1
        self._tty = self.stream.isatty()

    def update(self, done: int, extra: str = "") -> None:
        pct = min(100, done * 100 // self.total)
        rate = done / max(time.monotonic() - self.started, 1e-9)
        line = f"{self.label} {done:,}/{self.total:,} ({pct}%, {rate:,.0f}/s){extra}"
        if self._tty:
            self.stream.write("\r" + line.ljust(78))
            self.stream.flush()
        elif pct // 10 > self._last_decile:
            self._last_decile = pct // 10
            self.stream.write(line + "\n")
            self.stream.flush()

    def done(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def step(message: str, stream: TextIO | None = None) -> None:
    """One line saying what is happening now."""
    out = stream or sys.stderr
    out.write(f"-- {message}\n")
    out.flush()
