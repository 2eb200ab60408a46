"""A bench cell's process collects garbage as a serving gateway process does.

A cell with an in-process fleet hosts the eight simulated workers and the load driver
(and, for ``ours`` in process, the gateway) in one Python process on one event loop.
With CPython's default thresholds the cyclic collector runs its older generations over
that whole heap (the workload's prompts, every worker's radix cache, the results so
far), and a full collection holds the loop for a large part of a second: every
simulated worker and every request in flight stands still at once. A run's TTFT tail
was then set by whether such a pause fell on a burst of arrivals, not by routing
(``route_trace.StallWatch`` measured it; see docs/journal/2026-12-07j-trace-tail.md).
Real workers pause on their own, never all together and with the client.

So a cell runs under the serving process's policy (``gateway.server.gc_policy.tune_gc``:
what is alive when the cell starts is frozen out of every collection, and the young
generation is collected every ``young_threshold`` allocations), undone when it ends so
the next cell's start-up heap can be collected.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from gateway.server.config import ServerConfig
from gateway.server.gc_policy import tune_gc

DEFAULT_YOUNG_THRESHOLD = ServerConfig().gc_young_threshold  # the serving process's own default


@contextlib.contextmanager
def quiet_collector(young_threshold: int = DEFAULT_YOUNG_THRESHOLD) -> Iterator[None]:
    """Freeze the heap alive now and collect the young generation every ``young_threshold``
    allocations while the body runs; then the thresholds as they were, the heap unfrozen."""
    before = gc.get_threshold()
    tune_gc(young_threshold)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
