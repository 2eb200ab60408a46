"""Worker selection: policies per (model, role) pool over live worker views.

The router is the only place that turns registry state into ``WorkerView``
snapshots and asks a policy; the dispatcher calls it once per attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.policies.base import Decision, NoWorkerAvailable, Policy, RouteRequest, WorkerView
from gateway.policies.factory import close_policy
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
        registry.subscribe(self._on_registry_change)

    def policy(self, model: str, role: str) -> Policy:
        key = (model, role)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._make_policy(role)
            self._policies[key] = policy
            policy.on_workers_changed([w.view() for w in self._live(model, role)])
        return policy

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
        """Pick a worker of ``role`` for ``request``; raises NoWorkerAvailable."""
        candidates = [
            w for w in self._live(request.model, role) if w.id not in request.exclude
        ]
        if request.target_worker:
            target = self.registry.get(request.target_worker)
            if target is None or target.role != role or target.model != request.model:
                raise NoWorkerAvailable(f"target worker {request.target_worker!r} is not a {role} worker of model {request.model!r}")
            if not target.available:
                raise NoWorkerAvailable(f"target worker {request.target_worker!r} is not available")
            return Selection(target, Decision(target.id, "target_worker"), self.policy(request.model, role))
        if not candidates:
            raise NoWorkerAvailable(f"no {role} worker registered for model {request.model!r}")
        views = [w.view() for w in candidates]
        if not any(v.available for v in views):
            views = self._panic_views(candidates, views)
            if not views:
                raise NoWorkerAvailable(f"no available {role} worker for model {request.model!r}")
        policy = self.policy(request.model, role)
        decision = policy.select(request, views)
        by_id = {w.id: w for w in candidates}
        worker = by_id.get(decision.worker_id)
        if worker is None:
            raise NoWorkerAvailable(f"policy {policy.name} chose unknown worker {decision.worker_id!r}")
        return Selection(worker, decision, policy)

    @staticmethod
    def _panic_views(candidates: list[Worker], views: list[WorkerView]) -> list[WorkerView]:
        """Every breaker of the pool is open (no worker is down by its health checks):
        rather than refuse everyone, route among the healthy ones as if closed, as
        Envoy's panic threshold does. A breaker protects the pool from one bad worker;
        with none left it would turn a partial outage into a total one. Retries and
        resumption still move a failed request on."""
        return [
            replace(v, available=True) for w, v in zip(candidates, views, strict=True)
            if w.healthy and not w.draining
        ]

    def exclude(self, request: RouteRequest, worker_id: str) -> RouteRequest:
        return replace(request, exclude=request.exclude | {worker_id})
