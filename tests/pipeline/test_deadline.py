"""The client's deadline (pipeline/deadline.py) bounds every worker call's timeout."""

from __future__ import annotations

import asyncio
import time

from gateway.pipeline.deadline import request_deadline, worker_timeout


def test_without_a_deadline_the_configured_timeout_holds() -> None:
    assert request_deadline.get() is None
    assert worker_timeout(30.0) == 30.0


def test_the_client_time_left_bounds_the_timeout_and_never_reaches_zero() -> None:
    token = request_deadline.set(time.monotonic() + 2.0)
    try:
        left = worker_timeout(30.0)
        assert 1.5 < left <= 2.0
        assert worker_timeout(0.5) == 0.5  # the smaller of the two wins
    finally:
        request_deadline.reset(token)
    token = request_deadline.set(time.monotonic() - 5.0)  # already past: a tiny positive timeout
    try:
        assert worker_timeout(30.0) == 0.001
    finally:
        request_deadline.reset(token)


async def test_the_deadline_follows_the_request_into_its_tasks_only() -> None:
    async def seen() -> float:
        return worker_timeout(60.0)

    async def one_request() -> float:
        request_deadline.set(time.monotonic() + 1.0)
        return await asyncio.create_task(seen())

    assert await asyncio.create_task(one_request()) <= 1.0  # each request runs as its own task
    assert await asyncio.create_task(seen()) == 60.0  # another request's context is untouched
