"""Small helpers the benchmarks share: what they report, and stopping what they started."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psycopg

__all__ = ["ServerCpu", "cores", "percentile", "quiet_server", "terminate"]


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


def quiet_server(url: str, *, vacuum: bool = False) -> bool:
    """Leave the PostgreSQL server at ``url`` owing nothing for writes already made, so
    that the next run measured there does not pay for them: with ``vacuum``, the
    database's tables vacuumed and analysed now (else autovacuum would do it during a
    later run), then a checkpoint (else the next one, timed or by WAL size, could fall in
    it). False, nothing done, when the role may not (a checkpoint needs a superuser or
    ``pg_checkpoint``)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if vacuum:
                conn.execute("VACUUM (ANALYZE)")
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


class ServerCpu:
    """CPU seconds a PostgreSQL server on this machine spends, read from ``/proc``: its
    postmaster's own and its reaped children's (``cutime``, ``cstime``), and its live
    children's. ``read()`` is the total so far; two reads bracket a run. ``None`` where
    ``/proc`` is not there or the server is not this machine's."""

    def __init__(self, database_url: str) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            found = _stat(int(row[0])) if row else None  # while the backend is there
            # A server on another machine has its own process ids: one here may be anything.
            ours = found is not None and _is_postgres(found[0]) and _is_postgres(found[1])
        self.postmaster = found[1] if found is not None and ours else None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> float | None:
        """CPU seconds the server has used so far (None: cannot be read here)."""
        if self.postmaster is None:
            return None
        own = _stat(self.postmaster)
        if own is None:
            return None
        ticks = sum(own[2:6])  # utime, stime, cutime, cstime
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                child = _stat(int(entry.name))
                if child is not None and child[1] == self.postmaster:
                    ticks += child[2] + child[3]
        return ticks / self._tick


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return False


def _stat(pid: int) -> tuple[int, int, int, int, int, int] | None:
    """(pid, ppid, utime, stime, cutime, cstime) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return (pid, int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14]))
