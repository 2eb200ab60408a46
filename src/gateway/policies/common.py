"""What every policy shares: candidate filtering, the explicit target worker, no-op hooks.

``BasePolicy.select`` first honours ``RouteRequest.target_worker`` (a worker id or url,
from the ``X-SMG-Target-Worker`` header) before any policy logic, then keeps the
workers that are available and not excluded by a retry, and only then asks the
subclass's ``_choose`` among those candidates (never an empty list).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from gateway.policies.base import Decision, NoWorkerAvailable, RemoteEvent, RouteRequest, WorkerView

TARGET_REASON = "target_worker"


def _norm_url(url: str) -> str:
    url = url.strip().rstrip("/")
    _, sep, rest = url.partition("://")
    return rest if sep else url


def find_target(target: str, workers: Sequence[WorkerView]) -> WorkerView | None:
    """The worker named by ``target``: an exact worker id, else a url (scheme and trailing
    slash ignored)."""
    for w in workers:
        if w.worker_id == target:
            return w
    want = _norm_url(target)
    for w in workers:
        if _norm_url(w.url) == want:
            return w
    return None


def select_target(request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
    """The explicit target worker, or NoWorkerAvailable saying why it cannot be used."""
    target = request.target_worker or ""
    w = find_target(target, workers)
    if w is None:
        known = ", ".join(sorted(v.worker_id for v in workers)) or "none"
        raise NoWorkerAvailable(
            f"target worker {target!r} is not in pool {request.pool!r} (workers: {known})"
        )
    if not w.available:
        raise NoWorkerAvailable(f"target worker {target!r} ({w.worker_id}) is unavailable")
    if w.worker_id in request.exclude:
        raise NoWorkerAvailable(
            f"target worker {target!r} ({w.worker_id}) already failed this request"
        )
    return w


def candidates(request: RouteRequest, workers: Sequence[WorkerView]) -> list[WorkerView]:
    """Available workers not excluded by a retry (raises NoWorkerAvailable when none)."""
    ex = request.exclude
    if ex:
        out = [w for w in workers if w.available and w.worker_id not in ex]
    else:
        out = [w for w in workers if w.available]
    if not out:
        if not workers:
            raise NoWorkerAvailable(f"no worker registered in pool {request.pool!r}")
        raise NoWorkerAvailable(
            f"none of the {len(workers)} workers in pool {request.pool!r} is available"
            + (f" (excluded: {', '.join(sorted(ex))})" if ex else "")
        )
    return out


def token_load(w: WorkerView) -> int:
    """Work queued on a worker in tokens: polled figures when present, else the gateway's own."""
    if w.loads is not None:
        return w.loads.num_used_tokens + w.loads.num_waiting_uncached_tokens
    return w.queued_prefill_tokens + w.remote_prefill_tokens + w.running_decode_tokens


def worker_row(w: WorkerView) -> dict[str, Any]:
    """The load figures of one worker, for ``explain``."""
    row: dict[str, Any] = {
        "url": w.url,
        "available": w.available,
        "in_flight": w.in_flight,
        "queued_prefill_tokens": w.queued_prefill_tokens,
        "running_decode_tokens": w.running_decode_tokens,
    }
    if w.loads is not None:
        row["polled_used_tokens"] = w.loads.num_used_tokens
        row["polled_waiting_uncached_tokens"] = w.loads.num_waiting_uncached_tokens
        row["polled_age_s"] = w.loads.age_s
    return row


class BasePolicy(ABC):
    """Target handling, candidate filtering and no-op hooks; subclasses implement ``_choose``."""

    name: str = "base"
    needs_loads: bool = False

    def select(self, request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        if request.target_worker:
            w = select_target(request, workers)
            return Decision(w.worker_id, TARGET_REASON, self._predict_cached(request, w))
        return self._choose(request, candidates(request, workers))

    @abstractmethod
    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        """Pick one of ``cands`` (available, not excluded, never empty)."""

    def _predict_cached(self, request: RouteRequest, worker: WorkerView) -> int:
        """Tokens of the prompt the policy thinks ``worker`` has cached (0 if it cannot tell)."""
        return 0

    def on_dispatch(self, request: RouteRequest, decision: Decision) -> None:
        return None

    def on_finish(
        self, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool
    ) -> None:
        return None

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        return None

    remote_finishes = False  # on_remote needs no RemoteFinish (the sync layer then builds none)
    learn_output = False  # on_output learns nothing

    def on_remote(self, event: RemoteEvent) -> object:
        """Another gateway process's decision, extension or finish (``sync``); stateless
        policies ignore it (and have no mark to return)."""
        return None

    def on_output(self, request: RouteRequest, worker_id: str, output_ids: Sequence[int]) -> None:
        return None

    def packed(self, request: RouteRequest) -> bytes | None:
        return None

    def set_load_only(self, model: str, on: bool) -> None:
        return None

    def quality(self) -> dict[str, Any]:
        return {}

    def explain(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        """What the policy would do and why, without changing its state."""
        out: dict[str, Any] = {
            "policy": self.name,
            "workers": {w.worker_id: worker_row(w) for w in workers},
        }
        out.update(self._explain_choice(request, workers))
        return out

    def _explain_choice(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        if request.target_worker:
            try:
                w = select_target(request, workers)
            except NoWorkerAvailable as exc:
                return {"error": str(exc)}
            return {"choice": w.worker_id, "reason": TARGET_REASON}
        try:
            cands = candidates(request, workers)
        except NoWorkerAvailable as exc:
            return {"error": str(exc)}
        return self._explain_candidates(request, cands)

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Release background resources (threads); safe to call twice."""
        return None
