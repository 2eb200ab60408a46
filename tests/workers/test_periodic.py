"""A background round on an interval (workers/periodic.py): a failed round does not stop
the next, a zero interval never starts, stop cancels and allows a restart."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.workers.periodic import Periodic


class _Rounds(Periodic):
    name = "test-rounds"

    def __init__(self, interval: float, fail_first: int = 0) -> None:
        super().__init__()
        self.interval = interval
        self.fail_first = fail_first
        self.rounds = 0
        self.third = asyncio.Event()

    def interval_s(self) -> float:
        return self.interval

    async def round(self) -> None:
        self.rounds += 1
        if self.rounds >= 3:
            self.third.set()
        if self.rounds <= self.fail_first:
            raise RuntimeError("worker answered nonsense")


async def test_rounds_go_on_after_failures(caplog: pytest.LogCaptureFixture) -> None:
    rounds = _Rounds(0.001, fail_first=2)
    with caplog.at_level(logging.ERROR):
        rounds.start()
        await asyncio.wait_for(rounds.third.wait(), 5)
        await rounds.stop()
    assert rounds.rounds >= 3
    assert sum("test-rounds round failed" in r.getMessage() for r in caplog.records) == 2


async def test_start_is_idempotent_and_stop_allows_a_restart() -> None:
    rounds = _Rounds(0.001)
    rounds.start()
    task = rounds._task
    rounds.start()
    assert rounds._task is task
    await rounds.stop()
    assert rounds._task is None and task is not None and task.cancelled()
    await rounds.stop()  # twice is fine
    rounds.start()
    await asyncio.wait_for(rounds.third.wait(), 5)
    await rounds.stop()


async def test_a_zero_interval_never_starts() -> None:
    rounds = _Rounds(0.0)
    rounds.start()
    assert rounds._task is None and rounds.rounds == 0
