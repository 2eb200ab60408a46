"""Batched prompts (pipeline/fanout.py): several generations read as one stream of
``(index, delta)``; one failure fails the whole request and cancels the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.pipeline.fanout import merged


class _Gen:
    """A generation whose deltas are a script; ``gate`` holds it until released."""

    def __init__(self, *deltas: Any, gate: asyncio.Event | None = None, fail: Exception | None = None) -> None:
        self.script = deltas
        self.gate = gate
        self.fail = fail
        self.cancelled = False
        self.closed = False

    async def deltas(self) -> AsyncIterator[Any]:
        try:
            for d in self.script:
                yield d
            if self.gate is not None:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


async def _collect(gens: list[_Gen]) -> list[tuple[int, Any]]:
    return [item async for item in merged(gens)]  # type: ignore[arg-type]


async def test_one_generation_is_read_directly() -> None:
    assert await _collect([_Gen("a", "b")]) == [(0, "a"), (0, "b")]


async def test_every_delta_arrives_tagged_with_its_generation() -> None:
    out = await _collect([_Gen("a0", "a1"), _Gen("b0"), _Gen()])
    assert sorted(out) == [(0, "a0"), (0, "a1"), (1, "b0")]
    assert [d for i, d in out if i == 0] == ["a0", "a1"]  # each generation's own order is kept


async def test_a_failure_fails_the_request_and_cancels_the_rest() -> None:
    waiting = _Gen("w0", gate=asyncio.Event())  # never released: would hang without the cancel
    failing = _Gen("f0", fail=RuntimeError("worker died"))
    seen: list[tuple[int, Any]] = []
    with pytest.raises(RuntimeError, match="worker died"):
        async for item in merged([waiting, failing]):  # type: ignore[list-item]
            seen.append(item)
    assert sorted(seen) == [(0, "w0"), (1, "f0")]
    assert waiting.cancelled and waiting.closed


async def test_a_consumer_that_stops_early_cancels_every_generation() -> None:
    gens = [_Gen("x", gate=asyncio.Event()), _Gen("y", gate=asyncio.Event())]
    stream = merged(gens)  # type: ignore[arg-type]
    await stream.__anext__()
    await stream.aclose()
    assert all(g.closed for g in gens)
