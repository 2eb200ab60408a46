"""Worker selection: policies per (model, role) pool over live worker views.

The router is the only place that turns registry state into ``WorkerView``
snapshots and asks a policy; the dispatcher calls it once per attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.policies.base import Decision, NoWorkerAvailable, Policy, RouteRequest
from gateway.policies.factory import close_policy
from gateway.sync.policy_tap import DecisionSink, TappedPolicy
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)

PolicyMaker = Callable[[str], Policy]  # role -> a fresh policy for one pool


@dataclass(frozen=True, slots=True)
class Selection:
    worker: Worker
    decision: Decision
    policy: Policy


class Router:
    def __init__(self, registry: WorkerRegistry, make_policy: PolicyMaker) -> None:
        self.registry = registry
        self._make_policy = make_policy
        self._policies: dict[tuple[str, str], Policy] = {}
        self._sink: DecisionSink | None = None  # gateway.sync: other processes hear of decisions
        self._taps: dict[tuple[str, str], TappedPolicy] = {}
        registry.subscribe(self._on_registry_change)

    def policy(self, model: str, role: str) -> Policy:
        key = (model, role)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._make_policy(role)
            self._policies[key] = policy
            policy.on_workers_changed([w.view() for w in self._live(model, role)])
        return policy

    def tap(self, sink: DecisionSink) -> None:
        """Tell ``sink`` of every dispatch and finish (the dispatcher gets tapped policies)."""
        self._sink = sink
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

    def reset_policies(self) -> None:
        """Forget what every policy learned (the workers' caches were flushed); fresh
        policies are made on the next request."""
        old, self._policies = self._policies, {}
        for policy in old.values():
            close_policy(policy)

    def _live(self, model: str, role: str) -> list[Worker]:
        return [w for w in self.registry.pool(model, role) if not w.draining]

    def _on_registry_change(self, event: str, worker: Worker) -> None:
        key = (worker.model, worker.role)
        policy = self._policies.get(key)
        if policy is not None:
            policy.on_workers_changed([w.view() for w in self._live(*key)])

    def select(self, request: RouteRequest, role: str = "regular") -> Selection:
        """Pick a worker of ``role`` for ``request``; raises NoWorkerAvailable.

        A pinned ``target_worker`` is resolved in one place, the policies' shared
        ``select_target`` (``policies/common.py``: id or url, available, not already
        failed this request), which every policy applies before its own choice."""
        live = self._live(request.model, role)
        if request.target_worker:
            views = [w.view() for w in live]
        else:
            views = [w.view() for w in live if w.id not in request.exclude]
            if not views:
                raise NoWorkerAvailable(f"no {role} worker registered for model {request.model!r}")
            if not any(v.available for v in views):
                raise NoWorkerAvailable(f"no available {role} worker for model {request.model!r}")
        policy = self.policy(request.model, role)
        decision = policy.select(request, views)
        worker = next((w for w in live if w.id == decision.worker_id), None)
        if worker is None:
            raise NoWorkerAvailable(f"policy {policy.name} chose unknown worker {decision.worker_id!r}")
        return Selection(worker, decision, self._dispatching(request.model, role) if self._sink is not None else policy)

    def exclude(self, request: RouteRequest, worker_id: str) -> RouteRequest:
        return replace(request, exclude=request.exclude | {worker_id})
