"""Small helpers the benchmarks share: what they report, and stopping what they started."""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["cores", "percentile", "terminate"]


def cores() -> int:
    """The CPU cores this process may see (every benchmark reports it)."""
    return os.cpu_count() or 1


def percentile(sorted_samples: list[float], pct: float) -> float:
    """The ``pct``-th percentile of already sorted samples (nearest rank; 0 when empty)."""
    if not sorted_samples:
        return 0.0
    k = min(len(sorted_samples) - 1, round(pct / 100 * (len(sorted_samples) - 1)))
    return sorted_samples[k]


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 60 s to finish, then SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
