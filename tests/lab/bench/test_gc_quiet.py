"""A bench cell's process collects as a serving process does, and goes back after."""

from __future__ import annotations

import gc

import pytest

from gateway_lab.bench.gc_quiet import DEFAULT_YOUNG_THRESHOLD, quiet_collector


def test_the_heap_is_frozen_and_the_thresholds_come_back() -> None:
    before = gc.get_threshold()
    kept = [[i] for i in range(100)]  # alive when the cell starts
    with quiet_collector(12_345):
        assert gc.get_threshold()[0] == 12_345 and gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > len(kept)  # start-up heap out of every collection
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert DEFAULT_YOUNG_THRESHOLD > before[0]


def test_an_error_in_the_cell_still_restores_the_collector() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), quiet_collector():
        raise RuntimeError("cell failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
