"""What the soak measures a gateway by (gateway_lab/bench/soak_targets.py): resident
memory from /proc, the load a gateway still holds once every request has ended, and
whether the gateway's process still runs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from gateway_lab.bench.soak_targets import InProcessGateway, _running, rss_mb
from tests.server.http.gateway_app import gateway


def test_resident_memory_of_a_live_process_and_of_none() -> None:
    assert rss_mb() > 1 and rss_mb(os.getpid()) > 1
    assert rss_mb(2**22 + 4321) == 0.0


async def test_leftover_load_names_each_worker_still_holding_some() -> None:
    async with gateway() as (state, _):
        await state.add_worker("grpc://w1:1")
        await state.add_worker("grpc://w2:1")
        stack = contextlib.AsyncExitStack()
        closed: list[bool] = []
        stack.callback(closed.append, True)
        target = InProcessGateway(SimpleNamespace(state=state, url="http://127.0.0.1:1"), stack)
        assert target.model == "fake-model" and target.pid == os.getpid() and target.rss_mb() > 1
        assert await target.leftover() == {}
        guard = state.registry.get("w2:1").load.acquire(100, 8)  # type: ignore[union-attr]
        assert await target.leftover() == {
            "gateway:w2:1": {"in_flight": 1, "queued_prefill_tokens": 100, "running_decode_tokens": 0}}
        guard.release()
        assert await target.leftover() == {}
        assert target.traced_mb() is None  # tracemalloc is off
        await target.close()
        assert closed == [True]  # closing stops what served it


def test_a_child_that_exited_is_not_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while _running(child.pid) and time.monotonic() < deadline:  # it exits; unreaped, it is a zombie
        time.sleep(0.01)
    assert not _running(child.pid) and _running(os.getpid())
    child.wait()
    assert not _running(child.pid)
