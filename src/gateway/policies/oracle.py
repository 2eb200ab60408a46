"""``oracle``: cache_aware's cost with the workers' *true* cached lengths (evaluation only).

``cache_aware`` guesses what each worker caches from a radix tree of what it sent
where. The oracle replaces that guess with the truth, supplied by a callable that
answers "how many leading tokens of these ids does the worker at this url hold"
(the benchmark reads the simulated workers' own radix caches). Everything else,
the cost formula, the load terms, the tie-breaking, is inherited unchanged, so the
difference between the two policies' hit rates is exactly the price of guessing.

What a worker will hold also includes the prompts the oracle has sent it that are
still in flight (queued requests are prefilled and cached in order; running ones
keep their prefix locked): a burst of requests of one group would otherwise all see
a cold cache and be spread out. Those prompts are facts the oracle knows, not a
model of the cache, so they are matched too; cached lengths are then capped like the
worker's own (at most ``prompt - 1`` tokens, whole pages).

It stays out of ``factory.POLICY_NAMES``: a production gateway cannot see its
workers' caches. The benchmark builds it with a policy maker of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.policies.base import RouteRequest, WorkerView
from gateway.policies.cache_aware import (
    DEFAULT_HOT_PREFIX_MIN_TOKENS,
    DEFAULT_HOT_PREFIX_WINDOW,
    CacheAwarePolicy,
    CostKnobs,
)
from gateway.policies.radix_tree import _common_tokens  # the tree's in-place prefix compare

# (worker url, prompt token ids) -> leading tokens of the prompt the worker's cache holds
CachedLength = Callable[[str, Sequence[int]], int]


class OraclePolicy(CacheAwarePolicy):
    """cache_aware with exact cached lengths from ``cached_length`` (see the module docstring)."""

    name: str = "oracle"

    def __init__(
        self,
        cached_length: CachedLength,
        *,
        cost: CostKnobs | None = None,
        use_polled_loads: bool = True,
        hot_prefix_min_tokens: int = DEFAULT_HOT_PREFIX_MIN_TOKENS,
        hot_prefix_window: int = DEFAULT_HOT_PREFIX_WINDOW,
    ) -> None:
        # No tree is kept, so nothing needs a background evictor (nor closed-loop upkeep).
        super().__init__(
            cost=cost, use_polled_loads=use_polled_loads, eviction_interval_s=0, closed_loop=False, learn_output=False,
            hot_prefix_min_tokens=hot_prefix_min_tokens, hot_prefix_window=hot_prefix_window,
        )
        self._cached_length = cached_length
        self._sent: dict[str, dict[object, bytes]] = {}  # worker -> in-flight prompts (packed)
        self._sent_to: dict[object, str] = {}  # request key -> worker

    def _match(self, request: RouteRequest, workers: Sequence[WorkerView]) -> tuple[int, dict[str, int]]:
        prompt = len(request.token_ids)
        cap = max(0, prompt - 1)  # a worker always recomputes the last prompt token
        pb = self._packed(request)
        raw: dict[str, int] = {}
        exclude = request.exclude
        for w in workers:
            if not w.available or w.worker_id in exclude:
                continue
            c = self._cached_length(w.url, request.token_ids)
            for other in self._sent.get(w.worker_id, {}).values():
                if c < cap:
                    c = max(c, _common_tokens(pb, 0, other))
            c = min(c, cap)
            if c > 0:
                raw[w.worker_id] = c
        return max(raw.values(), default=0), raw

    def _remember(self, request: RouteRequest, packed: bytes, worker_id: str) -> None:
        key = request.request_id or id(request)
        self._drop(key)
        self._sent.setdefault(worker_id, {})[key] = packed
        self._sent_to[key] = worker_id

    def _drop(self, key: object) -> None:
        worker = self._sent_to.pop(key, None)
        if worker is not None:
            prompts = self._sent.get(worker, {})
            prompts.pop(key, None)
            if not prompts:
                self._sent.pop(worker, None)

    def on_finish(
        self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool
    ) -> None:
        """The prompt is now in the worker's cache (or never will be): stop matching it."""
        self._drop(request.request_id or id(request))
        super().on_finish(request, worker_id, cached_tokens, success)

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        present = {w.worker_id for w in workers}
        for key in [k for k, w in self._sent_to.items() if w not in present]:
            self._drop(key)
        super().on_workers_changed(workers)
