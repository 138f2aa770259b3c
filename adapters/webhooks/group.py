"""Group commit: requests that arrive while one group is being committed form the next.

A webhook's effect is one small database transaction: a handful of round trips, each
paying the network, a commit's flush and (in one Python process) a wait for the GIL.
Applied one request at a time they cost the same however many arrive; here a thread
takes every request waiting (up to ``max_group``), applies them with one function
call (``WebhookHandler.apply_group``: one read of the receipts, one of the invoices,
one transaction), and hands each request its own answer. Under load a group grows
and the cost per request falls; alone, a request is a group of one and waits for no
one. ``workers`` threads do this side by side, so one group's round trips overlap
another's (two groups touching one invoice are settled by the event store's version
check, like any two writers). No request is answered before its group's transaction
has committed.

A request that waits longer than ``answer_within_s`` for its group is answered with
``late(item)`` (the handler's 503: Stripe retries, and the receipt's primary key makes
the retry a duplicate if the group did commit). An exception escaping ``apply``
answers the whole group with ``late`` and is logged; the thread goes on. ``stop``
answers whatever is still waiting with ``late`` too.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("answer", "done", "item")

    def __init__(self, item: T) -> None:
        self.item = item
        self.answer: R | None = None
        self.done = threading.Event()


class GroupCommit(Generic[T, R]):
    """Applies submitted items in groups on threads of its own (see the module docstring)."""

    def __init__(
        self,
        apply: Callable[[Sequence[T]], Sequence[R]],
        late: Callable[[T], R],
        *,
        max_group: int = 200,
        workers: int = 4,
        answer_within_s: float = 20.0,
        name: str = "group-commit",
    ) -> None:
        if max_group < 1 or workers < 1:
            raise ValueError("max_group and workers must be at least 1")
        self._apply = apply
        self._late = late
        self.max_group = max_group
        self.answer_within_s = answer_within_s
        self._queue: queue.SimpleQueue[_Slot[T, R] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        self.groups = 0  # groups applied (for tests)
        self.largest = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the groups being applied, answer the rest ``late``, end the threads."""
        alive = [thread for thread in self._threads if thread.is_alive()]
        for _ in alive:
            self._queue.put(None)
        for thread in alive:
            thread.join(timeout_s)
        self._drain()

    def submit(self, item: T) -> R:
        """``item``'s answer, once its group has been applied (or ``late``)."""
        if not self.running:
            return self._late(item)  # stopped (or never started)
        slot: _Slot[T, R] = _Slot(item)
        self._queue.put(slot)
        if not slot.done.wait(self.answer_within_s) or slot.answer is None:
            return self._late(item)
        return slot.answer

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            group = [first]
            while len(group) < self.max_group:
                try:
                    slot = self._queue.get_nowait()
                except queue.Empty:
                    break
                if slot is None:
                    stopping = True
                    break
                group.append(slot)
            self._answer(group)

    def _answer(self, group: list[_Slot[T, R]]) -> None:
        items = [slot.item for slot in group]
        try:
            answers = list(self._apply(items))
            if len(answers) != len(items):
                raise RuntimeError(f"{len(answers)} answers for {len(items)} items")
        except Exception:  # nothing stops the listener: the group is answered late
            log.exception("a group of %d could not be applied", len(items))
            answers = [self._late(item) for item in items]
        self.groups += 1
        self.largest = max(self.largest, len(items))
        for slot, answer in zip(group, answers, strict=True):
            slot.answer = answer
            slot.done.set()

    def _drain(self) -> None:
        while True:
            try:
                slot = self._queue.get_nowait()
            except queue.Empty:
                return
            if slot is not None:
                slot.answer = self._late(slot.item)
                slot.done.set()
