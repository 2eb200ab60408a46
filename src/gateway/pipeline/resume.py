"""Resuming a generation whose worker failed after output started.

The gateway holds every token a worker produced for a request, so when the worker
fails, stalls or dies mid-stream the generation can go on elsewhere: a
continuation request whose input is the prompt plus the tokens generated so far,
with the remaining ``max_new_tokens`` and the same sampling parameters. The
``Generation`` keeps its detokenizers, stop matchers, logprobs and usage, so the
client sees one uninterrupted stream. Each unfinished sample of an ``n > 1``
request continues as its own request (the samples had diverged) and is
multiplexed back under its original index by ``Multiplex``.

What cannot be resumed faithfully is refused (``not_resumable``) and the request
ends with a clean error instead; see docs/reliability.md for why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.pipeline.dispatch import TokenStream
from gateway.pipeline.merged import MergedStreams
from gateway.pipeline.observer import PipelineObserver
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import (
    GatewayError,
    GatewayTimeoutError,
    ServiceUnavailableError,
    WorkerError,
)
from gateway.protocol.sampling import SamplingOptions
from gateway.settings import option
from gateway.workers.worker import Worker


@dataclass
class ResumeConfig:
    resume: bool = option(True, "resume a stream whose worker failed after output started on another worker (--no-resume: end it with an error)")
    max_resumes: int = option(3, "resumptions allowed per request before its stream ends with the worker's error")
    unary_stream_interval: int = option(16, "tokens per worker message for clients that do not stream, when their answer streams from the worker (see --unary-whole-max-s; an answer capped at this many tokens or fewer, one sample, no logprobs, always comes whole, in one message)")
    unary_whole_max_s: float = option(10.0, "a client that does not stream gets its answer from the worker whole (unstreamed, as SGLang's own frontends ask for it) when its token budget is known (max_tokens, or what the model's context leaves after the prompt); its deadline is the prefill of what the worker holds and that budget at the worker's learned pace, times --watchdog-answer-factor, and a worker heard from on no call (no message, no answered health probe) for this many seconds or that deadline, whichever is shorter, is probed, and if it does not answer either the request goes again elsewhere from scratch (0: only answers capped at --unary-stream-interval tokens, one sample, no logprobs go whole; the rest stream in chunks, so the watchdog sees progress and a failure resumes where it stopped)")

    def __post_init__(self) -> None:
        if self.max_resumes < 0 or self.unary_stream_interval < 1 or self.unary_whole_max_s < 0:
            raise ValueError("max_resumes and unary_whole_max_s must be >= 0 and unary_stream_interval >= 1")


# Errors that say "this worker failed", not "the request is bad" (those are not resumed).
RESUMABLE_ERRORS: tuple[type[GatewayError], ...] = (WorkerError, GatewayTimeoutError, ServiceUnavailableError)


def not_resumable(sampling: SamplingOptions) -> str | None:
    """Why a request cannot be continued faithfully on another worker, or None."""
    if sampling.constraint is not None:
        return f"constrained decoding ({sampling.constraint.kind}) keeps grammar state on the worker that a continuation would restart"
    if sampling.seed is not None:
        return "a seeded request cannot reproduce the same continuation on another worker"
    if (sampling.frequency_penalty or 0.0) != 0.0 or (sampling.presence_penalty or 0.0) != 0.0 or (
        sampling.repetition_penalty or 1.0
    ) != 1.0:
        return "penalties count the tokens generated so far, which a continuation would see as prompt"
    return None


def continuation_request(
    base: pb.GenerateRequest, generated: Sequence[int], *, request_id: str
) -> pb.GenerateRequest:
    """One sample's continuation: prompt + its tokens so far, the rest of its budget."""
    req = pb.GenerateRequest()
    req.CopyFrom(base)
    req.request_id = request_id
    req.tokenized.input_ids.extend(generated)
    req.tokenized.original_text = ""
    sp = req.sampling_params
    sp.n = 1
    if sp.HasField("max_new_tokens"):
        sp.max_new_tokens = max(0, sp.max_new_tokens - len(generated))
    sp.min_new_tokens = max(0, sp.min_new_tokens - len(generated))
    req.logprob_start_len = -1  # prompt logprobs were delivered by the first worker
    req.stream = True
    return req


class Multiplex(MergedStreams):
    """Several one-sample continuation streams read as one stream of ``n`` samples:
    each message's index is rewritten to the sample it continues."""

    def __init__(self, streams: Sequence[TokenStream], indices: Sequence[int]) -> None:
        super().__init__(streams)
        self._indices = list(indices)

    @property
    def worker(self) -> Worker:
        return self._streams[0].worker

    @property
    def observer(self) -> PipelineObserver:
        return self._streams[0].observer

    async def read(self) -> pb.GenerateResponse | None:
        while self._live:
            i, msg = await self._next()  # a worker error propagates; Generation resumes again
            if msg is None:
                self._live.discard(i)
                raise WorkerError(f"worker {self._streams[i].worker.id} ended a resumed sample early")
            which = msg.WhichOneof("response")
            if which == "chunk":
                msg.chunk.index = self._indices[i]
            elif which == "complete":
                msg.complete.index = self._indices[i]
                self._part_done(i)
            return msg
        return None


# Opens one continuation (the engine's open path) avoiding the given workers.
OpenContinuation = Callable[[pb.GenerateRequest, frozenset[str]], Awaitable[TokenStream]]


class Resumer:
    """What a ``Generation`` calls when its stream broke after output started."""

    def __init__(
        self, base: pb.GenerateRequest, open_one: OpenContinuation, config: ResumeConfig, sampling: SamplingOptions,
        observer: PipelineObserver,
    ) -> None:
        self._base = base
        self._open = open_one
        self.config = config
        self.refusal = None if config.resume else "resumption is off (--no-resume)"
        if self.refusal is None:
            self.refusal = not_resumable(sampling)
        self.resumes = 0
        self.failed_workers: set[str] = set()
        self._observer = observer

    def check(self, error: Exception) -> str | None:
        """Why ``error`` ends the request instead of being resumed, or None."""
        if not isinstance(error, RESUMABLE_ERRORS):
            return "not a worker failure"
        if self.refusal is not None:
            return self.refusal
        if self.resumes >= self.config.max_resumes:
            return f"already resumed {self.resumes} times (--max-resumes)"
        return None

    async def resume(self, failed_worker: str, samples: Sequence[tuple[int, Sequence[int]]]) -> TokenStream:
        """Open one continuation per unfinished ``(index, generated ids)`` sample."""
        self.resumes += 1
        self.failed_workers.add(failed_worker)
        avoid = frozenset(self.failed_workers)
        rid = self._base.request_id
        reqs = [
            (i, continuation_request(self._base, ids, request_id=f"{rid}-r{self.resumes}" + (f"-{i}" if len(samples) > 1 else "")))
            for i, ids in samples
        ]
        opened = await asyncio.gather(*(self._open(req, avoid) for _, req in reqs), return_exceptions=True)
        errors = [r for r in opened if isinstance(r, BaseException)]
        streams = [r for r in opened if not isinstance(r, BaseException)]
        if errors:
            for s in streams:
                await s.abort("resume partner failed")
            self._observer.resumed(failed_worker, "failed")
            raise errors[0]
        self._observer.resumed(failed_worker, "ok")
        if len(streams) == 1 and reqs[0][0] == 0:
            return streams[0]
        return Multiplex(streams, [i for i, _ in reqs])
