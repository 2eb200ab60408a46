"""A transparent wrapper that tells the outbox what a pool's policy was told.

The router hands the dispatcher a ``TappedPolicy`` instead of the policy itself when
sync is on; every hook goes to the real policy first, then the decision or finish
is queued for the other processes. The policy stays pure and unaware of sync; the
router keeps the real policy (``isinstance`` checks, the KV-event feeder, inspect).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gateway.policies.base import Decision, Policy, RemoteEvent, RouteRequest, WorkerView


class DecisionSink(Protocol):
    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None: ...

    def finished(self, pool: str, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None: ...

    def learned(
        self, pool: str, request: RouteRequest, worker_id: str, output_ids: Sequence[int], packed: bytes | None = None
    ) -> None: ...


class FanOut:
    """One sink that tells several (the bus's outbox and the same-host ring)."""

    __slots__ = ("sinks",)

    def __init__(self, *sinks: DecisionSink) -> None:
        self.sinks = sinks

    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None:
        for s in self.sinks:
            s.dispatched(pool, request, decision, packed)

    def finished(self, pool: str, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        for s in self.sinks:
            s.finished(pool, request, worker_id, cached_tokens, success)

    def learned(
        self, pool: str, request: RouteRequest, worker_id: str, output_ids: Sequence[int], packed: bytes | None = None
    ) -> None:
        for s in self.sinks:
            s.learned(pool, request, worker_id, output_ids, packed)


class TappedPolicy:
    __slots__ = ("inner", "name", "needs_loads", "packed_of", "pool", "sink")

    def __init__(self, inner: Policy, pool: str, sink: DecisionSink) -> None:
        self.inner = inner
        self.pool = pool
        self.sink = sink
        self.name = inner.name
        self.needs_loads = inner.needs_loads
        self.packed_of: Callable[[RouteRequest], bytes | None] = inner.packed  # cache_aware's memo

    def select(self, request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        return self.inner.select(request, workers)

    def on_dispatch(self, request: RouteRequest, decision: Decision) -> None:
        self.inner.on_dispatch(request, decision)
        self.sink.dispatched(self.pool, request, decision, self.packed_of(request))

    def on_finish(self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        self.inner.on_finish(request, worker_id, cached_tokens, success)
        self.sink.finished(self.pool, request, worker_id, cached_tokens, success)

    def on_output(self, request: RouteRequest, worker_id: str, output_ids: Sequence[int]) -> None:
        """A policy that learns outputs (``cache_aware``) learned one: the others learn it too."""
        self.inner.on_output(request, worker_id, output_ids)
        if output_ids and self.inner.learn_output:
            self.sink.learned(self.pool, request, worker_id, output_ids, self.packed_of(request))

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        self.inner.on_workers_changed(workers)

    # The capabilities the pipeline calls on every policy, passed to the real one.
    @property
    def remote_finishes(self) -> bool:
        return self.inner.remote_finishes

    @property
    def learn_output(self) -> bool:
        return self.inner.learn_output

    def on_remote(self, event: RemoteEvent) -> object:
        return self.inner.on_remote(event)

    def packed(self, request: RouteRequest) -> bytes | None:
        return self.packed_of(request)

    def set_load_only(self, model: str, on: bool) -> None:
        self.inner.set_load_only(model, on)

    def quality(self) -> dict[str, Any]:
        return self.inner.quality()

    def explain(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        return self.inner.explain(request, workers)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # explain(), tree(), stats, close() ...
        return getattr(self.inner, name)
