"""The reference-cycle probe of the no-cycles tests: run a kind of request with the
collector off and find what of the gateway's is left in a cycle.

The serving process collects cycles rarely (``gateway.server.gc_policy``): a cycle on a
request's path keeps the whole request alive until a full collection. Logging is off
while the requests run: pytest keeps every log record, and a record that carries an
exception would keep its cycle alive, out of sight.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import gateway

GATEWAY_DIR = str(Path(gateway.__file__).parent) + "/"
RUNS = 5
CHAT = [{"role": "user", "content": "name three rivers"}]


def owned(obj: object) -> str | None:
    """What ``obj`` is if it belongs to the gateway's own code, else None."""
    if isinstance(obj, types.FrameType):
        path = obj.f_code.co_filename
        return f"frame {path.removeprefix(GATEWAY_DIR)}:{obj.f_code.co_name}" if path.startswith(GATEWAY_DIR) else None
    module = type(obj).__module__ or ""
    return type(obj).__qualname__ if module == "gateway" or module.startswith("gateway.") else None


def _describe(obj: object) -> str:
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_filename.rsplit('/', 2)[-1]}:{obj.f_code.co_name}:{obj.f_lineno}"
    if isinstance(obj, types.TracebackType):
        return f"traceback line {obj.tb_lineno}"
    return type(obj).__qualname__


def cycle_through(start: object, garbage: list[Any]) -> list[str]:
    """One reference cycle ``start`` lies on or hangs from, named, for the failure message."""
    members = {id(o) for o in garbage}
    node, seen, chain = start, {id(start)}, [_describe(start)]
    for _ in range(24):
        parents: dict[int, object | None] = {id(node): None}
        queue, found = collections.deque([node]), None
        while queue and found is None:
            here = queue.popleft()
            for ref in gc.get_referents(here):
                if ref is node:
                    found = here
                    break
                if id(ref) in members and id(ref) not in parents:
                    parents[id(ref)] = here
                    queue.append(ref)
        if found is not None:
            loop, step = [], found
            while step is not None:
                loop.append(_describe(step))
                step = parents[id(step)]
            return [*chain, "cycle:", *loop[::-1]]
        referrers = [r for r in gc.get_referrers(node) if id(r) in members and id(r) not in seen]
        if not referrers:
            break
        node = referrers[0]
        seen.add(id(node))
        chain.append(_describe(node))
    return chain


def thaw() -> None:
    """Give what the checks froze back to the collector (at a test's end)."""
    gc.unfreeze()


async def assert_leaves_no_cycle(run: Callable[[], Awaitable[Any]]) -> None:
    """Run ``run`` a few times with the collector off; fail naming what of the gateway's
    they left in cycles. What is alive before is frozen (so each check walks only what is
    new, as the serving process after start-up); ``thaw`` gives it back."""
    for _ in range(2):  # first uses fill caches and start long-lived tasks
        await run()
    await asyncio.sleep(0.05)
    gc.collect()
    gc.freeze()  # as the serving process does after start-up; the collections below walk only what is new
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    logging.disable(logging.CRITICAL)
    try:
        for _ in range(RUNS):
            await run()
        await asyncio.sleep(0.05)  # let aborted and finished requests' tasks end
        gc.collect()
        found = [o for o in gc.garbage if owned(o) is not None]
        if found:
            kinds = collections.Counter(owned(o) for o in found).most_common(8)
            raise AssertionError(
                f"{len(found)} of the gateway's objects in cycles after {RUNS} requests: {kinds}; "
                f"one: {' -> '.join(cycle_through(found[0], gc.garbage))}"
            )
    finally:
        logging.disable(logging.NOTSET)
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
