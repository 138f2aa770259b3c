"""``adapters.runtime``: the start-up heap frozen, the first generation larger; the switch
interval shorter where ingest saves behind."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from adapters.observability.heartbeat import Pulses
from adapters.roles import _ingest_role
from adapters.runtime import GEN0_THRESHOLD, SWITCH_INTERVAL_S, tune_gc
from adapters.settings import Settings


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


@pytest.fixture
def restored_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("restored_switching")
@pytest.mark.parametrize("overlap", [True, False])
def test_the_ingest_role_shortens_the_switch_interval_only_when_it_saves_behind(
    overlap: bool,
) -> None:
    sys.setswitchinterval(0.005)  # CPython's default
    _ingest_role(Settings(ingest_overlap_saves=overlap), None, None, Pulses())  # type: ignore[arg-type]
    expected = SWITCH_INTERVAL_S if overlap else 0.005
    assert sys.getswitchinterval() == pytest.approx(expected)
    assert SWITCH_INTERVAL_S < 0.005
