"""How often a serving process runs CPython's cyclic garbage collector, and over what.

With CPython's defaults the youngest generation is collected every 700 net container
allocations and the older ones every 10 of those. The relay allocates a few dozen
containers per relayed token (the worker message, its deltas, the stream event), so at
thousands of tokens a second the collector ran hundreds of times a second, and each
older collection walks every live object: the tokenizer's vocabulary, the routing
tree, the app. It showed up in profiles of the gsp burst as a visible share of the
event-loop thread (``gc_collect_main``).

The request path makes no reference cycles on purpose, failed requests' included (an
error raised from a frame that holds it, or holds the task that keeps it, would make
one; the test suite runs every kind of request with the collector off to find them),
so collecting less often is safe and bounds memory the same way: what is
alive after start-up is frozen out of every collection (``gc.freeze``), and the young
generation is collected every ``young_threshold`` allocations instead of 700.
"""

from __future__ import annotations

import gc

_DEFAULT_OLDER = (10, 10)  # CPython's generation-1 and -2 thresholds, kept


def tune_gc(young_threshold: int) -> None:
    """Freeze the start-up heap and collect the young generation every ``young_threshold``
    allocations (0: leave CPython's thresholds as they are; the freeze still applies)."""
    gc.collect()
    gc.freeze()
    if young_threshold > 0:
        gc.set_threshold(young_threshold, *_DEFAULT_OLDER)
