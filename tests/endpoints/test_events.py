"""An API's entry-point result: a whole answer, or started events that end their
generations however the door stops reading."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.endpoints.events import Events, answer_of, events_of


class FakeStream:
    def __init__(self, closed: bool = False) -> None:
        self.closed = closed
        self.aborted: list[str] = []

    async def abort(self, reason: str) -> None:
        self.aborted.append(reason)
        self.closed = True


def generation(stream: FakeStream) -> Any:
    return SimpleNamespace(stream=stream)


async def numbers(closed: list[bool]) -> AsyncGenerator[int, None]:
    try:
        for i in range(3):
            yield i
    finally:
        closed.append(True)


async def test_iterating_yields_the_events() -> None:
    closed: list[bool] = []
    events = Events(numbers(closed), [])
    assert [e async for e in events] == [0, 1, 2]
    assert closed == [True]


async def test_leaving_mid_stream_closes_the_events_and_aborts_open_generations() -> None:
    closed: list[bool] = []
    running, finished = FakeStream(), FakeStream(closed=True)
    async with Events(numbers(closed), [generation(running), generation(finished)]) as events:
        async for event in events:
            assert event == 0
            break
    assert closed == [True]
    assert running.aborted == ["client gone"]
    assert finished.aborted == []  # a generation that ended is not aborted again


async def test_aclose_twice_aborts_once() -> None:
    stream = FakeStream()
    events = Events(numbers([]), [generation(stream)])
    await events.aclose()
    await events.aclose()
    assert stream.aborted == ["client gone"]


async def test_answer_and_events_are_told_apart() -> None:
    answer = {"id": "x", "object": "chat.completion"}
    assert answer_of(answer) is answer
    with pytest.raises(TypeError):
        answer_of([answer])
    events = Events(numbers([]), [])
    assert events_of(events) is events
    with pytest.raises(TypeError):
        events_of(answer)
    with pytest.raises(TypeError):
        answer_of(events)
    await events.aclose()
