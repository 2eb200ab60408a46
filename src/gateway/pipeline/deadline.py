"""A client's deadline for the request being served, carried in a context variable.

Front doors that know the client's deadline (gRPC) set it once; every worker call
the pipeline makes for the request then uses the smaller of its own timeout and
the time the client has left, so the worker stops when the client stops waiting.
A context variable follows the request into the tasks it spawns (batched prompts).
"""

from __future__ import annotations

import time
from contextvars import ContextVar

# Absolute time.monotonic() by which the client wants its answer, or None.
request_deadline: ContextVar[float | None] = ContextVar("request_deadline", default=None)


def worker_timeout(configured_s: float) -> float:
    """The timeout for a worker call: ``configured_s`` bounded by the client's deadline."""
    deadline = request_deadline.get()
    if deadline is None:
        return configured_s
    return max(0.001, min(configured_s, deadline - time.monotonic()))
