"""Worker selection: policies per (model, role) pool over live worker views.

The router is the only place that turns registry state into ``WorkerView``
snapshots and asks a policy; the dispatcher calls it once per attempt.

It also keeps each pool's live routing quality (``policies.quality.PoolQuality``):
every first attempt offers its prompt to the pool's prefix sketch (the ideal hit
rate), and ``finished`` (called once per worker stream with what the worker
reported) adds the achieved and predicted figures and runs the tokenizer-fidelity
guard, which switches a model's policies to load-only routing while the worker's
prompt_tokens disagree with the gateway's count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

from gateway.pipeline.offpath import later
from gateway.pipeline.prefill_gate import PrefillHolds
from gateway.pipeline.worker_gate import CALLER, WorkerGate
from gateway.policies.base import Decision, NoWorkerAvailable, Policy, RouteRequest, WorkerView
from gateway.policies.factory import close_policy
from gateway.policies.miss_causes import DEFAULT_BLOCK_TOKENS, MissCauses, MissTicket
from gateway.policies.quality import DEFAULT_SKETCH_TOKENS, OfferedPrefixes, PoolQuality
from gateway.protocol.frozen import slots_builder
from gateway.sync.policy_tap import DecisionSink, TappedPolicy
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Roster, Worker, engine_of, views_of

log = logging.getLogger(__name__)

PolicyMaker = Callable[[str], Policy]  # role -> a fresh policy for one pool


@dataclass(frozen=True, slots=True)
class Selection:
    worker: Worker
    decision: Decision
    policy: Policy  # the one the lease notifies (the pool's own, or its sync tap)
    role: str = "regular"
    prompt: bytes = b""  # the prompt packed as uint32 (cache-aware policies; the prefill gate compares it)
    miss: MissTicket | None = None  # the miss ledger's view of this dispatch (misses by cause)


# One per attempt: every field, in order, through the slots (``protocol.frozen``).
_build_selection = slots_builder(Selection)
_available = attrgetter("available")


@dataclass(frozen=True, slots=True)
class _Live:
    """A pool's workers that are not draining, by id too, as of a count of ``Roster.writes``:
    the same until a worker joins, leaves, starts draining or changes its role or info, so
    the pool is not filtered again on every request."""

    roster: int
    workers: tuple[Worker, ...]
    by_id: dict[str, Worker]


class Router:
    def __init__(
        self, registry: WorkerRegistry, make_policy: PolicyMaker, *, sketch_tokens: int = DEFAULT_SKETCH_TOKENS
    ) -> None:
        self.registry = registry
        self._make_policy = make_policy
        self._policies: dict[tuple[str, str], Policy] = {}
        self._sink: DecisionSink | None = None  # gateway.sync: other processes hear of decisions
        self._taps: dict[tuple[str, str], TappedPolicy] = {}
        self._before_select: Callable[[], object] | None = None  # gateway.sync: hear siblings first
        self._quality: dict[tuple[str, str], PoolQuality] = {}
        self._sketch_tokens = sketch_tokens
        self._cache_params: dict[str, tuple[int, int]] = {}  # worker -> (page size, KV capacity) seen
        self._pools: dict[tuple[str, str], _Live] = {}
        self.cache_param_changes: dict[str, int] = {}  # worker -> times its page size / capacity changed
        self.holds = PrefillHolds()  # requests in prefill and their waiters (pipeline.prefill_gate)
        # Set with the admission queue's fleet cap (``--fleet-headroom``): a worker whose running
        # slots plus this headroom are all taken is offered to the policy only when every one is.
        self.slot_headroom = -1
        # With the fleet cap, when set: requests for a worker whose running slots are all taken
        # wait for one in the gateway, in fair order (instead of the hard slot bound above).
        self.gate: WorkerGate | None = None
        registry.subscribe(self._on_registry_change)

    def policy(self, model: str, role: str) -> Policy:
        key = (model, role)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._make_policy(role)
            self._policies[key] = policy
            policy.on_workers_changed(views_of(self._live(model, role)))
        return policy

    def tap(self, sink: DecisionSink, before_select: Callable[[], object] | None = None) -> None:
        """Tell ``sink`` of every dispatch and finish (the dispatcher gets tapped policies);
        ``before_select`` runs before every choice (same-host sync applies what it heard)."""
        self._sink = sink
        self._before_select = before_select
        self._taps.clear()

    def _dispatching(self, model: str, role: str) -> Policy:
        """The policy the dispatcher notifies: the pool's own, or its tap when sync is on."""
        policy = self.policy(model, role)
        if self._sink is None:
            return policy
        tap = self._taps.get((model, role))
        if tap is None or tap.inner is not policy:
            tap = self._taps[(model, role)] = TappedPolicy(policy, role, self._sink)
        return tap

    def policies(self) -> dict[tuple[str, str], Policy]:
        return dict(self._policies)

    # ------------------------------------------------------------ routing quality
    def quality(self, model: str, role: str) -> PoolQuality:
        key = (model, role)
        q = self._quality.get(key)
        if q is None:
            page = max((w.info.page_size for w in self.registry.pool(model, role)), default=1)
            q = self._quality[key] = PoolQuality(
                offered=OfferedPrefixes(self._sketch_tokens, page), misses=MissCauses(max(DEFAULT_BLOCK_TOKENS, page))
            )
        return q

    def qualities(self) -> dict[tuple[str, str], PoolQuality]:
        return dict(self._quality)

    def abandoned(self, route: RouteRequest, role: str, miss: MissTicket | None) -> None:
        """A worker stream of ``route`` ended before any output (its lease calls this instead
        of ``finished``): the miss ledger lets go of it, nothing is charged."""
        if miss is not None:
            later(self.quality(route.model, role).misses.abandoned, miss)

    def finished(
        self, route: RouteRequest, role: str, *, predicted_cached: int, reported_cached: int,
        sent_prompt: int, reported_prompt: int, success: bool, miss: MissTicket | None = None,
    ) -> None:
        """One worker stream of ``route`` ended with what the worker reported (its lease
        calls this once)."""
        q = self.quality(route.model, role)
        q.finish(sent_prompt=sent_prompt, predicted_cached=predicted_cached,
                 reported_cached=reported_cached, success=success)
        if miss is not None:
            later(q.misses.finished, miss, reported_cached, success)
        if not success:
            return
        changed = q.guard.check(sent_prompt, reported_prompt)
        if changed is None:
            return
        if changed:
            log.warning(
                "model %r: workers report %d prompt tokens where the gateway sent %d (%d mismatches): "
                "its tokenizer or chat template differs from the workers'; routing it by load only "
                "until they agree again", route.model, q.guard.last_reported, q.guard.last_sent, q.guard.mismatches,
            )
        else:
            log.warning("model %r: prompt token counts agree again; cache-aware routing resumes", route.model)
        for (model, _role), policy in self._policies.items():
            if model == route.model:
                policy.set_load_only(model, changed)

    def _check_cache_params(self, worker: Worker) -> None:
        params = (worker.info.page_size, worker.info.kv_capacity_tokens)
        old = self._cache_params.get(worker.id)
        if old == params:
            return
        self._cache_params[worker.id] = params
        if old is not None and old[1] > 0 and params[1] > 0:
            self.cache_param_changes[worker.id] = self.cache_param_changes.get(worker.id, 0) + 1
            if old[1] == params[1] and worker.info.page_size_source == "kv_events":
                log.info("worker %s: page size %d learned from its KV events; its tree share is relearned", worker.id, params[0])
                return
            log.warning(
                "worker %s: page size %d -> %d, KV capacity %d -> %d tokens: its cache is not what "
                "the routing tree remembers; its share is dropped and relearned",
                worker.id, old[0], params[0], old[1], params[1],
            )

    def reset_policies(self) -> None:
        """Forget what every policy learned (the workers' caches were flushed); fresh
        policies are made on the next request."""
        old, self._policies = self._policies, {}
        for policy in old.values():
            close_policy(policy)

    def _live(self, model: str, role: str) -> tuple[Worker, ...]:
        return self._pool(model, role).workers

    def _pool(self, model: str, role: str) -> _Live:
        """The pool's live workers, filtered again only after a roster write; each one's
        cache parameters are checked then (a change of them is such a write)."""
        live = self._pools.get((model, role))
        if live is None or live.roster != Roster.writes:
            roster = Roster.writes
            workers = tuple(w for w in self.registry.pool(model, role) if not w.draining)
            known = self._cache_params
            for w in workers:
                info = w.info
                if known.get(w.id) != (info.page_size, info.kv_capacity_tokens):
                    self._check_cache_params(w)
            live = self._pools[(model, role)] = _Live(roster, workers, {w.id: w for w in workers})
        return live

    def _on_registry_change(self, event: str, worker: Worker) -> None:
        key = (worker.model, worker.role)
        q = self._quality.get(key)
        if q is not None:  # the pool's first workers join before its ledger exists: never "new"
            if event == "added":
                q.misses.joined(worker.id)
            elif event in ("removed", "restarted"):
                q.misses.forget_worker(worker.id)
        policy = self._policies.get(key)
        if policy is None:
            return
        views = views_of(self._live(*key))
        if event == "restarted":  # leave, then join again: what was learned of its cache goes
            policy.on_workers_changed([v for v in views if v.worker_id != worker.id])
        policy.on_workers_changed(views)

    def select(self, request: RouteRequest, role: str = "regular") -> Selection:
        """Pick a worker of ``role`` for ``request``; raises NoWorkerAvailable.

        A pinned ``target_worker`` is resolved in one place, the policies' shared
        ``select_target`` (``policies/common.py``: id or url, available, not already
        failed this request), which every policy applies before its own choice."""
        pool = self._pool(request.model, role)
        live = pool.workers
        if request.target_worker or not request.exclude:
            views = views_of(live)
        else:
            # A failed attempt avoids its whole engine: its other DP ranks share its process.
            avoid = {engine_of(i) for i in request.exclude}
            views = views_of([w for w in live if w.engine_id not in avoid])
        if not request.target_worker:
            if not views:
                raise NoWorkerAvailable(f"no {role} worker registered for model {request.model!r}")
            if not any(map(_available, views)):
                views = _panic_views(live, views)
                if not views:
                    raise NoWorkerAvailable(f"no available {role} worker for model {request.model!r}")
            if self.slot_headroom >= 0 and self.gate is None:
                views = slot_bounded(views, self.slot_headroom)
            elif self.gate is not None and role == "regular" and self.gate.spills(CALLER.get()[0]):
                views = slot_bounded(views, 0)  # a key below its share: a free running slot before locality
        if self._before_select is not None:
            self._before_select()
        policy = self.policy(request.model, role)
        decision = policy.select(request, views)
        if self.gate is not None and role == "regular" and not request.target_worker:
            decision = reserved_prefill(self.gate, policy, request, views, decision)
        packed = policy.packed(request)  # cache_aware has packed the prompt already
        prompt = packed if packed is not None else b""
        # A retry offers nothing new to the sketch; both are statistics, applied off the request's path.
        offer = None if request.exclude else prompt if packed is not None else request.token_ids
        quality = self.quality(request.model, role)
        worker = pool.by_id.get(decision.worker_id)
        if worker is None:
            if offer is not None:
                later(quality.offered.offer, offer)
            raise NoWorkerAvailable(f"policy {policy.name} chose unknown worker {decision.worker_id!r}")
        notified = self._dispatching(request.model, role) if self._sink is not None else policy
        miss = MissTicket(worker.id, request.token_ids, decision.reason, packed=prompt)
        later(_dispatched, quality, offer, miss)
        return _build_selection(worker, decision, notified, role, prompt, miss)

    def exclude(self, request: RouteRequest, worker_id: str) -> RouteRequest:
        return replace(request, exclude=request.exclude | {worker_id})


def reserved_prefill(
    gate: WorkerGate, policy: Policy, request: RouteRequest, views: list[WorkerView], decision: Decision,
) -> Decision:
    """With the gate's prefill reservation, a cold prompt of a key with none lighter
    active goes to a worker with no cold prefill pending, while one is available
    (locality decides among them; among those with a running slot the key may take
    now, while any has one); a warm one stays where its prefix is, unless ``warm_reroute``
    and its worker has no running slot for it: then it goes to one that has (locality
    deciding among them), where it is prefilled cold at once rather than wait there for a
    heavier key's request to end its whole decode.
    Why: the gate keeps such a worker for it while a heavier key's cold prompts take
    the others, and there it is prefilled at once instead of after a step of theirs.
    A function of its own so the fairness replay (``bench fairness-replay``) routes by it too."""
    if gate.prefill_reserve:
        gate.know(v.worker_id for v in views)
    uncached = len(request.token_ids) - decision.predicted_cached_tokens
    tenant = CALLER.get()[0]
    chosen = decision.worker_id
    if uncached < gate.cold_tokens:
        if not gate.warm_reroute or gate.has_room(chosen, tenant) or not gate.reserves_for(tenant):
            return decision
        roomy = [v.available and gate.has_room(v.worker_id, tenant) for v in views]
        if not any(roomy):
            return decision
        return policy.select(request, [v if f else replace(v, available=False) for v, f in zip(views, roomy, strict=True)])
    if (not gate.cold_pending(chosen) and gate.has_room(chosen, tenant)) or not gate.reserves_for(tenant):
        return decision
    free = [v.available and not gate.cold_pending(v.worker_id) for v in views]
    if not any(free):
        return decision
    roomy = [f and gate.has_room(v.worker_id, tenant) for v, f in zip(views, free, strict=True)]
    if any(roomy):  # a worker with no slot for it would hold it for a whole decode instead
        free = roomy
    return policy.select(request, [v if f else replace(v, available=False) for v, f in zip(views, free, strict=True)])


def slot_bounded(views: list[WorkerView], headroom: int) -> list[WorkerView]:
    """``views`` with every worker whose ``max_running_requests + headroom`` slots are all
    taken marked unavailable, while another available worker has one free.

    Why: when the gateway queues at the fleet's running slots, the fleet as a whole has
    room for each request it admits, but a locality policy may still pile requests on the
    worker that holds their prefix while another sits idle; there they wait in the
    worker's first-come queue, where no key's share or priority holds, and a light key's
    request waits behind a heavy key's. Locality decides among the workers with room."""
    full = [
        v.available and 0 < v.max_running_requests and v.max_running_requests + headroom <= v.in_flight for v in views
    ]
    if not any(full) or not any(v.available and not f for v, f in zip(views, full, strict=True)):
        return views
    return [replace(v, available=False) if f else v for v, f in zip(views, full, strict=True)]


def _dispatched(quality: PoolQuality, offer: bytes | Sequence[int] | None, miss: MissTicket) -> None:
    """A first attempt's prompt to the pool's prefix sketch, and the dispatch to its miss ledger."""
    if offer is not None:
        quality.offered.offer(offer)
    quality.misses.dispatched(miss)


def _panic_views(live: Sequence[Worker], views: list[WorkerView]) -> list[WorkerView]:
    """Every breaker of the pool is open (no worker is down by its health checks):
    rather than refuse everyone, route among the healthy ones as if closed, as
    Envoy's panic threshold does. A breaker protects the pool from one bad worker;
    with none left it would turn a partial outage into a total one. Retries and
    resumption still move a failed request on."""
    by_id = {w.id: w for w in live}
    return [
        replace(v, available=True) for v in views
        if (w := by_id.get(v.worker_id)) is not None and w.healthy and not w.draining
    ]
