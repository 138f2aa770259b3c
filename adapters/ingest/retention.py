"""Dead-letter retention: rows of ``billing.dead_letters`` older than
``dead_letter_retention_days`` are removed, a few at a time, by a loop of its own.

Rate-bounded and out of ingest's way: each statement removes at most ``batch`` rows
(the oldest, skipping rows another sweeper holds), with a pause between statements,
on a connection of its own (never one of the pool the roles share); a sweep runs
every ``interval_s``. Deleting old rows takes no lock an insert of new ones waits for.
The counts (``billing.dead_letter_counts``) are not touched, so queue health and
``DeadLetterStore.count`` stay exact; ``dead_letters_last_hour`` reads rows, which
the retention (whole days) never reaches.
"""

from __future__ import annotations

import logging
import threading

from store.dead_letters import DeadLetterStore

__all__ = ["DeadLetterRetention"]

log = logging.getLogger(__name__)


class DeadLetterRetention:
    """Removes expired dead letters; ``sweep(stop)`` once, ``run(stop)`` until stopped."""

    def __init__(
        self,
        store: DeadLetterStore,
        *,
        days: int,
        interval_s: float = 600.0,
        batch: int = 500,
        pause_s: float = 0.2,
    ) -> None:
        self.store = store
        self.days = days
        self.interval_s = interval_s
        self.batch = batch
        self.pause_s = pause_s
        self.purged = 0

    def run(self, stop: threading.Event) -> None:
        """Sweep now and every ``interval_s`` until ``stop``."""
        while not stop.is_set():
            self.sweep(stop)
            stop.wait(self.interval_s)

    def sweep(self, stop: threading.Event) -> int:
        """Remove every expired letter, ``batch`` at a time with a pause between;
        returns how many. Stops early (and resumes next time) when ``stop`` is set.
        With ``days`` 0 every letter is kept."""
        removed = 0
        while self.days > 0 and not stop.is_set():
            n = self.store.purge(self.days, limit=self.batch)
            removed += n
            if n < self.batch or stop.wait(self.pause_s):
                break
        self.purged += removed
        if removed:
            log.info(
                "dead letters purged",
                extra={"step": "retention", "status": "purged", "purged": removed,
                       "older_than_days": self.days},
            )  # fmt: skip
        return removed
