"""Opt-in heap snapshots (observability/heap_trace.py): off without the variable; with it,
SIGUSR2 starts tracemalloc and writes numbered snapshots atomically."""

from __future__ import annotations

import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.observability import heap_trace
from gateway.observability.heap_trace import ENV_VAR, install_from_env, snapshot_path


@pytest.fixture
def restore_signal() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR2)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR2, before)
        tracemalloc.stop()


def test_off_without_the_variable(monkeypatch: pytest.MonkeyPatch, restore_signal: None) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    before = signal.getsignal(signal.SIGUSR2)
    assert install_from_env() is None and signal.getsignal(signal.SIGUSR2) is before
    monkeypatch.setenv(ENV_VAR, "  ")
    assert install_from_env() is None


def test_each_signal_writes_the_next_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signal: None) -> None:
    target = tmp_path / "snaps"
    monkeypatch.setenv(ENV_VAR, str(target))
    monkeypatch.setattr(heap_trace, "_taken", 0)
    assert install_from_env() == target and target.is_dir()
    handler = signal.getsignal(signal.SIGUSR2)
    assert callable(handler) and not tracemalloc.is_tracing()
    handler(signal.SIGUSR2, None)
    assert tracemalloc.is_tracing()  # started by the first signal, not at start-up
    handler(signal.SIGUSR2, None)
    first, second = snapshot_path(target, 1), snapshot_path(target, 2)
    assert first.is_file() and second.is_file() and not list(target.glob("*.partial"))
    diff = tracemalloc.Snapshot.load(str(second)).compare_to(tracemalloc.Snapshot.load(str(first)), "traceback")
    assert isinstance(diff, list)
    assert snapshot_path("d", 3) == Path("d") / "heap-3.snapshot"
