"""``adapters.webhooks.group.GroupCommit``: what waits together is applied together, each
item gets its own answer, and nothing it meets stops it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from adapters.webhooks.group import GroupCommit


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_items_waiting_together_are_applied_as_one_group_with_their_own_answers() -> None:
    entered, gate, groups = threading.Event(), threading.Event(), []

    def apply(items: Sequence[int]) -> list[str]:
        entered.set()
        gate.wait(10)  # the first group holds the thread while the others queue
        groups.append(list(items))
        return [f"answer {i}" for i in items]

    group = GroupCommit(apply, lambda i: "late", workers=1, max_group=100)
    group.start()
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(group.submit, 0)
        assert entered.wait(10)  # the thread is applying the first item alone
        rest = [pool.submit(group.submit, i) for i in range(1, 6)]
        _until(lambda: group._queue.qsize() == 5)
        gate.set()
        assert [f.result() for f in [first, *rest]] == [f"answer {i}" for i in range(6)]
    group.stop()
    assert groups == [[0], [1, 2, 3, 4, 5]]
    assert (group.groups, group.largest) == (2, 5)


def test_a_group_is_at_most_max_group() -> None:
    entered, gate, sizes = threading.Event(), threading.Event(), []

    def apply(items: Sequence[int]) -> list[int]:
        entered.set()
        gate.wait(10)
        sizes.append(len(items))
        return list(items)

    group = GroupCommit(apply, lambda i: -1, workers=1, max_group=2)
    group.start()
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(group.submit, 0)]
        assert entered.wait(10)
        futures += [pool.submit(group.submit, i) for i in range(1, 5)]
        _until(lambda: group._queue.qsize() == 4)  # four waiting: groups of 2 and 2
        gate.set()
        assert sorted(f.result() for f in futures) == [0, 1, 2, 3, 4]
    group.stop()
    assert sizes == [1, 2, 2]


def test_a_failing_group_is_answered_late_and_the_next_group_is_applied() -> None:
    calls = []

    def apply(items: Sequence[int]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            raise RuntimeError("the database went away mid-group")
        return ["ok" for _ in items]

    group = GroupCommit(apply, lambda i: "late", workers=1)
    group.start()
    assert group.submit(1) == "late"
    assert group.submit(2) == "ok"  # the thread lived on
    group.stop()


def test_a_wrong_number_of_answers_is_answered_late() -> None:
    group = GroupCommit(lambda items: [], lambda i: "late", workers=1)
    group.start()
    assert group.submit(1) == "late"
    group.stop()


def test_not_started_or_stopped_answers_late_at_once_and_waiting_items_too() -> None:
    gate = threading.Event()
    group = GroupCommit(lambda items: [gate.wait(10) and "ok" for _ in items], lambda i: "late",
                        workers=1, answer_within_s=0.2)  # fmt: skip
    assert group.submit(1) == "late"  # never started
    group.start()
    assert group.submit(2) == "late"  # its group is still being applied: past the wait
    gate.set()
    group.stop()
    assert not group.running
    assert group.submit(3) == "late"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(lambda items: items, lambda i: i, max_group=0)
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(lambda items: items, lambda i: i, workers=0)
