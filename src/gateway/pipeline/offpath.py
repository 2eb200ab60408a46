"""Bookkeeping a request needs done, but not before its worker call: run while the worker computes.

At concurrency 1 the gateway idles while the worker computes, and everything before
the gRPC call is added latency.
Statistics that nothing on the way to the call reads (stage histograms, the decision
counter, the routing-quality sketch's offered prompts) are queued with ``later`` and
applied two loop turns on: the request's current turn ends when it awaits its worker,
and the turn after starts the gRPC send (grpc.aio sends from a task of its own), so the
queue runs while the worker computes. Order among queued items is kept; with no running
loop in this thread (sync callers, other threads) an item runs at once. Work a routing
decision or an answer depends on is never queued here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gateway.pipeline.running_loop import memo, running_loop

log = logging.getLogger(__name__)

# Per event loop: the items queued on it (an entry exists while a run is scheduled).
_queues: dict[asyncio.AbstractEventLoop, list[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}


def later(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` off the request's critical path (see the module doc)."""
    loop = memo.loop
    if loop is None or not loop.is_running():
        try:
            loop = running_loop()
        except RuntimeError:
            fn(*args)
            return
    queue = _queues.get(loop)
    if queue is None:
        queue = _queues[loop] = []
        loop.call_soon(loop.call_soon, _run, loop)  # two turns: after this request's gRPC send starts
    queue.append((fn, args))


def _run(loop: asyncio.AbstractEventLoop) -> None:
    queue = _queues.pop(loop, None)  # items queued while these run get a run of their own
    for fn, args in queue or ():
        try:
            fn(*args)
        except Exception:  # a statistic must never break the loop or the other items
            log.exception("deferred bookkeeping %r failed", fn)


def run_pending() -> None:
    """Apply what this thread's running loop has queued, for a reader that must see every
    update (a metrics scrape). Without a running loop there is nothing of its own to run:
    the items touch loop-owned state, so another thread never runs them."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _run(loop)
