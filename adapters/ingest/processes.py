"""Ingest on every core: ``billing-ledger run --ingest-processes N`` runs N ingest processes
in the consumer group, each a role of the run process's one supervisor.

One Python process holds one core (the GIL), and ingest is CPU-bound in Python, so a
second core helps only a second process. With N > 1, the run process does not run
the ingest role itself; its supervisor (``adapters.supervisor``) runs N roles
``ingest-0`` ... ``ingest-{N-1}``, each of which starts one child process and watches
it. A child that exits while the process is not stopping (a crash, a kill, its own
roles failing too often) fails its role, and the supervisor starts a new one with the
same restart policy as any role: jittered exponential backoff, and the whole run
process ends after ``role_max_failures`` failures of one role within the window.
Stopping (SIGTERM, SIGINT, or a role failing for good) sends each child SIGTERM and
waits for it to finish the batch in flight.

Each child is ``run --role ingest`` in miniature (``adapters.roles.run_ingest_child``):
its own ledger, consumer, producer and dead-letter retention under its own supervisor,
the garbage collector tuned after start-up, and a heartbeat of its own, so ``billing.workers`` and
``billing-ledger health`` show each ingest process (its pid, its pulse, its counters).
A child whose parent is gone (SIGKILL leaves no time to stop children) stops itself
within a second. Kafka's group protocol shares the partitions among the children (and
every other ingest process of the group, on any machine): offsets are committed only
after each batch's save, so a child that dies leaves its batch to another.

N = 1 runs the ingest role in the run process itself, a thread beside the other roles.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from adapters.errors import WorkerFailed
from adapters.settings import Settings
from adapters.supervisor import RoleFactory, RoleRun

__all__ = ["ChildMain", "child_roles", "watch_parent"]

ChildMain = Callable[[dict[str, Any], str, int], None]
"""A child's entry point (importable: children are spawned): settings as a dict, the
log level and the parent's pid (``adapters.roles.run_ingest_child``)."""

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0  # a child finishing its batch in flight; then it is killed
WATCH_S = 0.5


def child_roles(
    settings: Settings,
    count: int,
    main: ChildMain,
    log_level: str,
    pulse: Callable[[str], Callable[[], None]],
) -> dict[str, RoleFactory]:
    """The ``ingest-i`` roles, each running ``main`` in one child process (see the
    module docstring)."""
    ctx = multiprocessing.get_context("spawn")
    return {
        f"ingest-{i}": _child_role(
            ctx, settings, f"ingest-{i}", (main, log_level), pulse(f"ingest-{i}")
        )
        for i in range(count)
    }


def _child_role(
    ctx: SpawnContext,
    settings: Settings,
    name: str,
    entry: tuple[ChildMain, str],
    pulse: Callable[[], None],
) -> RoleFactory:
    main, log_level = entry

    def build() -> RoleRun:
        def run(stop: threading.Event) -> None:
            child = ctx.Process(
                target=main,
                args=(settings.model_dump(), log_level, os.getpid()),
                name=f"billing-ledger {name}",
            )
            child.start()
            log.info("ingest process started", extra={"step": "supervise", "role": name,
                                                      "pid": child.pid})  # fmt: skip
            try:
                while not stop.wait(WATCH_S):
                    pulse()
                    if not child.is_alive():
                        raise WorkerFailed(
                            f"ingest process {child.pid} exited with {child.exitcode}"
                        )
            finally:
                _stop(child)

        return run

    return build


def _stop(child: SpawnProcess) -> None:
    """SIGTERM, then wait for the batch in flight; kill only past ``STOP_GRACE_S``."""
    if child.is_alive():
        child.terminate()
        child.join(STOP_GRACE_S)
    if child.is_alive():
        log.error("ingest process %s did not stop; killing it", child.pid)
        child.kill()
    child.join()


def watch_parent(parent_pid: int, stop: threading.Event) -> None:
    """Set ``stop`` once the process that started this one is gone (a thread's body)."""
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            log.error("the run process is gone; stopping", extra={"step": "supervise"})
            stop.set()
