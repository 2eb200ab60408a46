"""Background Abort calls: sent without making the request wait, failures swallowed,
and the last ones awaited at shutdown."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from gateway.pipeline import aborts


class RecordingClient:
    def __init__(self, *, fail: bool = False, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.fail = fail
        self.delay_s = delay_s

    async def abort(self, request_id: str, reason: str = "", *, timeout: float = 2.0) -> bool:
        await asyncio.sleep(self.delay_s)
        self.calls.append((request_id, reason, timeout))
        if self.fail:
            raise ConnectionError("worker gone")
        return True


def worker(client: RecordingClient) -> Any:
    return SimpleNamespace(client=client)


async def test_fire_abort_returns_at_once_and_flush_waits_for_the_call() -> None:
    client = RecordingClient(delay_s=0.05)
    aborts.fire_abort(worker(client), "req-1", "client gone")
    assert client.calls == []  # the request did not wait for it
    await aborts.flush_aborts(timeout_s=2.0)
    assert client.calls == [("req-1", "client gone", 2.0)]
    assert not aborts._background  # finished tasks are forgotten


async def test_a_failing_abort_is_swallowed() -> None:
    client = RecordingClient(fail=True)
    aborts.fire_abort(worker(client), "req-2", "stall")
    await aborts.flush_aborts(timeout_s=2.0)
    assert client.calls == [("req-2", "stall", 2.0)]
    assert not aborts._background


async def test_flush_gives_up_after_its_timeout() -> None:
    client = RecordingClient(delay_s=5.0)
    aborts.fire_abort(worker(client), "req-3", "shutdown")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await aborts.flush_aborts(timeout_s=0.05)
    assert loop.time() - started < 1.0
    assert client.calls == []
    for task in list(aborts._background):
        task.cancel()
    await asyncio.sleep(0)


async def test_flush_with_nothing_pending_returns() -> None:
    await aborts.flush_aborts(timeout_s=0.01)
