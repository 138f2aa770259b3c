"""Billing periods: which period a moment of usage belongs to.

A period is ``[start, end)`` in UTC. By default a calendar month; a setting picks a
day, an hour, or a number of seconds (``PeriodPolicy.every(n)``: windows of ``n``
seconds from the Unix epoch, for the demo and the tests). A period's ``key`` (its
start, ISO 8601) is part of the deterministic ids of lines and invoices.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

__all__ = ["Period", "PeriodPolicy"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, order=True)
class Period:
    """A billing period, ``[start, end)`` in UTC."""

    start: datetime
    end: datetime

    @cached_property
    def key(self) -> str:
        """Its start, ISO 8601 (computed once: a batch asks its period's for every record
        it alerts on)."""
        return self.start.isoformat().replace("+00:00", "Z")

    def __str__(self) -> str:
        return f"{self.key}/{self.end.isoformat().replace('+00:00', 'Z')}"

    def contains(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


@dataclass(frozen=True)
class PeriodPolicy:
    """How usage is cut into periods: ``month``, ``day``, ``hour`` or ``seconds``."""

    unit: str = "month"
    seconds: int = 0  # for unit "seconds"

    @classmethod
    def parse(cls, text: str) -> PeriodPolicy:
        """``month``, ``day``, ``hour`` or a whole number of seconds (ValueError)."""
        value = text.strip().lower()
        if value in ("month", "day", "hour"):
            return cls(value)
        try:
            seconds = int(value)
        except ValueError:
            raise ValueError(
                f"billing period {text!r}: month, day, hour or a number of seconds"
            ) from None
        if seconds <= 0:
            raise ValueError(f"billing period {text!r}: seconds must be above 0")
        return cls("seconds", seconds)

    def __str__(self) -> str:
        return f"{self.seconds}" if self.unit == "seconds" else self.unit

    def period_of(self, moment: datetime) -> Period:
        """The period ``moment`` falls in."""
        at = moment.astimezone(UTC)
        if self.unit == "month":
            start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
            return Period(start, end)
        if self.unit == "day":
            start = at.replace(hour=0, minute=0, second=0, microsecond=0)
            return Period(start, start + timedelta(days=1))
        if self.unit == "hour":
            start = at.replace(minute=0, second=0, microsecond=0)
            return Period(start, start + timedelta(hours=1))
        offset = int((at - _EPOCH).total_seconds()) // self.seconds * self.seconds
        start = _EPOCH + timedelta(seconds=offset)
        return Period(start, start + timedelta(seconds=self.seconds))

    def next(self, period: Period) -> Period:
        """The period right after ``period``."""
        return self.period_of(period.end)
