"""The contract between the router and a routing policy.

A policy is pure and synchronous: it sees a ``RouteRequest`` and immutable
``WorkerView`` snapshots and returns a ``Decision``. It never opens a socket or
awaits; the routing layer owns I/O and tells the policy what happened through
the ``on_*`` hooks so stateful policies (the radix tree) can learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gateway.protocol.frozen import slots_builder


class NoWorkerAvailable(Exception):
    """No worker in the pool can take the request (none registered, none available)."""


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The worker's own load figures from its last GetLoads answer (or KV-event load record)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_used_tokens: int = 0
    max_total_num_tokens: int = 0
    token_usage: float = 0.0
    num_waiting_uncached_tokens: int = 0
    cache_hit_rate: float = 0.0
    age_s: float = 0.0

    def aged(self, age_s: float) -> LoadSnapshot:
        """The same figures at ``age_s`` (a worker's view of them is rebuilt every few ms
        while requests come: one constructor call, not ``dataclasses.replace``)."""
        return build_load_snapshot(
            self.num_running_reqs, self.num_waiting_reqs, self.num_used_tokens, self.max_total_num_tokens,
            self.token_usage, self.num_waiting_uncached_tokens, self.cache_hit_rate, age_s,
        )


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one worker at decision time."""

    worker_id: str
    url: str
    role: str = "regular"  # "regular", "prefill" or "decode"
    available: bool = True  # healthy and its circuit breaker allows traffic
    in_flight: int = 0  # requests the gateway has on it now
    queued_prefill_tokens: int = 0  # prompt tokens sent that have not yet produced a first token
    running_decode_tokens: int = 0  # max_new_tokens still owed by its running requests
    remote_prefill_tokens: int = 0  # uncached prompt tokens other gateway processes have queued on it (sync)
    loads: LoadSnapshot | None = None  # last polled figures, if a policy asked for polling
    kv_capacity_tokens: int = 0  # GetServerInfo max_total_num_tokens (0: unknown)
    page_size: int = 1  # the worker's KV page size in tokens
    max_running_requests: int = 0  # sequences the worker runs at once at most (0: unknown)
    bootstrap_port: int | None = None  # PD prefill workers only
    remote_queued_prompt_tokens: int = 0  # whole prompt tokens other gateway processes sent it, no first token yet (siblings and replicas)


# Every field, in order, without the frozen constructor's per-field ``object.__setattr__``
# (``protocol.frozen``): made on every request for most workers of a pool.
build_load_snapshot = slots_builder(LoadSnapshot)
build_worker_view = slots_builder(WorkerView)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One routing question: which worker of ``pool`` should serve these tokens."""

    token_ids: Sequence[int]
    model: str = ""
    pool: str = "regular"
    request_id: str = ""
    routing_key: str | None = None  # X-SMG-Routing-Key / x-routing-key header
    target_worker: str | None = None  # X-SMG-Target-Worker header (id or url)
    max_new_tokens: int = 0  # expected decode length, part of the request's size
    exclude: frozenset[str] = frozenset()  # workers a retry must avoid


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen worker and why (the reason is a metrics label and shown by `inspect`)."""

    worker_id: str
    reason: str
    predicted_cached_tokens: int = 0
    scores: dict[str, float] = field(default_factory=dict)  # per-worker cost, for inspect/debug


# One of each per request (``protocol.frozen``): every field, in order.
build_route_request = slots_builder(RouteRequest)
build_decision = slots_builder(Decision)


@dataclass(frozen=True, slots=True)
class RemoteDecision:
    """Another gateway process sent ``tokens`` (native uint32 bytes, the tree's format)
    of a prompt to ``worker_id``: learn it as if this process had dispatched it."""

    worker_id: str
    model: str
    tokens: bytes
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RemoteFinish:
    """A request another gateway process sent to ``worker_id`` ended."""

    worker_id: str
    model: str
    cached_tokens: int
    success: bool


@dataclass(frozen=True, slots=True)
class RemoteExtension:
    """The sequence of an earlier ``RemoteDecision`` continued by ``tokens`` (a learned
    output): learn ``full`` (= that sequence + ``tokens``) for ``worker_id``. ``mark`` is
    what ``on_remote`` returned for that decision (None if nothing): a policy may use it
    to continue where the decision's insert ended instead of walking ``full`` again."""

    worker_id: str
    model: str
    mark: object
    tokens: bytes
    full: bytes


RemoteEvent = RemoteDecision | RemoteExtension | RemoteFinish


@runtime_checkable
class Policy(Protocol):
    """A routing policy. Implementations must be cheap: they run on the event loop."""

    name: str
    needs_loads: bool  # True if the router should poll workers' GetLoads for this policy

    def select(self, request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        """Choose a worker among ``workers``; raise NoWorkerAvailable if none can serve."""
        ...

    def on_dispatch(self, request: RouteRequest, decision: Decision) -> None:
        """The request was sent to ``decision.worker_id``."""
        ...

    def on_finish(
        self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool
    ) -> None:
        """The request ended; ``cached_tokens`` is what the worker reported."""
        ...

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        """The pool's membership changed (a worker joined, left or changed role)."""
        ...

    # Capabilities only some policies have; ``policies.common.BasePolicy`` gives each a
    # no-op default, so the pipeline calls them on every policy instead of probing for them.

    @property
    def remote_finishes(self) -> bool:
        """on_remote wants RemoteFinish events (the sync layer builds none otherwise)."""
        ...

    @property
    def learn_output(self) -> bool:
        """on_output learns what the worker caches (other processes are told too)."""
        ...

    def on_output(self, request: RouteRequest, worker_id: str, output_ids: Sequence[int]) -> None:
        """The request finished on ``worker_id`` with ``output_ids`` (one sample, not resumed)."""
        ...

    def on_remote(self, event: RemoteEvent) -> object:
        """What another gateway process learned. What it returns for a ``RemoteDecision``
        comes back as the ``mark`` of that decision's ``RemoteExtension`` (None: nothing)."""
        ...

    def packed(self, request: RouteRequest) -> bytes | None:
        """The prompt packed as uint32 tokens when the policy has packed it already, else None."""
        ...

    def set_load_only(self, model: str, on: bool) -> None:
        """Route ``model`` by load alone while its token counts disagree with the workers'."""
        ...

    def quality(self) -> dict[str, Any]:
        """What the policy itself knows about its routing quality (empty when nothing)."""
        ...

    def explain(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        """What the policy would do for ``request`` and why, without changing its state."""
        ...

    def close(self) -> None:
        """Release background resources (threads); safe to call twice."""
        ...
