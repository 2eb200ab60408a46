"""Chat templates render with a deadline: inline while quick, on the runner's threads once
slow; a template that loops for ever fails its request, the event loop keeps answering,
and the threads live on."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.pipeline.template_runner import RenderTimeout, TemplateRunner
from gateway.tokenization.chat_template import ChatTemplate


@pytest.fixture
def runner() -> Iterator[TemplateRunner]:
    r = TemplateRunner(threads=2, timeout_s=0.3, inline_timeout_s=0.03, offload_chars=1000)
    yield r
    r.close()


def _spin() -> None:
    while True:
        pass


async def test_a_render_past_the_deadline_is_stopped(runner: TemplateRunner) -> None:
    started = time.monotonic()
    with pytest.raises(RenderTimeout, match=r"0\.3s"):
        await runner.run(_spin)
    assert 0.25 < time.monotonic() - started < 2.0
    assert await runner.run(lambda: 7) == 7  # the thread is back at work
    assert all(t.is_alive() for t in runner._threads)


async def test_a_render_that_spins_stops_and_the_loop_keeps_answering(runner: TemplateRunner) -> None:
    # Template bombs fail on their render budget first (tokenization.render_budget); the
    # deadline is for renders that stay inside it and are still slow.
    render = asyncio.ensure_future(runner.render("bomb", 2, _spin))
    gaps: list[float] = []
    last = time.perf_counter()
    while not render.done():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    with pytest.raises(RenderTimeout):
        await render
    # Deadlines count CPU time; on a loaded host the wall-clock gaps stretch, so the bound
    # asserted is loose (without the runner the loop would not turn again for hours).
    assert statistics.median(gaps) < 0.05 and max(gaps) < 0.5, f"the event loop waited {sorted(gaps)}"


async def test_errors_and_results_pass_through(runner: TemplateRunner) -> None:
    def fail() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await runner.run(fail)
    assert await runner.run(lambda a, b=0: a + b, 2, b=3) == 5
    assert threading.current_thread() is threading.main_thread()


async def test_two_bombs_at_once_both_stop(runner: TemplateRunner) -> None:
    results = await asyncio.gather(runner.run(_spin), runner.run(_spin), runner.run(lambda: "ok"), return_exceptions=True)
    assert isinstance(results[0], RenderTimeout) and isinstance(results[1], RenderTimeout)
    assert results[2] == "ok"


async def test_a_caller_that_left_before_its_turn_costs_nothing(runner: TemplateRunner) -> None:
    ran: list[int] = []
    busy = [asyncio.ensure_future(runner.run(time.sleep, 0.2)) for _ in range(2)]
    queued = asyncio.ensure_future(runner.run(lambda: ran.append(1)))
    await asyncio.sleep(0.05)
    queued.cancel()
    await asyncio.gather(*busy)
    await runner.run(lambda: None)
    assert ran == []


async def test_a_quick_render_runs_inline() -> None:
    runner = TemplateRunner(threads=1, timeout_s=0.3, inline_timeout_s=0.03, offload_chars=1000)
    try:
        template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
        where: list[str] = []

        def render() -> str:
            where.append(threading.current_thread().name)
            return template.render([{"role": "user", "content": "hi"}])

        assert await runner.render("t", 2, render) == "hi"
        assert await runner.render("t", 5000, render) == "hi"  # large: a thread
        assert where == ["MainThread", "chat-template-0"]
    finally:
        runner.close()


async def test_a_slow_template_goes_to_a_thread_once_and_stays_there(runner: TemplateRunner) -> None:
    where: list[str] = []

    def slow() -> str:
        where.append(threading.current_thread().name)
        end = time.thread_time() + 0.1  # CPU time, as the deadlines count it (a busy host stretches wall time)
        while time.thread_time() < end:
            pass
        return "done"

    started = time.thread_time()
    assert await runner.render("slow", 2, slow) == "done"
    assert where[0] == "MainThread" and where[1].startswith("chat-template-")
    # The event loop's thread spent about the inline deadline on it, not the whole render.
    assert "slow" in runner.slow and time.thread_time() - started < 0.09
    where.clear()
    assert await runner.render("slow", 2, slow) == "done"
    assert len(where) == 1 and where[0].startswith("chat-template-")
    assert await runner.render("other", 2, lambda: threading.current_thread().name) == "MainThread"


async def test_an_inline_error_passes_through(runner: TemplateRunner) -> None:
    def fail() -> None:
        raise ValueError("bad messages")

    with pytest.raises(ValueError, match="bad messages"):
        await runner.render("t", 2, fail)
    assert "t" not in runner.slow


async def test_a_render_that_waits_without_working_is_stopped_by_the_wall_clock(runner: TemplateRunner) -> None:
    def idle() -> None:
        while True:
            time.sleep(0.01)  # no CPU: only the wall-clock backstop (3 x the deadline) stops it

    started = time.monotonic()
    with pytest.raises(RenderTimeout):
        await runner.run(idle)
    assert 0.85 < time.monotonic() - started < 3.0


async def test_the_watchdog_sleeps_a_whole_deadline_between_quick_renders() -> None:
    runner = TemplateRunner(threads=1, timeout_s=0.3, inline_timeout_s=0.05, offload_chars=1000)
    try:
        template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
        start = runner.checks
        began = time.monotonic()
        for _ in range(200):  # a steady stream of quick inline renders, at least 0.2 s of them
            assert await runner.render("t", 2, template.render, [{"role": "user", "content": "hi"}]) == "hi"
            await asyncio.sleep(0.001)
        elapsed = time.monotonic() - began
        # One wake-up per deadline (0.05 s), not one per render or per short tick.
        assert runner.checks - start <= elapsed / 0.05 + 4
    finally:
        runner.close()


def _spin_swallowing_one_interrupt() -> str:
    """Spins like a bomb, but loses the first interrupt the way a weakref callback or a
    ``__del__`` would (the interpreter reports it there and carries on)."""
    from gateway.pipeline.template_runner import _Interrupt

    swallowed = False
    end = time.monotonic() + 10.0
    while time.monotonic() < end:
        try:
            while time.monotonic() < end:
                pass
        except _Interrupt:
            if swallowed:
                raise
            swallowed = True
    return "never stopped"


async def test_a_lost_interrupt_is_sent_again(runner: TemplateRunner) -> None:
    started = time.monotonic()
    with pytest.raises(RenderTimeout):
        await runner.run(_spin_swallowing_one_interrupt)
    with pytest.raises(RenderTimeout):  # inline first: interrupted twice there, then twice on a thread
        await runner.render("lossy", 2, _spin_swallowing_one_interrupt)
    assert "lossy" in runner.slow
    assert time.monotonic() - started < 8.0
    assert await runner.run(lambda: 7) == 7


def _timed(spans: list[tuple[float, float]], seconds: float) -> str:
    started = time.monotonic()
    time.sleep(seconds)
    spans.append((started, time.monotonic()))
    return "done"


async def test_large_renders_run_one_at_a_time_beside_small_slow_ones(runner: TemplateRunner) -> None:
    # Each render thread busy with Python is one more thread the event loop waits behind
    # for the GIL: large inputs take turns, while a template known slow keeps both threads.
    runner.slow.add("slow")
    large: list[tuple[float, float]] = []
    small: list[tuple[float, float]] = []
    results = await asyncio.gather(
        runner.render("t", 5000, _timed, large, 0.1),
        runner.render("t", 5000, _timed, large, 0.1),
        runner.render("slow", 2, _timed, small, 0.05),
    )
    assert results == ["done"] * 3
    (_, a1), (b0, _) = sorted(large)
    assert a1 <= b0, "two large renders overlapped"
    assert small[0][0] < a1, "the slow template's render waited for the large ones"


async def test_a_large_render_whose_caller_left_still_holds_its_turn(runner: TemplateRunner) -> None:
    spans: list[tuple[float, float]] = []
    first = asyncio.ensure_future(runner.render("t", 5000, _timed, spans, 0.15))
    await asyncio.sleep(0.05)
    first.cancel()  # mid-render: the render goes on, and so does its turn
    assert await runner.render("t", 5000, _timed, spans, 0.01) == "done"
    (_, a1), (b0, _) = sorted(spans)
    assert a1 <= b0


async def test_a_large_render_cancelled_before_its_turn_runs_nothing(runner: TemplateRunner) -> None:
    spans: list[tuple[float, float]] = []
    first = asyncio.ensure_future(runner.render("t", 5000, _timed, spans, 0.1))
    queued = asyncio.ensure_future(runner.render("t", 5000, _timed, spans, 0.1))
    await asyncio.sleep(0.02)
    queued.cancel()
    assert await first == "done"
    assert await runner.render("t", 5000, lambda: 3) == 3  # the turn came back
    assert len(spans) == 1


async def test_a_large_render_past_its_deadline_marks_its_template_slow(runner: TemplateRunner) -> None:
    with pytest.raises(RenderTimeout):
        await runner.render("bomb", 5000, _spin)
    assert "bomb" in runner.slow
    # Its next large renders no longer take the large inputs' turn: two spin at once.
    starts: list[float] = []

    def spin() -> None:
        starts.append(time.monotonic())
        _spin()

    results = await asyncio.gather(runner.render("bomb", 5000, spin), runner.render("bomb", 5000, spin),
                                   return_exceptions=True)
    assert all(isinstance(r, RenderTimeout) for r in results)
    assert max(starts) - min(starts) < 0.25  # one after the other, the second would start 0.3 s of CPU later
    assert await runner.render("t", 5000, lambda: 4) == 4
