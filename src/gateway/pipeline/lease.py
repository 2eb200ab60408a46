"""A dispatched request's hold on one worker, given back exactly once.

Sending a request to a worker takes things that must each be given back when the
request ends, whichever way it ends: a slot of the worker's load counter
(``workers/load.py``), the breaker's verdict on the worker (``Worker.record_outcome``),
the policy's bookkeeping (``on_dispatch`` / ``on_output`` / ``on_finish``), the
observer's figures (the relay stage, ``worker_done``), the progress watchdog's watch,
and the worker's side of the call (cancelled, and an Abort sent when the worker may
still be working on it). A :class:`Lease` takes them when it is made and gives them
back in :meth:`Lease.end`, which does its work once and is a no-op afterwards.

It is an async context manager: ``async with Lease(...) as lease:`` ends the lease
on the way out of the block with the outcome the block's exception says (none: OK;
a ``WorkerCallError``: the worker's failure or its refusal; a :class:`LeaseFailure`:
the verdict it carries; anything else, cancellation included: no verdict, and an
Abort if the request reached the worker), unless a longer-lived owner (a worker
stream) took it over with :meth:`Lease.hand_over` and ends it itself. Every kind of
request holds one per worker it reaches: a generation (one stream), each half of a
PD pair, an embedding, a pass-through call. So no ending (success, worker error,
stall, cancellation, the client going away, an Abort, a stream that ends without
output) can leak a slot, count twice or forget the worker's side.

The lease also keeps what the worker reported about the prompt (``cached_tokens``
and ``prompt_tokens``), so the policy learns the real cache hit and the observer
can compare the worker's prompt length with the gateway's tokenization.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from types import TracebackType

from gateway.pipeline.aborts import fire_abort
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.router import Router, Selection
from gateway.policies.base import RouteRequest
from gateway.workers.load import LoadGuard
from gateway.workers.transport import GenerateCall, WorkerCallError
from gateway.workers.worker import Worker


class Outcome(StrEnum):
    """How a leased request ended, as far as the worker's reputation goes."""

    OK = "ok"  # the worker did its part (it finished, or the gateway stopped it early)
    WORKER_FAILED = "worker_failed"  # error, stall, empty stream: counts against the worker
    REJECTED = "rejected"  # the worker refused the request as bad: the request failed, the worker is fine
    CANCELLED = "cancelled"  # the gateway gave up before the worker's verdict: no evidence either way


class LeaseFailure(Exception):
    """An ending the lease cannot tell from the exception's type: the worker went silent,
    sent nothing, or was taken out of rotation. Carries the verdict (``outcome``) and
    whether the worker must be told to stop (``abort``: the Abort's reason)."""

    def __init__(self, message: str, *, outcome: Outcome = Outcome.WORKER_FAILED, abort: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.abort = abort


class Lease:
    """Owns one request's load slot, breaker outcome, policy hooks, observer report,
    watchdog watch and the worker's side of the call."""

    __slots__ = (
        "_call",
        "_gate_exit",
        "_guard",
        "_held",
        "_kill",
        "_observer",
        "_router",
        "_sent",
        "_stage",
        "_started_at",
        "_unwatch",
        "cached_tokens",
        "gate_key",
        "outcome",
        "reported_prompt_tokens",
        "route",
        "selection",
        "sent_prompt_tokens",
        "stalled",
        "worker",
    )

    def __init__(
        self,
        router: Router,
        selection: Selection,
        route: RouteRequest,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        observer: PipelineObserver = NULL_OBSERVER,
        stage: str = "relay",
        silent: bool = False,
    ) -> None:
        worker = selection.worker
        self._router = router  # the pool's routing quality hears of the finish
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
        self._call: GenerateCall | None = None
        self._sent = False  # the request may have reached the worker: an early end sends Abort
        self._held = False  # a worker stream took the lease over and ends it itself
        self._unwatch: Callable[[], None] | None = None
        self._kill: Callable[[], None] | None = None  # what a stall does (None: the lease's own)
        self._gate_exit: Callable[[], None] | None = None  # gives back a worker-gate slot (pipeline.worker_gate)
        self.gate_key = 0  # its key in the prefill gate once sent (0: not tracked); its end is told to the siblings
        self.stalled = False  # the progress watchdog stopped the call
        self._guard: LoadGuard = worker.load.acquire(prompt_tokens, max_new_tokens, silent=silent)
        worker.breaker.on_dispatch()
        selection.policy.on_dispatch(route, selection.decision)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.outcome is not None or (self._held and exc is None):
            return
        if exc is None:
            self.end(Outcome.OK)
        elif isinstance(exc, LeaseFailure):
            self.end(exc.outcome, abort=exc.abort)
        elif isinstance(exc, WorkerCallError):
            self.end(Outcome.REJECTED if exc.rejected else Outcome.WORKER_FAILED)
        else:  # cancelled, or the gateway's own failure: no evidence about the worker
            self.end(Outcome.CANCELLED, abort="cancelled")

    def sent(self, call: GenerateCall | None = None) -> None:
        """The request is on its way to the worker (``call``: its stream, to cancel at the end)."""
        self._sent = True
        self._call = call

    def watch(self, kill: Callable[[], None] | None = None) -> None:
        """Let the progress watchdog stop the call when it finds the worker stalled (``kill``,
        by default: mark the lease stalled and cancel the call); replaces an earlier watch
        (the lease stays registered once: a worker stream taking over only swaps ``kill``)."""
        self._kill = kill
        if self._unwatch is None:
            self._unwatch = self.worker.progress.watch(self._on_stall)

    def _on_stall(self) -> None:
        self._unwatch = None  # a watchdog forgets every watch it fires: a later watch registers anew
        kill = self._kill
        if kill is not None:
            kill()
        else:
            self._watchdog_kill()

    def _watchdog_kill(self) -> None:
        self.stalled = True
        if self._call is not None:
            self._call.cancel()

    def gated(self, release: Callable[[], None]) -> None:
        """The request holds a slot of the worker gate: ``release`` gives it back when the lease ends."""
        self._gate_exit = release

    def hand_over(self) -> Lease:
        """A longer-lived owner (a worker stream) ends the lease; leaving the block does not."""
        self._held = True
        return self

    def output(self, output_ids: Sequence[int]) -> None:
        """The request finished on this worker with ``output_ids``: the worker caches them
        too now (the policy learns it, when it learns from output)."""
        self.selection.policy.on_output(self.route, self.worker.id, output_ids)

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

    def end(self, outcome: Outcome, *, abort: str | None = None, stop: bool = False, aborted: bool = False) -> bool:
        """Give everything back; True the first time, False (and nothing done) after.
        ``abort``: stop the call and send the worker an Abort with this reason (when the
        request reached it); ``stop``: cancel the call without an Abort (the worker is
        done with it); ``aborted``: the client stopped it (the observer's own outcome)."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._kill = None  # a worker stream's bound method: kept, it would close a reference cycle
        call = self._call
        if call is not None and (stop or abort is not None):
            call.cancel()
        if abort is not None and self._sent:
            fire_abort(self.worker, self.route.request_id, abort)
        self._guard.release()
        gate_exit = self._gate_exit
        if gate_exit is not None:
            self._gate_exit = None
            gate_exit()
        if self.gate_key:
            self._router.holds.ended(self.gate_key)
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
            self._router.finished(
                self.route, self.selection.role, predicted_cached=self.selection.decision.predicted_cached_tokens,
                reported_cached=self.cached_tokens, sent_prompt=self.sent_prompt_tokens,
                reported_prompt=self.reported_prompt_tokens, success=success, miss=self.selection.miss,
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
            self._router.abandoned(self.route, self.selection.role, self.selection.miss)
        return True
