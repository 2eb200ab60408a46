"""The serving process's garbage-collector settings (``server/gc_policy.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.server.config import ServerConfig
from gateway.server.gc_policy import tune_gc


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_freezes_the_heap_and_sets_the_young_threshold() -> None:
    gc.unfreeze()
    tune_gc(50_000)
    assert gc.get_threshold()[0] == 50_000
    assert gc.get_threshold()[1:] == (10, 10)
    assert gc.get_freeze_count() > 0  # what was alive at start-up is out of every collection


def test_zero_keeps_the_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc(0)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() > 0


def test_the_default_is_raised() -> None:
    assert ServerConfig().gc_young_threshold > 700
