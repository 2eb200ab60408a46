"""Cache-blind baselines: round robin, random, power of two choices, least load.

They are the yardsticks the token-prefix policies are measured against, and the
fallbacks a deployment can pick when prompts share nothing.
"""

from __future__ import annotations

import random
from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.common import BasePolicy, token_load

P2C_METRICS = ("in_flight", "polled_tokens")


class RoundRobinPolicy(BasePolicy):
    """Each request to the next available worker in turn."""

    name: str = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        w = cands[self._next % len(cands)]
        self._next += 1
        return Decision(w.worker_id, "round_robin")

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        return {"choice": cands[self._next % len(cands)].worker_id, "reason": "round_robin"}


class RandomPolicy(BasePolicy):
    """A uniformly random available worker (seedable for reproducible runs)."""

    name: str = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        return Decision(self._rng.choice(cands).worker_id, "random")

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        return {"choice": rng.choice(cands).worker_id, "reason": "random"}


class PowerOfTwoPolicy(BasePolicy):
    """Two random candidates; the less loaded one wins.

    ``metric="in_flight"`` compares the gateway's in-flight request counts;
    ``metric="polled_tokens"`` compares token load (the worker's polled used plus
    waiting-uncached tokens when ``loads`` is present, else the gateway's queued prefill
    plus running decode tokens) and asks the router to poll. Ties go to fewer
    in-flight requests, then to the first pick.
    """

    name: str = "power_of_two"

    def __init__(self, seed: int | None = None, metric: str = "in_flight") -> None:
        if metric not in P2C_METRICS:
            raise ValueError(f"power_of_two metric must be one of {P2C_METRICS}, not {metric!r}")
        self._rng = random.Random(seed)
        self.metric = metric
        self.needs_loads = metric == "polled_tokens"

    def _key(self, w: WorkerView) -> tuple[int, int]:
        if self.metric == "polled_tokens":
            return (token_load(w), w.in_flight)
        return (w.in_flight, 0)

    def _pick(self, rng: random.Random, cands: list[WorkerView]) -> tuple[WorkerView, list[str]]:
        if len(cands) == 1:
            return cands[0], [cands[0].worker_id]
        i, j = rng.sample(range(len(cands)), 2)
        a, b = cands[i], cands[j]
        return (b if self._key(b) < self._key(a) else a), [a.worker_id, b.worker_id]

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        w, _ = self._pick(self._rng, cands)
        return Decision(w.worker_id, "power_of_two")

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        w, pair = self._pick(rng, cands)
        return {"choice": w.worker_id, "reason": "power_of_two", "sampled": pair, "metric": self.metric}


class LeastLoadPolicy(BasePolicy):
    """The worker with the fewest in-flight requests, then the least token load.

    Exact ties rotate, so an idle pool is filled evenly rather than worker 0 first.
    """

    name: str = "least_load"

    def __init__(self) -> None:
        self._turn = 0

    @staticmethod
    def _pick(cands: list[WorkerView], turn: int) -> WorkerView:
        n = len(cands)
        best = cands[turn % n]
        best_key = (best.in_flight, token_load(best))
        for k in range(1, n):
            w = cands[(turn + k) % n]
            key = (w.in_flight, token_load(w))
            if key < best_key:
                best, best_key = w, key
        return best

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        w = self._pick(cands, self._turn)
        self._turn += 1
        return Decision(w.worker_id, "least_load")

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        return {"choice": self._pick(cands, self._turn).worker_id, "reason": "least_load"}
