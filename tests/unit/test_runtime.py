"""``adapters.runtime.tune_gc``: the start-up heap frozen, the first generation larger."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from adapters.runtime import GEN0_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_the_heap_and_raises_only_the_first_threshold() -> None:
    _, gen1, gen2 = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GEN0_THRESHOLD, gen1, gen2)
    assert gc.isenabled()  # collected less often, never switched off
