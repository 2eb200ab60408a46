"""Chat templates render on threads of their own with a deadline: a template that loops
for ever fails its request, the event loop keeps answering, and the threads live on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.pipeline.template_runner import RenderTimeout, TemplateRunner
from gateway.tokenization.chat_template import ChatTemplate

BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"


@pytest.fixture
def runner() -> Iterator[TemplateRunner]:
    r = TemplateRunner(threads=2, timeout_s=0.3)
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


async def test_a_template_bomb_stops_and_the_loop_keeps_answering(runner: TemplateRunner) -> None:
    template = ChatTemplate(BOMB)
    render = asyncio.ensure_future(runner.run(template.render, [{"role": "user", "content": "hi"}]))
    gaps: list[float] = []
    last = time.perf_counter()
    while not render.done():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    with pytest.raises(RenderTimeout):
        await render
    assert max(gaps) < 0.1, f"the event loop waited {max(gaps):.3f}s"


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
