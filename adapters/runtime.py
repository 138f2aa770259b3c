"""Process-wide tuning of the long-running workers: the garbage collector, and the
interpreter's thread switch interval where ingest saves behind.

An ingest batch allocates hundreds of thousands of short-lived objects, most of them
containers (event dicts, tuples, datetimes inside), so with CPython's default first
generation threshold (700 allocations) the collector ran every few records and walked
the whole young heap each time: 13-16% of an ingest process's CPU, spent finding
nothing (no ingest object is part of a cycle). Two changes, made once after start-up:

* ``gc.freeze()`` moves everything alive at that point (modules, classes, the price
  list, pydantic's validators, the ledger's caches as built) to a permanent generation
  the collector never scans again;
* a first-generation threshold of ``GEN0_THRESHOLD`` allocations: a full batch is
  collected a few times rather than thousands, and memory stays bounded (a collection
  still happens, and reference counting frees nearly everything before it does).

Nothing here changes behaviour; the collector still runs, only less often.

The switch interval (``tune_switching``): an ingest worker that saves behind
(``adapters.ingest.worker``, write-behind) has its writer thread wait for PostgreSQL a
few times a save (the previous hashes, the ``COPY``, the commit), while its own thread
decides the next batch and holds the GIL. Each time the writer wakes it waits for the
GIL, which CPython takes from a running thread only after a switch interval (5 ms by
default): measured end to end in one process, the deciding thread then waited 8.8 to
13.5 us a record for saves that had started a whole batch earlier, against 0.4 to 3.2
us at 1 ms (``SWITCH_INTERVAL_S``; docs/operate/scaling.md, "Saving behind").
"""

from __future__ import annotations

import gc
import sys

__all__ = ["GEN0_THRESHOLD", "SWITCH_INTERVAL_S", "tune_gc", "tune_switching"]

GEN0_THRESHOLD = 50_000
SWITCH_INTERVAL_S = 0.001


def tune_gc(gen0: int = GEN0_THRESHOLD) -> None:
    """Freeze the start-up heap and raise the first generation's threshold (see the
    module docstring). Call once, after start-up and before the work loop."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 1), gen1, gen2)


def tune_switching(interval_s: float = SWITCH_INTERVAL_S) -> None:
    """Hand the GIL between threads every ``interval_s`` (see the module docstring), for
    a process whose ingest saves behind."""
    sys.setswitchinterval(interval_s)
