"""A dispatched request's hold on one worker, given back exactly once.

Sending a request to a worker takes four things that must each be given back
when the request ends, whichever way it ends: a slot of the worker's load counter
(``workers/load.py``), the breaker's verdict on the worker (``Worker.record_outcome``),
the policy's bookkeeping (``on_dispatch`` / ``on_finish``) and the observer's
figures (the relay stage, ``worker_done``). A :class:`Lease` takes all four when it
is made and gives them back in :meth:`Lease.release`, which does its work once and
is a no-op afterwards. Every kind of request holds one per worker it reaches:
a generation (one stream), each half of a PD pair, an embedding, a pass-through
call. So no ending (success, worker error, stall, cancellation, the client going
away, an Abort, a stream that ends without output) can leak a slot or count twice.

The lease also keeps what the worker reported about the prompt (``cached_tokens``
and ``prompt_tokens``), so the policy learns the real cache hit and the observer
can compare the worker's prompt length with the gateway's tokenization.
"""

from __future__ import annotations

import time
from enum import StrEnum

from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.router import Selection
from gateway.policies.base import RouteRequest
from gateway.workers.load import LoadGuard
from gateway.workers.worker import Worker


class Outcome(StrEnum):
    """How a leased request ended, as far as the worker's reputation goes."""

    OK = "ok"  # the worker did its part (it finished, or the gateway stopped it early)
    WORKER_FAILED = "worker_failed"  # error, stall, empty stream: counts against the worker
    REJECTED = "rejected"  # the worker refused the request as bad: the request failed, the worker is fine
    CANCELLED = "cancelled"  # the gateway gave up before the worker's verdict: no evidence either way


class Lease:
    """Owns one request's load slot, breaker outcome, policy notification and observer report."""

    __slots__ = (
        "_guard",
        "_observer",
        "_stage",
        "_started_at",
        "cached_tokens",
        "outcome",
        "reported_prompt_tokens",
        "route",
        "selection",
        "sent_prompt_tokens",
        "worker",
    )

    def __init__(
        self,
        selection: Selection,
        route: RouteRequest,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        observer: PipelineObserver = NULL_OBSERVER,
        stage: str = "relay",
    ) -> None:
        worker = selection.worker
        self.selection = selection
        self.worker: Worker = worker
        self.route = route
        self.sent_prompt_tokens = prompt_tokens
        self.cached_tokens = 0  # the most the worker reported (cumulative counts only grow)
        self.reported_prompt_tokens = 0
        self.outcome: Outcome | None = None
        self._observer = observer
        self._stage = stage
        self._started_at: float | None = None
        self._guard: LoadGuard = worker.load.acquire(prompt_tokens, max_new_tokens)
        worker.breaker.on_dispatch()
        selection.policy.on_dispatch(route, selection.decision)

    @property
    def released(self) -> bool:
        return self.outcome is not None

    @property
    def started(self) -> bool:
        """Whether the worker produced output (its prefill is done)."""
        return self._started_at is not None

    def start(self) -> None:
        """The worker's first output arrived: prefill done, the relay begins."""
        if self._started_at is None:
            self._started_at = time.perf_counter()
            self._guard.first_token()

    def report(self, *, cached_tokens: int = 0, prompt_tokens: int = 0) -> None:
        """Counts the worker sent (cumulative; the largest seen is kept)."""
        if cached_tokens > self.cached_tokens:
            self.cached_tokens = cached_tokens
        if prompt_tokens > self.reported_prompt_tokens:
            self.reported_prompt_tokens = prompt_tokens

    def release(self, outcome: Outcome, *, aborted: bool = False) -> bool:
        """Give everything back; True the first time, False (and nothing done) after.
        ``aborted``: the client stopped it (reported to the observer as its own outcome)."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self._guard.release()
        worker = self.worker
        if outcome is Outcome.OK or outcome is Outcome.REJECTED:
            worker.record_outcome(True)
        elif outcome is Outcome.WORKER_FAILED:
            worker.record_outcome(False)
        else:
            worker.record_outcome(None)  # no evidence; a half-open trial slot is given back
        success = outcome is Outcome.OK
        self.selection.policy.on_finish(self.route, worker.id, self.cached_tokens, success)
        if self._started_at is not None:
            self.selection.finished(
                self.route, reported_cached=self.cached_tokens, sent_prompt=self.sent_prompt_tokens,
                reported_prompt=self.reported_prompt_tokens, success=success,
            )
            self._observer.stage(self._stage, time.perf_counter() - self._started_at)
            self._observer.worker_done(
                self.route.model, worker.id,
                predicted_cached=self.selection.decision.predicted_cached_tokens,
                reported_cached=self.cached_tokens, success=success,
                sent_prompt=self.sent_prompt_tokens, reported_prompt=self.reported_prompt_tokens,
                aborted=aborted,
            )
        else:
            self.selection.abandoned(self.route)
        return True
