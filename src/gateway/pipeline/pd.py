"""Prefill/decode disaggregation: pick a pair, send both halves, stream the decode side.

A PD request is an ordinary prepared request opened by a different *opener*:
instead of one worker it selects a prefill worker (prefill pool, its own policy
and tree) and a decode worker (decode pool, its own policy), sends both the same
``DisaggregatedParams`` (the prefill's bootstrap host and port and a fresh room
id) and returns a :class:`PdStream`, which ``Generation`` reads exactly like a
single worker's stream. So chat, completions, /generate, tools and reasoning run
the same code as without PD.

What SGLang expects, and this module does:

* Room ids are random in ``[0, 2**31 - 1)``: the gRPC field is an int32 (SGLang's
  HTTP mini load balancer uses 63 bits; the gRPC contract cannot carry that).
* A data-parallel prefill worker (``dp_size`` > 1) runs the request on rank
  ``room % dp_size``, and the decode side finds the KV there by the same rule.
  Each rank is its own prefill target (the registry's ``host:port@rank``): the
  policy picks the rank, the room is drawn congruent to it, and dispatch pins
  ``data_parallel_rank`` on the prefill request so it lands on that rank whatever
  the engine's own DP balancing is.
* ``n > 1``: one room carries one KV transfer, so each sample is its own pair of
  requests (n = 1 each, its own room) on the chosen pair, merged back by index.
* Prompt logprobs are computed where the prompt is: the prefill side. Its
  ``input_logprobs`` are put into the decode side's first message of each sample,
  and ``cached_tokens`` (prefix reuse happens at prefill) come from the prefill.

Failures before the decode side's first message fail the *attempt*: both halves
are aborted, both slots freed, and the one retry loop (``with_retries``) picks a
new pair without the worker that failed. Afterwards a failure of the decode stream
fails the request like any worker failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.pipeline.dispatch import (
    AttemptFailed,
    DispatchConfig,
    WorkerStream,
    open_on,
    select,
    with_retries,
)
from gateway.pipeline.merged import MergedStreams
from gateway.pipeline.observer import NULL_OBSERVER, PipelineObserver
from gateway.pipeline.retry import RetryConfig
from gateway.pipeline.router import Router, Selection
from gateway.pipeline.settle import settle
from gateway.policies.base import RouteRequest
from gateway.policies.common import find_target
from gateway.policies.factory import POLICY_NAMES, PolicyConfig
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError
from gateway.settings import option
from gateway.workers.client import parse_worker_url
from gateway.workers.registry import WorkerRegistry
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)

ROOM_LIMIT = 2**31 - 1  # bootstrap_room is an int32 on the wire; rooms are in [0, ROOM_LIMIT)


# ---------------------------------------------------------------- configuration
@dataclass(frozen=True, slots=True)
class PdWorkerSpec:
    """One ``--prefill URL [BOOTSTRAP_PORT]`` or ``--decode URL`` entry."""

    url: str
    bootstrap_port: int | None = None


@dataclass
class PdConfig:
    """Prefill and decode pools and how each one is routed."""

    prefill_policy: str = option(
        "cache_aware", "policy of the prefill pool (prefix reuse happens at prefill)", choices=list(POLICY_NAMES)
    )
    decode_policy: str = option(
        "power_of_two", "policy of the decode pool (decode cost is load)", choices=list(POLICY_NAMES)
    )
    # Filled from --prefill/--decode (parsed by ``parse_pool_flags``, not by add_options).
    prefill: list[PdWorkerSpec] = field(default_factory=list)
    decode: list[PdWorkerSpec] = field(default_factory=list)


class PdFlagError(ValueError):
    """A --prefill/--decode value that is not ``URL [BOOTSTRAP_PORT]``."""


def parse_pool_flags(groups: Sequence[Sequence[str]] | None, *, allow_port: bool) -> list[PdWorkerSpec]:
    """``[["grpc://a:1", "9000", "grpc://b:2"], ...]`` -> specs; a number after a URL is its bootstrap port."""
    specs: list[PdWorkerSpec] = []
    for group in groups or []:
        for item in group:
            if item.isdigit():
                if not allow_port:
                    raise PdFlagError(f"--decode takes URLs only, got {item!r}")
                if not specs or specs[-1].bootstrap_port is not None:
                    raise PdFlagError(f"bootstrap port {item} does not follow a prefill URL")
                port = int(item)
                if not 0 < port < 65536:
                    raise PdFlagError(f"bootstrap port {port} is out of range")
                specs[-1] = dataclasses.replace(specs[-1], bootstrap_port=port)
                continue
            try:
                parse_worker_url(item)
            except ValueError as exc:
                raise PdFlagError(str(exc)) from exc
            specs.append(PdWorkerSpec(item))
    return specs


def pool_policy_config(base: PolicyConfig, pd: PdConfig, role: str) -> PolicyConfig:
    """The policy config of one pool: the shared knobs, the pool's own policy name."""
    if role == "prefill":
        return dataclasses.replace(base, policy=pd.prefill_policy)
    if role == "decode":
        return dataclasses.replace(base, policy=pd.decode_policy)
    return base


def serves_pd(registry: WorkerRegistry, model: str) -> bool:
    """A model with any prefill or decode worker registered is served disaggregated."""
    for w in registry.all():  # a loop, not any(genexpr): asked on every request, one frame per worker saved
        if w.role in ("prefill", "decode") and w.model == model:
            return True
    return False


# ---------------------------------------------------------------- rooms
class RoomAllocator:
    """Fresh bootstrap rooms, aligned to the prefill target's DP rank when it has one."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.SystemRandom()

    def room(self, prefill: Worker) -> int:
        """A room for one request on ``prefill`` (congruent to its rank modulo dp_size)."""
        if prefill.dp_rank is None:
            return self._rng.randrange(ROOM_LIMIT)
        return room_for_rank(self._rng, prefill.dp_rank, max(1, prefill.info.dp_size))


def room_for_rank(rng: random.Random, rank: int, dp_size: int) -> int:
    """A uniform room in [0, ROOM_LIMIT) with ``room % dp_size == rank``."""
    if not 0 <= rank < dp_size:
        raise ValueError(f"rank {rank} not in [0, {dp_size})")
    buckets = (ROOM_LIMIT - 1 - rank) // dp_size + 1
    return rng.randrange(buckets) * dp_size + rank


# ---------------------------------------------------------------- requests
def prefill_request(base: pb.GenerateRequest, params: pb.DisaggregatedParams, rid: str) -> pb.GenerateRequest:
    """The prefill half: one sample, one token, not streamed; prompt logprobs live here."""
    req = pb.GenerateRequest()
    req.CopyFrom(base)
    req.request_id = rid
    req.sampling_params.n = 1
    req.stream = False
    wants_prompt_lp = base.logprob_start_len >= 0
    req.return_logprob = wants_prompt_lp
    if not wants_prompt_lp:
        req.top_logprobs_num = 0
    req.disaggregated_params.CopyFrom(params)
    return req


def decode_request(base: pb.GenerateRequest, params: pb.DisaggregatedParams, rid: str, wants_output_lp: bool) -> pb.GenerateRequest:
    """The decode half: one sample, the whole output; no prompt logprobs (it never sees the prompt run)."""
    req = pb.GenerateRequest()
    req.CopyFrom(base)
    req.request_id = rid
    req.sampling_params.n = 1
    req.return_logprob = wants_output_lp
    if not wants_output_lp:
        req.top_logprobs_num = 0
    req.logprob_start_len = -1
    req.disaggregated_params.CopyFrom(params)
    return req


@dataclass(slots=True)
class _Half:
    """What the prefill half told us, to fold into the decode side's messages."""

    cached_tokens: int = 0
    input_logprobs: pb.InputLogProbs | None = None
    merged: bool = False


# ---------------------------------------------------------------- the stream
class PdStream(MergedStreams):
    """The decode side's stream(s) of one PD request, read like a ``WorkerStream``."""

    def __init__(
        self,
        prefill: Selection,
        decode: Selection,
        streams: list[WorkerStream],
        halves: list[_Half],
        rooms: list[int],
        attempts: int,
    ) -> None:
        super().__init__(streams)
        self.selection = decode
        self.worker = decode.worker
        self.prefill_worker = prefill.worker
        self.rooms = rooms
        self.attempts = attempts
        self.observer = streams[0].observer
        self._halves = halves

    async def read(self) -> pb.GenerateResponse | None:
        """The next decode message (index = sample), or None when every sample ended."""
        while self._live:
            i, msg = await self._next()  # a worker error propagates; Generation then aborts the rest
            folded = self._fold(i, msg)
            if folded is not None:
                return folded
        return None

    def _fold(self, i: int, msg: pb.GenerateResponse | None) -> pb.GenerateResponse | None:
        half = self._halves[i]
        if msg is None:
            self._live.discard(i)
            if len(self._streams) > 1:  # with one stream, Generation reports the early end itself
                raise WorkerError(f"decode worker {self.worker.id} ended sample {i} without finishing it")
            return None
        which = msg.WhichOneof("response")
        part = msg.chunk if which == "chunk" else msg.complete if which == "complete" else None
        if part is None:
            return msg
        part.index = i
        part.cached_tokens = half.cached_tokens  # prefix reuse happened at prefill; decode cannot know it
        if not half.merged:
            half.merged = True
            if half.input_logprobs is not None and not part.HasField("input_logprobs"):
                part.input_logprobs.CopyFrom(half.input_logprobs)
        if which == "complete":
            self._part_done(i)  # one sample per decode request: its complete is its end
        return msg

    def output(self, output_ids: Sequence[int]) -> None:
        """One sample finished: its decode worker holds the output (its lease tells the policy)."""
        if len(self._streams) == 1:
            self._streams[0].output(output_ids)


class PdOpener:
    """Opens PD requests: select a pair, send both halves of each sample, wait for both."""

    def __init__(
        self,
        router: Router,
        *,
        retry: RetryConfig,
        config: DispatchConfig,
        rooms: RoomAllocator | None = None,
        observer: PipelineObserver = NULL_OBSERVER,
    ) -> None:
        self.router = router
        self.retry = retry
        self.config = config
        self.rooms = rooms or RoomAllocator()
        self.observer = observer

    async def open(
        self,
        route: RouteRequest,
        request: pb.GenerateRequest,
        *,
        samples: int,
        wants_output_logprobs: bool,
        prompt_tokens: int,
        max_new_tokens: int,
    ) -> PdStream:
        async def attempt(route: RouteRequest, n: int) -> PdStream:
            # Decode first: an empty decode pool fails fast, before the prefill tree is touched.
            decode = select(self.router, self._for_pool(route, "decode"), "decode", self.observer)
            prefill = select(self.router, self._for_pool(route, "prefill"), "prefill", self.observer)
            return await self._open_pair(
                route, request, prefill, decode, n,
                samples=samples, wants_output_logprobs=wants_output_logprobs,
                prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
            )

        return await with_retries(self.router, route, attempt, self.retry, self.observer)

    def _for_pool(self, route: RouteRequest, role: str) -> RouteRequest:
        """The route as one pool sees it: a pinned target applies to its own pool only."""
        target = route.target_worker
        if target:
            pinned = find_target(target, [w.view() for w in self.router.registry.all()])
            if pinned is not None and pinned.role != role:
                target = None
        return dataclasses.replace(route, pool=role, target_worker=target)

    async def _open_pair(
        self,
        route: RouteRequest,
        request: pb.GenerateRequest,
        prefill: Selection,
        decode: Selection,
        attempt: int,
        *,
        samples: int,
        wants_output_logprobs: bool,
        prompt_tokens: int,
        max_new_tokens: int,
    ) -> PdStream:
        pw = prefill.worker
        if pw.bootstrap_port is None:
            raise AttemptFailed(
                WorkerError(f"prefill worker {pw.id} has no bootstrap port"), pw.id, "NO_BOOTSTRAP_PORT",
                retryable=True, backoff=False,
            )
        host = pw.client.address.host
        rooms: list[int] = []
        tasks: list[tuple[asyncio.Task[WorkerStream], asyncio.Task[WorkerStream]]] = []
        for i in range(samples):
            room = self.rooms.room(pw)
            rooms.append(room)
            params = pb.DisaggregatedParams(bootstrap_host=host, bootstrap_port=pw.bootstrap_port, bootstrap_room=room)
            rid = route.request_id if samples == 1 else f"{route.request_id}-{i}"
            sample_route = route if samples == 1 else dataclasses.replace(route, request_id=rid)
            p_req = prefill_request(request, params, rid)
            d_req = decode_request(request, params, rid, wants_output_logprobs)
            tasks.append((  # held by the list only (see below)
                asyncio.ensure_future(open_on(
                    self.router, prefill, sample_route, p_req, prompt_tokens=prompt_tokens, max_new_tokens=1,
                    retry=self.retry, config=self.config, attempt=attempt, observer=self.observer,
                )),
                asyncio.ensure_future(open_on(
                    self.router, decode, sample_route, d_req, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
                    retry=self.retry, config=self.config, attempt=attempt, observer=self.observer,
                )),
            ))
        every = [t for pair in tasks for t in pair]
        try:
            failed = await _first_failure(every)
            if failed is None:
                halves = [await self._take_prefill(p.result()) for p, _ in tasks]
        except BaseException:
            await _abandon(every)
            raise
        if failed is not None:
            # Raised from here, not from the task that failed: a frame in the error's
            # traceback that held the tasks would hold the error (a task keeps it), a
            # cycle that keeps the request alive until a rare full collection.
            await _abandon(every)
            error = failed.exception()
            every.clear()
            tasks.clear()
            failed = None
            assert error is not None
            try:
                raise error
            finally:
                del error
        log.debug(
            "request %s: PD pair %s -> %s, rooms %s", route.request_id, pw.id, decode.worker.id, rooms
        )
        return PdStream(prefill, decode, [d.result() for _, d in tasks], halves, rooms, attempt)

    @staticmethod
    async def _take_prefill(stream: WorkerStream) -> _Half:
        """Read the prefill half's one GenerateComplete and give its slot back."""
        msg = await stream.read()
        half = _Half()
        if msg is not None and msg.HasField("complete"):
            done = msg.complete
            if done.finish_reason == "abort":
                stream.finished()
                raise AttemptFailed(
                    WorkerError(f"prefill worker {stream.worker.id} aborted the prefill"),
                    stream.worker.id, "PREFILL_ABORTED", retryable=True, backoff=True,
                )
            half.cached_tokens = done.cached_tokens
            if done.HasField("input_logprobs"):
                half.input_logprobs = done.input_logprobs
        elif msg is not None and msg.HasField("chunk"):
            half.cached_tokens = msg.chunk.cached_tokens
            if msg.chunk.HasField("input_logprobs"):
                half.input_logprobs = msg.chunk.input_logprobs
        stream.finished()
        return half


async def _first_failure(tasks: list[asyncio.Task[WorkerStream]]) -> asyncio.Task[WorkerStream] | None:
    """Wait for every task; at the first failure stop waiting and return its task."""
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                return task
    return None


async def _abandon(tasks: list[asyncio.Task[WorkerStream]]) -> None:
    """Cancel the halves still opening (they abort themselves) and abort the opened ones
    (a failed half's error is not raised here: this frame holds the tasks)."""
    for task in tasks:
        if not task.done():
            task.cancel()
    await settle(tasks)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is None:
            with contextlib.suppress(BaseException):
                await task.result().abort("PD partner failed")
