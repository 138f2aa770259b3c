"""How the alert webhooks role sends: timeouts, concurrency, retries (from the settings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from domain.saga import RetryPolicy

__all__ = ["DeliveryPolicy"]


@dataclass(frozen=True)
class DeliveryPolicy:
    """How the role sends (from the settings)."""

    timeout_s: float = 10.0
    concurrency: int = 4  # per endpoint
    retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            horizon=timedelta(days=3),
            base_delay=timedelta(seconds=10),
            max_delay=timedelta(hours=1),
        )
    )
    allow_private: bool = False
    batch: int = 200  # deliveries taken per dispatcher round

    @property
    def lease(self) -> timedelta:
        """How long a claim keeps a delivery from others: the request's deadline, and a
        margin for recording its outcome."""
        return timedelta(seconds=self.timeout_s + 30)
