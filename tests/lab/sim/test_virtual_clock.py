"""The virtual-clock event loop: timers fire in order at their virtual moments, at once in real time."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway_lab.sim.virtual_clock import Deadlock, VirtualClockLoop, run_virtual


def test_sleeps_jump_the_clock_not_the_wall() -> None:
    async def main() -> tuple[float, float]:
        wall = time.perf_counter()
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time(), time.perf_counter() - wall

    now, wall = run_virtual(main())
    assert now == pytest.approx(3600)
    assert wall < 5  # an hour of virtual time, no hour of waiting


def test_timers_fire_in_virtual_order_and_timeouts_hold() -> None:
    async def main() -> tuple[list[tuple[str, float]], bool]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def at(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            seen.append((name, loop.time()))

        await asyncio.gather(at("late", 2.5), at("early", 0.25), at("middle", 1.0))
        timed_out = False
        try:
            async with asyncio.timeout(0.5):
                await asyncio.sleep(10)
        except TimeoutError:
            timed_out = True
        seen.append(("after timeout", loop.time()))
        return seen, timed_out

    seen, timed_out = run_virtual(main())
    assert [n for n, _ in seen] == ["early", "middle", "late", "after timeout"]
    assert [t for _, t in seen] == pytest.approx([0.25, 1.0, 2.5, 3.0])
    assert timed_out


def test_a_wait_nothing_can_end_is_an_error() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock):
        run_virtual(main())


def test_the_clock_never_goes_back() -> None:
    loop = VirtualClockLoop()
    try:
        loop.advance(2.0)
        loop.advance(-1.0)
        assert loop.time() == 2.0
    finally:
        loop.close()
