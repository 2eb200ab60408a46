"""Listed workers not up at start: retried with a growing pause until they register."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.server import late_workers
from gateway.server.late_workers import LateWorkers


async def test_a_worker_is_retried_until_it_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late_workers, "FIRST_PAUSE_S", 0.01)
    calls: list[tuple[str, dict[str, Any]]] = []

    async def add(url: str, **options: Any) -> None:
        calls.append((url, options))
        if len(calls) < 3:
            raise ConnectionError("not up yet")

    late = LateWorkers(add)
    late.retry("grpc://w:1", ConnectionError("first"), role="decode")
    assert late.describe()[0]["url"] == "grpc://w:1" and "first" in late.describe()[0]["error"]
    assert await late.wait(5.0)
    assert late.describe() == []
    assert calls == [("grpc://w:1", {"role": "decode"})] * 3


async def test_stop_ends_the_retries() -> None:
    async def add(url: str, **options: Any) -> None:
        raise ConnectionError("never")

    late = LateWorkers(add)
    late.retry("grpc://w:1", ConnectionError("first"))
    assert not await late.wait(0.05)
    await late.stop()
    await asyncio.sleep(0)
    assert len(late.describe()) == 1  # still pending, no task left
