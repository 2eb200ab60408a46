"""Send a request to a worker, retrying on another worker until output starts.

``open_generate`` is the gateway's one retry loop. It returns a ``WorkerStream``
only once the worker has produced its first message, so a request that fails
before any output reaches the client is retried elsewhere and one that fails
after is never replayed. Each attempt holds a :class:`~gateway.pipeline.lease.Lease`
on its worker (load slot, breaker outcome, policy, observer, watchdog and the worker's
side of the call) in an ``async with`` block, which ends it once on every ending:
completion, worker error, stall, or cancellation; an opened stream takes it over.
Embeddings take the same loop (``call_embed``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gateway.pipeline.deadline import worker_timeout
from gateway.pipeline.errors import map_rpc_error, no_worker_error, worker_stalled_error
from gateway.pipeline.lease import Lease, LeaseFailure, Outcome
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.prefill_gate import PrefillGateConfig
from gateway.pipeline.retry import RetryConfig
from gateway.pipeline.router import Router, Selection
from gateway.pipeline.running_loop import cancelling, running_loop
from gateway.pipeline.worker_gate import NO_GATE
from gateway.policies.base import NoWorkerAvailable, RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.settings import option
from gateway.workers.h2.call import H2Call
from gateway.workers.liveness import answers_probe
from gateway.workers.sglang_http import HttpGenerateCall
from gateway.workers.transport import END_OF_STREAM, EndOfStream, GenerateCall, WorkerCallError
from gateway.workers.watchdog import stalled
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)

BuildRequest = Callable[[Selection], pb.GenerateRequest]
T = TypeVar("T")


@dataclass
class DispatchConfig(PrefillGateConfig):
    request_timeout_s: float = option(600.0, "gRPC deadline for one generation on a worker, seconds")
    first_token_timeout_s: float = option(180.0, "last-resort cap on the wait for a request's first message, seconds (a stalled worker is caught sooner by the progress watchdog, --watchdog-*)")
    stall_timeout_s: float = option(30.0, "give up on one stream that goes silent for this long after it started while its worker stays busy elsewhere, seconds")


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    """How an answer asked for unstreamed is waited for (``_whole_answer``): ``budget`` output
    tokens at most (the client's cap, or what the model's context leaves after the prompt;
    0: the request's own ``max_new_tokens``, if any) and ``check_s``, the longest its worker
    may go unheard on every call before a health probe must show that it runs."""

    budget: int = 0
    check_s: float = math.inf


class TokenStream(Protocol):
    """What ``Generation`` reads: one worker's stream, or a PD pair's decode side."""

    @property
    def worker(self) -> Worker: ...

    @property
    def observer(self) -> PipelineObserver: ...

    @property
    def closed(self) -> bool: ...

    async def abort(self, reason: str = ...) -> None: ...

    async def read(self) -> pb.GenerateResponse | None: ...

    def ready(self) -> bool: ...  # read() would not wait (False when it cannot tell)

    def finished(self) -> None: ...

    def output(self, output_ids: Sequence[int]) -> None: ...  # the one sample's output, to the policy

    async def aclose(self) -> None: ...


# The calls that hand each delivery to a listener (``pusher``) while their reader waits.
_PUSHING = (H2Call, HttpGenerateCall)


class PushTarget(Protocol):
    """Who takes a stream's messages as they arrive (``WorkerStream.listen``)."""

    def offer(self, msg: pb.GenerateResponse) -> bool: ...  # True: taken (chunks only; else the reader gets it)

    def flush(self) -> None: ...  # the end of one delivery: hand on what was taken


class WorkerStream:
    """A live Generate call on the worker that accepted the request.

    It took the opening's :class:`Lease` over; every way out of the stream (the last
    message, a worker error, a stall, ``abort``, ``finished``) ends it once."""

    def __init__(
        self,
        lease: Lease,
        call: GenerateCall,
        first: pb.GenerateResponse,
        config: DispatchConfig,
        attempts: int,
        observer: PipelineObserver = NULL_OBSERVER,
    ) -> None:
        self.lease = lease
        self.selection = lease.selection
        self.worker = lease.worker
        self.route = lease.route
        self.request_id = lease.route.request_id
        self.attempts = attempts
        self._call = call
        self._pending: pb.GenerateResponse | None = first
        self._config = config
        self.observer = observer
        # Stall watch: one timer per stream rather than an asyncio.timeout around every
        # read (those showed in the relay profile; see docs/BENCHMARKS.md, Gateway overhead).
        self._reading_since: float | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._loop = running_loop()
        self._stalled = False
        self._first = True  # no message read yet
        lease.watch(self._watchdog_kill)
        self._call_ready: Callable[[], bool] = call.ready
        # Arrived messages without ``read()``'s coroutines (the gateway's own calls: ``read_arrived``).
        self._take_all: Callable[[], list[pb.GenerateResponse]] | None = (
            call.take_all if isinstance(call, _PUSHING) else None
        )
        self._target: PushTarget | None = None  # takes messages as they arrive (``listen``)
        self._push_error: BaseException | None = None  # the target's failure, for the reader

    @property
    def closed(self) -> bool:
        return self.lease.released

    def ready(self) -> bool:
        """``read`` would return without waiting: a message (or the end) has arrived. The
        relay hands the tokens that arrived together to its client in one write."""
        return self._pending is not None or self._call_ready()

    def read_arrived(self) -> list[pb.GenerateResponse]:
        """``read()`` of every message that has already arrived, in order, without its
        coroutines (the relay takes the tokens that came together in one call, not one per
        token), counted as ``read()`` counts them: one progress stamp for the lot (they came
        together, as a push delivery's do) and the largest counts to the lease. Empty when
        none has arrived (``read()`` then waits, or reports the end, a failure or a stall)."""
        msg = self._pending
        if msg is not None:
            self._pending = None
            msgs = [msg]
        else:
            take_all = self._take_all
            if take_all is None or self._stalled:  # a stall verdict is ``read()``'s to report
                return []
            msgs = take_all()
            if not msgs:
                return msgs
            self.worker.progress.message(time.monotonic())
        lease = self.lease
        if self._first:  # the worker's first output: its prefill is done
            self._first = False
            lease.start()
        # ``_count`` for each message, inline: the lease keeps the largest counts.
        most_cached = lease.cached_tokens
        most_prompt = lease.reported_prompt_tokens
        for m in msgs:
            which = m.WhichOneof("response")
            if which == "chunk":
                part = m.chunk
            elif which == "complete":
                part = m.complete  # type: ignore[assignment]
            else:
                continue
            cached, prompt = part.cached_tokens, part.prompt_tokens
            if cached > most_cached:
                most_cached = cached
            if prompt > most_prompt:
                most_prompt = prompt
        if most_cached > lease.cached_tokens or most_prompt > lease.reported_prompt_tokens:
            lease.report(cached_tokens=most_cached, prompt_tokens=most_prompt)
        return msgs

    async def read(self) -> pb.GenerateResponse | None:
        """The next message, or None when the worker ended the stream."""
        if self._pending is not None:
            msg, self._pending = self._pending, None
        else:
            loop = self._loop
            self._reading_since = loop.time()
            if self._watch is None:
                self._watch = loop.call_at(self._reading_since + self._config.stall_timeout_s, self._check_stall)
            try:
                got = await self._call.read()
            except asyncio.CancelledError:
                failed = self._push_error
                if failed is not None and not cancelling():
                    self._push_error = None
                    raise failed from None  # the target's failure stopped the call: as if read here
                if not self._stalled or cancelling():
                    raise  # our own task is being cancelled (client gone): not a stall
                self._end_stalled()
                raise worker_stalled_error(self.worker.id, self._config.stall_timeout_s) from None
            except WorkerCallError as exc:
                self._end(Outcome.WORKER_FAILED)
                raise map_rpc_error(exc, self.worker.id) from exc
            finally:
                self._reading_since = None
            if self._stalled:  # the message raced the stall verdict; the call is cancelled
                self._end_stalled()
                raise worker_stalled_error(self.worker.id, self._config.stall_timeout_s)
            if got is END_OF_STREAM:
                self._end(Outcome.OK)
                return None
            msg = got  # type: ignore[assignment]
            self.worker.progress.message(time.monotonic())
        lease = self.lease
        if self._first:  # the worker's first output: its prefill is done
            self._first = False
            lease.start()
        self._count(msg)
        return msg

    def _count(self, msg: pb.GenerateResponse) -> None:
        """The message's cumulative counts to the lease, which keeps the largest (after the
        first message they seldom grow: asked here, not by a call per message)."""
        which = msg.WhichOneof("response")
        if which == "chunk":
            part = msg.chunk
        elif which == "complete":
            part = msg.complete  # type: ignore[assignment]
        else:
            return
        lease = self.lease
        cached, prompt = part.cached_tokens, part.prompt_tokens
        if cached > lease.cached_tokens or prompt > lease.reported_prompt_tokens:
            lease.report(cached_tokens=cached, prompt_tokens=prompt)

    def listen(self, target: PushTarget | None) -> bool:
        """While ``read`` waits, let ``target`` take each message as it arrives, in the
        connection's read callback (an HTTP worker's call: its reading task; no wake-up of
        the reader per message); the reader
        wakes for the first message ``target`` does not take, the end, an error or a stall.
        Each delivery it takes from counts as the reader's (progress stamp, stall clock,
        lease counts). None stops it. False: this stream's call cannot (read only)."""
        call = self._call
        if not isinstance(call, _PUSHING):
            return False
        self._target = target
        call.pusher = self._push if target is not None and not self.closed else None
        return True

    def _push(self, inbox: deque[pb.GenerateResponse]) -> None:
        """The call's ``pusher``: hand the queued messages to the target while it takes them.
        A failure of the target is the reader's (``read`` raises it)."""
        target = self._target
        if target is None or self._stalled or self._push_error is not None:
            return
        lease = self.lease
        took = False
        try:
            while inbox and target.offer(inbox[0]):
                part = inbox.popleft().chunk
                took = True
                cached, prompt = part.cached_tokens, part.prompt_tokens  # as ``_count``, for a chunk
                if cached > lease.cached_tokens or prompt > lease.reported_prompt_tokens:
                    lease.report(cached_tokens=cached, prompt_tokens=prompt)
            if took:
                target.flush()
        except Exception as exc:  # the reader raises it, which ends the request
            self._push_error = exc
            self._target = None
            self._call.cancel()  # wakes the reader (the message it failed on is dropped with the call)
            return
        if took:
            self.worker.progress.message(time.monotonic())
            self._reading_since = self._loop.time()  # the wait for the next message starts now

    def _check_stall(self) -> None:
        """The stall timer: cancel the call if the pending read has waited too long,
        else wait again (a read that is not pending re-arms the timer itself)."""
        self._watch = None
        since = self._reading_since
        if self.closed or since is None:
            return
        limit = self._config.stall_timeout_s
        loop = self._loop
        if loop.time() - since >= limit:
            self._stalled = True
            self._call.cancel()  # the pending read raises CancelledError; read() maps it
            return
        self._watch = loop.call_at(since + limit, self._check_stall)

    def _watchdog_kill(self) -> None:
        """The progress watchdog found this stream's worker stalled: end the pending read
        as a stall, so the generation resumes elsewhere."""
        if not self.closed:
            self._stalled = True
            self._call.cancel()

    def _end_stalled(self) -> None:
        """The worker went silent: stop it and count it against the worker."""
        self._end(Outcome.WORKER_FAILED, abort="stalled")

    def _end(self, outcome: Outcome, *, abort: str | None = None, stop: bool = False, aborted: bool = False) -> None:
        if self._target is not None:
            self.listen(None)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.lease.end(outcome, abort=abort, stop=stop, aborted=aborted)

    async def abort(self, reason: str = "client gone") -> None:
        """Stop the worker's work for this request now and free the slot."""
        if not self.closed:  # not the worker's fault; counted as its own outcome
            self._end(Outcome.OK, abort=reason, aborted=True)

    def finished(self) -> None:
        """Every sample completed on the worker: free the slot without an Abort."""
        if not self.closed:
            self._end(Outcome.OK, stop=True)

    def output(self, output_ids: Sequence[int]) -> None:
        """The request finished here with ``output_ids``: through the lease, the policy learns them."""
        self.lease.output(output_ids)

    async def aclose(self) -> None:
        """End the stream early (a stop string matched, or the client went away)."""
        await self.abort("finished by gateway")


class AttemptFailed(LeaseFailure):
    """One try on one worker failed before any output; leaving the lease's block ends
    the lease with ``outcome`` (and an Abort when ``abort`` names one).

    ``retryable`` says whether another worker may be tried; ``backoff`` whether to
    sleep first (a worker error, not a timeout or an empty stream)."""

    def __init__(
        self, error: Exception, worker_id: str, reason: str, *, retryable: bool, backoff: bool,
        outcome: Outcome = Outcome.WORKER_FAILED, abort: str | None = None,
    ) -> None:
        super().__init__(str(error), outcome=outcome, abort=abort)
        self.error = error
        self.worker_id = worker_id
        self.reason = reason  # the gRPC code's name, or what else went wrong (for metrics)
        self.retryable = retryable
        self.backoff = backoff


def select(router: Router, route: RouteRequest, role: str, observer: PipelineObserver) -> Selection:
    """One attempt's choice of worker, timed and reported (raises NoWorkerAvailable)."""
    picking = time.perf_counter()
    selection = router.select(route, role)
    observer.stage("select", time.perf_counter() - picking)
    observer.selected(selection.policy.name, selection.decision.reason, selection.worker.id)
    return selection


async def open_on(
    router: Router,
    selection: Selection,
    route: RouteRequest,
    request: pb.GenerateRequest,
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    retry: RetryConfig,
    config: DispatchConfig,
    attempt: int = 1,
    observer: PipelineObserver = NULL_OBSERVER,
    whole: WholeAnswer = WholeAnswer(),
) -> WorkerStream:
    """Send ``request`` to the selected worker and wait for its first message (``whole``:
    how an unstreamed one is waited for).

    Raises :class:`AttemptFailed` (lease released) when the worker fails, stalls or
    says nothing; on cancellation aborts the worker request and releases the lease.
    """
    worker = selection.worker
    started = time.monotonic()
    # A whole answer asked for unstreamed says nothing until it is done: the watchdog
    # leaves it out and it gets a deadline of its own (PD halves keep the shared rules).
    silent = not request.stream and not request.HasField("disaggregated_params")
    worker.progress.started(started, idle=worker.load_figures()[0] == 0)
    gate_key = 0
    gate_pass = NO_GATE
    async with Lease(
        router, selection, route, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, observer=observer,
        silent=silent,
    ) as lease:
        lease.watch()
        try:
            gate = router.gate
            if gate is not None and selection.role == "regular" and worker.info.max_running_requests > 0:
                # Its running slots may all be taken: wait here, in fair order, not in its first-come queue.
                # (Not a PD half: held apart from its partner, the other half would wait for it on the worker.)
                # Its prefill is paced too: the tokens the policy predicts it must compute there.
                uncached = max(0, prompt_tokens - selection.decision.predicted_cached_tokens)
                gate_pass = await gate.enter(worker.id, worker.info.max_running_requests, uncached)
                lease.gated(gate_pass)
                if gate_pass.waited:
                    if not worker.available:  # it failed or was taken out of rotation meanwhile
                        raise AttemptFailed(
                            no_worker_error(f"worker {worker.id} left rotation while the request waited for a slot"),
                            worker.id, "HELD_WORKER_UNAVAILABLE", retryable=True, backoff=False,
                            outcome=Outcome.CANCELLED,
                        )
                    started = time.monotonic()  # the learned prefill rate counts the worker's time only
            if config.prefill_gate:
                hold = router.holds.check(selection, config)
                if hold is not None:  # its prefix is being prefilled on this worker now: wait for that
                    await router.holds.wait(hold, route.model, selection.role)
                    if not worker.available:  # it failed or was taken out of rotation meanwhile
                        raise AttemptFailed(
                            no_worker_error(f"worker {worker.id} left rotation while the request was held"),
                            worker.id, "HELD_WORKER_UNAVAILABLE", retryable=True, backoff=False,
                            outcome=Outcome.CANCELLED,
                        )
                    started = time.monotonic()  # the learned prefill rate counts the worker's time only
                # In prefill until the first message or any other ending (``finally`` below):
                # the gate holds requests sharing its prefix on this worker until then.
                gate_key = router.holds.dispatched(selection)
                lease.gate_key = gate_key
            worker.pin(request)  # a DP rank runs it where its prefix is
            call = worker.client.generate(request, timeout=worker_timeout(config.request_timeout_s))
            lease.sent(call)
            if silent:
                if gate_pass.tokens:  # no first message before the whole answer: free the budget at its expected prefill
                    rate = worker.progress.prefill_tps or config.prefill_gate_default_tps
                    running_loop().call_later(gate_pass.tokens / rate, gate_pass.prefilled)
                first = await _whole_answer(call, worker, request, started, config, whole)
            else:
                async with asyncio.timeout(config.first_token_timeout_s):
                    first = await call.read()
        except asyncio.CancelledError:
            if lease.stalled and not cancelling():
                # The progress watchdog took the worker out of rotation: re-send elsewhere now.
                raise AttemptFailed(
                    worker_stalled_error(worker.id, time.monotonic() - started), worker.id, "WATCHDOG",
                    retryable=True, backoff=False, abort="worker stalled",
                ) from None
            raise
        except AnswerOverdue as overdue:
            # The watchdog's verdict, reached by this call's deadline: the worker's other
            # live requests move too (this one's own watch goes when the lease ends).
            stalled(worker, time.monotonic(), overdue.silent_s, overdue.allowed_s)
            raise AttemptFailed(
                worker_stalled_error(worker.id, overdue.silent_s), worker.id, "ANSWER_OVERDUE",
                retryable=True, backoff=False, abort="worker stalled",
            ) from None
        except TimeoutError:
            raise AttemptFailed(
                worker_stalled_error(worker.id, config.first_token_timeout_s), worker.id, "FIRST_TOKEN_TIMEOUT",
                retryable=True, backoff=False, abort="first token timeout",
            ) from None
        except WorkerCallError as exc:
            raise AttemptFailed(
                map_rpc_error(exc, worker.id), worker.id, exc.code.name, retryable=retry.retryable(exc.code),
                backoff=True, outcome=Outcome.REJECTED if exc.rejected else Outcome.WORKER_FAILED,
            ) from exc
        finally:
            gate_pass.prefilled()  # its prefill is done (or will never be): the worker's budget frees
            if gate_key:
                router.holds.prefilled(gate_key)
        if isinstance(first, EndOfStream):
            raise AttemptFailed(
                map_rpc_error(None, worker.id, "worker closed the stream without output"),
                worker.id, "EMPTY_STREAM", retryable=True, backoff=False,
            )
        now = time.monotonic()
        worker.progress.message(now, first=True)
        if silent:  # the whole answer's time: its pace per token, not a prefill rate
            worker.progress.whole_answer(len(first.complete.output_ids), now - started)
        else:
            cached = first.chunk.cached_tokens if first.HasField("chunk") else first.complete.cached_tokens
            worker.progress.first_message(prompt_tokens - cached, now - started)
        log.debug("request %s on %s", route.request_id, worker.id)
        return WorkerStream(lease.hand_over(), call, first, config, attempt, observer)


class AnswerOverdue(Exception):
    """A whole answer asked for unstreamed is past its deadline and its worker sent
    nothing on any call meanwhile: the worker is taken for stalled."""

    def __init__(self, silent_s: float, allowed_s: float) -> None:
        super().__init__(f"silent for {silent_s:.1f} s (allowed {allowed_s:.1f} s)")
        self.silent_s = silent_s
        self.allowed_s = allowed_s


async def _whole_answer(
    call: GenerateCall, worker: Worker, request: pb.GenerateRequest, started: float, config: DispatchConfig,
    whole: WholeAnswer,
) -> pb.GenerateResponse | EndOfStream:
    """Wait for an unstreamed call's one answer.

    Its deadline is the worker's expected time for it (``ProgressTracker.answer_allowed_s``:
    the prefill of the prompts the worker holds and the answer's token budget at its learned
    pace, times a factor), checked no later than ``whole.check_s``. At each check, a worker
    heard from within that time (a message on any call, an answered probe) is busy, not hung,
    and is waited for again; one unheard is asked directly (``liveness.answers_probe``, within
    the silence the watchdog allows it), and if it does not answer either it is stalled
    (:class:`AnswerOverdue`). The last resort is ``first_token_timeout_s`` or the deadline,
    whichever is longer (the call's own gRPC deadline still applies). A dead worker or
    connection ends the read at once (the call's error), and the progress watchdog's verdict
    on the worker's streamed calls cancels this one too. The client has seen nothing: the
    caller retries elsewhere."""
    params = request.sampling_params
    budget = whole.budget or (params.max_new_tokens if params.HasField("max_new_tokens") else 0)
    progress = worker.progress

    def allowed_s() -> float:
        return min(progress.answer_allowed_s(budget, worker.load.queued_prefill_tokens), whole.check_s)

    last_resort = max(config.first_token_timeout_s, progress.answer_allowed_s(budget, worker.load.queued_prefill_tokens))
    # The read runs in this task. Most answers come within the first check's time, so no
    # task or wait set is made for the checks up front: a timer starts them when that time
    # is up, and a verdict stops the call (its pending read raises CancelledError), which
    # this task turns into the verdict. A call that ended first (its answer in) is not
    # stopped, and that answer is returned.
    loop = running_loop()
    verdict: list[BaseException] = []
    checks: list[asyncio.Task[None]] = []

    async def check() -> None:
        try:
            failure = await _overdue(worker, started, last_resort, allowed_s)
        except Exception as exc:  # a check that fails ends the wait with its error, as it did inline
            failure = exc
        verdict.append(failure)
        if not call.cancel():
            verdict.clear()

    timer = loop.call_later(min(allowed_s(), last_resort), lambda: checks.append(loop.create_task(check())))
    try:
        return await call.read()
    except asyncio.CancelledError:
        if verdict and not cancelling():
            raise verdict[0] from None
        raise
    finally:
        timer.cancel()
        if checks:
            checks[0].cancel()


async def _overdue(worker: Worker, started: float, last_resort: float, allowed_s: Callable[[], float]) -> BaseException:
    """The checks of ``_whole_answer`` once its first wait is over, until one fails: a
    ``TimeoutError`` at the last resort, ``AnswerOverdue`` for a worker that stays unheard
    and does not answer its probe. A worker heard from is waited for again."""
    progress = worker.progress
    while True:
        now = time.monotonic()
        if now - started >= last_resort:
            return TimeoutError()  # the last-resort cap, as for any first message
        allowed = allowed_s()
        silent_s = now - max(started, progress.last_heard_at)
        if silent_s >= allowed:
            asked = time.monotonic()
            probe_s = progress.allowed_s(worker.load.queued_prefill_tokens)
            if not await answers_probe(worker, probe_s) and progress.last_heard_at < asked:
                return AnswerOverdue(time.monotonic() - max(started, progress.last_heard_at), allowed)
            now = time.monotonic()
            silent_s = now - max(started, progress.last_heard_at)
        await asyncio.sleep(max(0.0, min(allowed - silent_s, started + last_resort - now)))


async def open_generate(
    router: Router,
    route: RouteRequest,
    build: BuildRequest,
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    retry: RetryConfig,
    config: DispatchConfig,
    role: str = "regular",
    on_attempt: Callable[[Selection, int], None] | None = None,
    observer: PipelineObserver = NULL_OBSERVER,
    whole: WholeAnswer = WholeAnswer(),
) -> WorkerStream:
    """Select, send and wait for the first message, retrying on other workers."""

    async def attempt(route: RouteRequest, n: int) -> WorkerStream:
        selection = select(router, route, role, observer)
        if on_attempt is not None:
            on_attempt(selection, n)
        return await open_on(
            router, selection, route, build(selection),
            prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, retry=retry, config=config, attempt=n,
            observer=observer, whole=whole,
        )

    return await with_retries(router, route, attempt, retry, observer)


@dataclass(frozen=True, slots=True)
class Embedded:
    """A worker's embedding reply and who computed it."""

    reply: pb.EmbedResponse
    worker_id: str
    attempts: int


async def call_embed(
    router: Router,
    route: RouteRequest,
    request: pb.EmbedRequest,
    *,
    retry: RetryConfig,
    config: DispatchConfig,
    observer: PipelineObserver = NULL_OBSERVER,
) -> Embedded:
    """Select, send one Embed and wait for the reply, retrying on other workers
    (an embedding is unary: it fails before any output or not at all)."""

    async def attempt(route: RouteRequest, n: int) -> Embedded:
        selection = select(router, route, "regular", observer)
        worker = selection.worker
        async with Lease(
            router, selection, route, prompt_tokens=len(route.token_ids), max_new_tokens=0, observer=observer, stage="embed"
        ) as lease:
            lease.sent()
            try:
                worker.pin(request)
                reply = await worker.client.embed(request, timeout=worker_timeout(config.request_timeout_s))
            except WorkerCallError as exc:
                raise AttemptFailed(
                    map_rpc_error(exc, worker.id), worker.id, exc.code.name, retryable=retry.retryable(exc.code),
                    backoff=True, outcome=Outcome.REJECTED if exc.rejected else Outcome.WORKER_FAILED,
                ) from exc
            lease.start()
            lease.report(prompt_tokens=reply.prompt_tokens)
        return Embedded(reply, worker.id, n)

    return await with_retries(router, route, attempt, retry, observer)


Attempt = Callable[[RouteRequest, int], Awaitable[T]]


async def with_retries(
    router: Router, route: RouteRequest, attempt: Attempt[T], retry: RetryConfig,
    observer: PipelineObserver = NULL_OBSERVER,
) -> T:
    """The gateway's one retry loop: run ``attempt`` until it opens a stream.

    Each failed attempt excludes the worker that failed from the next selection;
    ``attempt`` raises NoWorkerAvailable when its pool(s) have no one left.

    The error is raised outside the ``except`` that caught its attempt, and dropped
    from this frame on the way out: raised inside, it would hold the AttemptFailed
    that holds it as its context, and a frame that held it back would be held by its
    traceback. Either cycle keeps the whole request alive until a rare full
    collection (``gc_policy``).
    """
    last_error: Exception | None = None
    cause: BaseException | None = None
    tries = max(1, retry.max_attempts)
    try:
        for n in range(1, tries + 1):
            try:
                return await attempt(route, n)
            except NoWorkerAvailable as exc:
                if last_error is not None:
                    raise last_error from exc
                raise no_worker_error(str(exc)) from exc
            except AttemptFailed as failed:
                last_error, cause, worker_id, backoff = failed.error, failed.__cause__, failed.worker_id, failed.backoff
                give_up = backoff and (not failed.retryable or n >= tries)
                if not give_up:
                    if backoff:
                        log.warning(
                            "request %s: worker %s failed before output (%s), retrying (attempt %d)",
                            route.request_id, worker_id, last_error, n,
                        )
                    if n < tries:
                        observer.retried(worker_id, failed.reason)
            if give_up:
                raise last_error from cause
            route = router.exclude(route, worker_id)
            if backoff:
                await asyncio.sleep(retry.backoff(n))
        assert last_error is not None
        raise last_error
    finally:
        last_error = cause = None
