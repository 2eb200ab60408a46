"""The W3C ``traceparent`` the current request's worker calls carry in gRPC metadata.

The front door sets it when tracing is on (``gateway.observability.tracing``); the
worker client reads it. Off (the default) it stays None and costs one ContextVar read
per worker call. Kept here, below ``pipeline``, so the worker client needs no
tracing library.
"""

from __future__ import annotations

from contextvars import ContextVar

TRACEPARENT: ContextVar[str | None] = ContextVar("token_gateway_traceparent", default=None)
