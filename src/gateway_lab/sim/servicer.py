"""The SglangScheduler gRPC service of a simulated worker: protobuf in, protobuf out.

Everything about *behaviour* lives elsewhere (scheduler, cache, sampler, PD
rendezvous); this module validates requests the way a real ``--grpc-mode``
worker does, turns them into scheduler sequences, and turns the scheduler's
output records back into GenerateStreamChunk / GenerateComplete messages.

Choices where the wire leaves room:

* A matched stop token (EOS or one of ``stop_token_ids``) is part of
  ``output_ids`` and of ``completion_tokens``; the client trims it.
* Abort (the Abort RPC) stops the request's samples and, as on SGLang's own
  server, leaves its Generate stream open: no message, no status, until the
  client cancels it. A cancelled client stream just ends.
* Not streamed (``stream`` false), every GenerateComplete of an ``n>1`` request
  carries ``index`` 0, as SGLang's server sends them; streamed ones carry their
  sample's index.
* The prompt limit is the scheduler's: a prompt of ``max_req_input_len`` tokens or
  more is refused, and ``max_new_tokens`` is cut to what the context leaves.
* ``custom_params`` is accepted and ignored (SGLang feeds it to custom logit
  processors only); outputs depend on the prompt, the sample index and the seed
  option, so the same request gives the same output.
* GetModelInfo answers as SGLang's servicer does: ``max_context_length`` is the KV
  pool size, ``vocab_size``, ``eos_token_ids``, ``pad_token_id`` and ``bos_token_id``
  are the servicer's fixed placeholders, ``default_sampling_params_json`` carries the
  model's sampling defaults; the true values are in the model folder it reports and
  serves through GetTokenizer (``sim.model_dir``).
* Input logprobs go in the first message of each sample: the first chunk when
  streaming (the complete when no chunk was sent), the complete otherwise.
  ``logprob_start_len`` < 0 means none.
* A prefill-role worker given DisaggregatedParams runs the prefill, registers
  the bootstrap room, and answers like a request with ``max_new_tokens`` 1:
  one token, finish_reason "length" (or "stop" if that token is a stop).
  The decode-role partner streams the whole output, first token included.
* Constrained decoding, LoRA, multimodal inputs and hidden states are accepted
  and ignored.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf import struct_pb2, timestamp_pb2

from gateway.proto import common_pb2, sglang_scheduler_pb2, sglang_scheduler_pb2_grpc
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.counters import SimCounters
from gateway_lab.sim.faults import SimFaults, status_code
from gateway_lab.sim.kv_events import KvEventHub
from gateway_lab.sim.model_dir import ARCHITECTURE, MODEL_TYPE
from gateway_lab.sim.pd import BootstrapServer, RendezvousError, RoomInfo, wait_for_room
from gateway_lab.sim.radix_cache import RadixCache
from gateway_lab.sim.sampler import (
    TokenSource,
    embedding,
    input_logprob,
    prompt_digest,
    top_alternatives,
)
from gateway_lab.sim.scheduler import FAULT, Scheduler, Sequence, Sink
from gateway_lab.sim.vocab import Vocab, tokenizer_zip

pb = sglang_scheduler_pb2
TOKENIZER_CHUNK_BYTES = 512 * 1024
SIM_VERSION = "sim-0.1.0"
# What SGLang's servicer puts in GetModelInfo when its scheduler does not say (it never
# does for these): clients must not take them for the model's.
PLACEHOLDER_VOCAB_SIZE = 128256
PLACEHOLDER_PAD_TOKEN_ID = 0
PLACEHOLDER_BOS_TOKEN_ID = 1


async def _until_cancelled() -> None:
    """Wait until the client cancels the call (an aborted stream on SGLang never ends)."""
    await asyncio.Event().wait()


class InvalidRequest(Exception):
    """A request a real worker refuses with INVALID_ARGUMENT."""


@dataclass(frozen=True)
class LogprobOptions:
    enabled: bool
    start_len: int
    top_k: int
    token_ids: tuple[int, ...]


class SimRank:
    """One data-parallel rank: its own KV cache, scheduler and KV-event hub."""

    def __init__(self, index: int, config: SimConfig, counters: SimCounters, after_step: Callable[[SimRank], None]) -> None:
        self.index = index
        self.cache = RadixCache(config.page_size, config.kv_capacity_tokens)
        self.scheduler = Scheduler(config, self.cache, counters)
        self.kv_events = KvEventHub(self.cache, config.kv_events_history)
        self.scheduler.after_step = lambda: after_step(self)
        self.last_load_key: tuple[int, int] = (0, 0)


class ServedWorker(Protocol):
    """What the servicer reads and calls on the worker it serves (``SimWorker``,
    in ``sim/worker.py``, which builds the servicer: naming the surface here keeps the
    import one-way, worker -> servicer)."""

    config: SimConfig
    vocab: Vocab
    model_path: Path
    received: collections.deque[pb.GenerateRequest]
    faults: SimFaults
    counters: SimCounters
    cache: RadixCache
    scheduler: Scheduler
    kv_events: KvEventHub
    ranks: list[SimRank]
    bootstrap: BootstrapServer | None
    started_at: float
    stopping: bool

    @property
    def max_req_input_len(self) -> int: ...

    @property
    def busy(self) -> int: ...

    def die(self) -> None: ...

    def track(self, rid: str, seqs: list[Sequence]) -> None: ...

    async def stall(self, seconds: float) -> None: ...

    async def unstalled(self) -> None: ...

    def untrack(self, rid: str, seqs: list[Sequence]) -> None: ...

    def abort(self, rid: str) -> int: ...

    async def flush_cache(self, timeout_s: float) -> tuple[bool, str]: ...

    def server_args(self) -> dict[str, Any]: ...

    def rank_for(self, requested: int | None) -> SimRank: ...

    def scheduler_loads(self) -> list[pb.SchedulerLoad]: ...

    def scheduler_load(self, rank: int = 0) -> pb.SchedulerLoad: ...

    def engine_load(self, full: bool) -> common_pb2.EngineLoad: ...


class SimServicer(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    """Serves one simulated worker (a :class:`ServedWorker`)."""

    # An unstreamed n>1 answer: SGLang's servicer numbers every complete 0, vLLM's
    # numbers them by sample (``sim.vllm_servicer`` turns this on).
    numbers_unary_samples = False

    def __init__(self, worker: ServedWorker) -> None:
        self.w = worker

    # ================================================================ Generate
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        w = self.w
        counters = w.counters
        faults = w.faults
        counters.requests += 1
        w.received.append(request)
        w.scheduler.last_receive = time.time()
        if 0 <= faults.exit_after_requests < counters.requests:
            w.die()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "sim fault: the worker died")
        if faults.reject_status:
            counters.rejected += 1
            await context.abort(
                status_code(faults.reject_status), "sim fault: rejecting every Generate"
            )
        try:
            seqs, lp = await self._build(request)
        except InvalidRequest as e:
            counters.invalid += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RendezvousError as e:
            counters.pd_rendezvous_failed += 1
            await context.abort(e.code, e.message)
        async for response in self._run(request, seqs, lp, context):
            yield response

    async def _run(
        self,
        request: pb.GenerateRequest,
        seqs: list[Sequence],
        lp: LogprobOptions,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.GenerateResponse]:
        w = self.w
        faults = w.faults
        rid = request.request_id
        stream = request.stream
        sink = seqs[0].sink
        w.track(rid, seqs)
        remaining = len(seqs)
        stall_pending = faults.stall_s > 0
        sent_tokens = 0
        input_lp_sent: set[int] = set()
        try:
            sched = w.ranks[seqs[0].rank].scheduler
            for seq in seqs:
                sched.submit(seq)
            while remaining:
                await sink.wait()
                for seq, start, end, final in sink.take():
                    if stall_pending and sent_tokens >= faults.stall_after_tokens:
                        stall_pending = False
                        await w.stall(faults.stall_s)
                    fault = final and seq.finish_reason == FAULT
                    if stream and end > start:
                        chunk = self._chunk(seq, start, end, lp, seq.index not in input_lp_sent)
                        input_lp_sent.add(seq.index)
                        yield pb.GenerateResponse(request_id=rid, chunk=chunk)
                        sent_tokens += end - start
                    if fault:
                        await context.abort(
                            status_code(faults.fail_status),
                            f"sim fault: failing after {seq.fail_after} generated tokens",
                        )
                    if final and seq.finish_reason == "abort" and not getattr(context, "ends_aborted_streams", False):
                        # The Abort RPC stopped it: SGLang's gRPC servicer sends nothing more (its
                        # HTTP server, which the HTTP mode plays in process, ends it as "abort").
                        await _until_cancelled()
                    if final:
                        complete = self._complete(
                            seq, start, end, lp, seq.index not in input_lp_sent, stream
                        )
                        input_lp_sent.add(seq.index)
                        yield pb.GenerateResponse(request_id=rid, complete=complete)
                        remaining -= 1
        finally:
            for seq in seqs:
                if not seq.done:
                    w.ranks[seq.rank].scheduler.abort(seq)
            w.untrack(rid, seqs)

    async def _build(self, request: pb.GenerateRequest) -> tuple[list[Sequence], LogprobOptions]:
        """Validate like a real worker and create the request's sequences."""
        w = self.w
        cfg = w.config
        prompt = list(request.tokenized.input_ids)
        if not prompt:
            raise InvalidRequest("input_ids must not be empty (the worker takes token ids only)")
        sp = request.sampling_params
        if any(sp.stop):
            raise InvalidRequest(
                "string stop sequences need a worker-side tokenizer; this worker runs with"
                " skip_tokenizer_init: send stop_token_ids or stop on the client"
            )
        if sp.n < 1:
            raise InvalidRequest("sampling_params.n must be >= 1")
        limit = w.max_req_input_len
        if len(prompt) >= limit:
            raise InvalidRequest(
                f"Input length ({len(prompt)} tokens) exceeds the maximum allowed length ({limit} tokens)."
                " Use a shorter input or enable --allow-auto-truncate."
            )
        pinned = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
        bootstrap = request.disaggregated_params if request.HasField("disaggregated_params") else None
        if pinned is None and cfg.role != "regular" and bootstrap is not None and bootstrap.bootstrap_host:
            pinned = bootstrap.bootstrap_room % len(w.ranks)  # SGLang's DP controller: a PD room picks its rank
        try:
            rank = w.rank_for(pinned)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        max_new = sp.max_new_tokens if sp.HasField("max_new_tokens") else cfg.default_max_new_tokens
        longest = min(cfg.context_length, w.cache.capacity) - 1
        max_new = max(0, min(max_new, longest - len(prompt) - 1))
        vocab_size = w.vocab.vocab_size
        if max(prompt) >= vocab_size:
            raise InvalidRequest(
                f"input_ids contain ids outside the vocabulary (size {vocab_size})"
            )
        seed = cfg.seed
        lp = LogprobOptions(
            enabled=request.return_logprob,
            start_len=request.logprob_start_len,
            top_k=max(0, request.top_logprobs_num),
            token_ids=tuple(request.token_ids_logprob),
        )
        pd = request.disaggregated_params if request.HasField("disaggregated_params") else None
        if pd is not None and not pd.bootstrap_host:
            pd = None
        transferred = False
        reported_cached: int | None = None
        on_prefilled = None
        if pd is not None and cfg.role == "decode":
            info = await wait_for_room(
                pd.bootstrap_host, pd.bootstrap_port, pd.bootstrap_room, cfg.pd_timeout_s
            )
            w.counters.pd_rendezvous_ok += 1
            transferred = True
            reported_cached = info.cached_tokens
        elif pd is not None and cfg.role == "prefill":
            # The prefill side of a PD pair produces the first token only.
            max_new = min(max_new, 1)
            room = pd.bootstrap_room

            def on_prefilled(seq: Sequence) -> None:
                if seq.index == 0 and w.bootstrap is not None:
                    w.bootstrap.register(room, RoomInfo(seq.prompt_len, seq.cached_tokens))

        if not rank.scheduler.fits(len(prompt), max_new):
            raise InvalidRequest(
                f"the input ({len(prompt)} tokens) plus max_new_tokens ({max_new}) does not fit"
                f" in the KV pool ({w.cache.capacity} tokens)"
            )
        interval = (
            sp.stream_interval if sp.HasField("stream_interval") else cfg.default_stream_interval
        )
        digest = prompt_digest(prompt, seed)
        fail_after = w.faults.fail_after_for_next_request()  # one draw per request: all its samples
        script = w.vocab.scripted_reply(prompt) if cfg.scripted_replies else None
        sink = Sink()
        stop_ids = frozenset(sp.stop_token_ids)
        seqs = [
            Sequence(
                request.request_id,
                i,
                prompt,
                TokenSource(w.vocab, digest, i, cfg.eos_probability, script),
                sink,
                max_new=max_new,
                min_new=sp.min_new_tokens,
                stop_ids=stop_ids,
                ignore_eos=sp.ignore_eos,
                stream=request.stream,
                interval=interval,
                fail_after=fail_after,
                transferred=transferred,
                reported_cached=reported_cached,
                on_prefilled=on_prefilled,
            )
            for i in range(sp.n)
        ]
        for seq in seqs:
            seq.rank = rank.index
        return seqs, lp

    # ---------------------------------------------------------------- messages
    def _chunk(
        self, seq: Sequence, start: int, end: int, lp: LogprobOptions, first: bool
    ) -> pb.GenerateStreamChunk:
        chunk = pb.GenerateStreamChunk(
            token_ids=seq.output[start:end],
            prompt_tokens=seq.prompt_len,
            completion_tokens=end,
            cached_tokens=seq.cached_tokens,
            index=seq.index,
        )
        if lp.enabled:
            chunk.output_logprobs.CopyFrom(self._output_logprobs(seq, start, end, lp))
            if first and lp.start_len >= 0:
                chunk.input_logprobs.CopyFrom(self._input_logprobs(seq, lp))
        return chunk

    def _complete(
        self, seq: Sequence, start: int, end: int, lp: LogprobOptions, first: bool, stream: bool
    ) -> pb.GenerateComplete:
        complete = pb.GenerateComplete(
            output_ids=seq.output[start:end],
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.prompt_len,
            completion_tokens=end,
            cached_tokens=seq.cached_tokens,
            index=seq.index if stream or self.numbers_unary_samples else 0,  # SGLang's unary answers all say 0
        )
        if seq.matched is not None:
            complete.matched_token_id = seq.matched
        if lp.enabled:
            complete.output_logprobs.CopyFrom(self._output_logprobs(seq, start, end, lp))
            if first and lp.start_len >= 0:
                complete.input_logprobs.CopyFrom(self._input_logprobs(seq, lp))
        return complete

    def _output_logprobs(
        self, seq: Sequence, start: int, end: int, lp: LogprobOptions
    ) -> pb.OutputLogProbs:
        tokens = seq.output[start:end]
        values = seq.logprobs[start:end]
        out = pb.OutputLogProbs(token_logprobs=values, token_ids=tokens)
        vocab = self.w.vocab
        if lp.top_k:
            for tok, value in zip(tokens, values, strict=True):
                alt_values, alt_ids = top_alternatives(vocab, tok, value, lp.top_k)
                out.top_logprobs.add(values=alt_values, token_ids=alt_ids)
        if lp.token_ids:
            for pos, (tok, value) in enumerate(zip(tokens, values, strict=True), start):
                out.token_ids_logprobs.add(
                    values=[
                        value if t == tok else value - 1.0 - ((t * 31 + pos) % 50) / 10
                        for t in lp.token_ids
                    ],
                    token_ids=lp.token_ids,
                )
        return out

    def _input_logprobs(self, seq: Sequence, lp: LogprobOptions) -> pb.InputLogProbs:
        prompt = seq.prompt
        out = pb.InputLogProbs()
        vocab = self.w.vocab
        for pos in range(min(lp.start_len, len(prompt)), len(prompt)):
            tok = prompt[pos]
            if pos == 0:
                out.token_logprobs.add()  # the first token has no logprob
                if lp.top_k:
                    out.top_logprobs.add()
            else:
                value = input_logprob(prompt[pos - 1], tok)
                out.token_logprobs.add(value=value)
                if lp.top_k:
                    alt_values, alt_ids = top_alternatives(vocab, tok, value, lp.top_k)
                    out.top_logprobs.add(values=alt_values, token_ids=alt_ids)
            out.token_ids.append(tok)
        return out

    # ================================================================ unary RPCs
    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        prompt = list(request.tokenized.input_ids)
        if not prompt:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input_ids must not be empty")
        self.w.counters.embeds += 1
        cfg = self.w.config
        return pb.EmbedResponse(
            embedding_dim=cfg.embed_dim,
            embedding=embedding(prompt, cfg.seed, cfg.embed_dim),
            prompt_tokens=len(prompt),
        )

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthCheckResponse:
        self.w.counters.health_checks += 1
        if self.w.stopping:
            return pb.HealthCheckResponse(healthy=False, message="shutting down")
        # SGLang's probe is a one-token generation: it cannot pass a stall its scheduler is in.
        await self.w.unstalled()
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        n = self.w.abort(request.request_id)
        if n:
            return pb.AbortResponse(
                success=True, message=f"aborted {n} sequence(s) of {request.request_id}"
            )
        return pb.AbortResponse(success=False, message=f"request {request.request_id} not found")

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        w = self.w
        cfg = w.config
        defaults = cfg.sampling_defaults_dict()
        return pb.GetModelInfoResponse(
            model_path=cfg.model,
            tokenizer_path=str(w.model_path),
            is_generation=True,
            preferred_sampling_params="",
            default_sampling_params_json=json.dumps(defaults, separators=(",", ":")) if defaults else "",
            weight_version="default",
            served_model_name=cfg.served_name,
            max_context_length=w.cache.capacity,
            vocab_size=PLACEHOLDER_VOCAB_SIZE,
            supports_vision=False,
            model_type=MODEL_TYPE,
            eos_token_ids=[],
            pad_token_id=PLACEHOLDER_PAD_TOKEN_ID,
            bos_token_id=PLACEHOLDER_BOS_TOKEN_ID,
            max_req_input_len=w.max_req_input_len,
            architectures=[ARCHITECTURE],
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        w = self.w
        server_args = struct_pb2.Struct()
        server_args.update(w.server_args())
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update(  # what SGLang's scheduler says when it is ready
            {
                "status": "ready",
                "max_total_num_tokens": w.cache.capacity,
                "max_req_input_len": w.max_req_input_len,
            }
        )
        start = timestamp_pb2.Timestamp()
        start.FromSeconds(int(w.started_at))
        return pb.GetServerInfoResponse(
            server_args=server_args,
            scheduler_info=scheduler_info,
            active_requests=w.busy,
            is_paused=False,
            last_receive_timestamp=w.scheduler.last_receive,
            uptime_seconds=time.time() - w.started_at,
            sglang_version=SIM_VERSION,
            server_type="grpc",
            start_time=start,
            max_total_num_tokens=w.cache.capacity,
        )

    async def GetLoads(
        self, request: pb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadsResponse:
        loads = self.w.scheduler_loads()
        if request.HasField("dp_rank"):
            loads = [x for x in loads if x.dp_rank == request.dp_rank]
        n = max(1, len(loads))
        return pb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version=SIM_VERSION,
            dp_rank_count=len(loads),
            loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=sum(x.num_running_reqs for x in loads),
                total_waiting_reqs=sum(x.num_waiting_reqs for x in loads),
                total_reqs=sum(x.num_total_reqs for x in loads),
                avg_token_usage=sum(x.token_usage for x in loads) / n,
                avg_throughput=sum(x.gen_throughput for x in loads) / n,
                avg_utilization=sum(x.utilization for x in loads) / n,
            ),
        )

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        ok, message = await self.w.flush_cache(request.timeout_s)
        return common_pb2.FlushCacheResponse(success=ok, message=message)

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        data, digest = await asyncio.to_thread(tokenizer_zip, self.w.model_path)
        for start in range(0, len(data), TOKENIZER_CHUNK_BYTES):
            end = start + TOKENIZER_CHUNK_BYTES
            yield common_pb2.GetTokenizerChunk(
                data=data[start:end], sha256=digest if end >= len(data) else ""
            )

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        w = self.w
        async for batch in w.kv_events.subscribe(
            request, w.engine_load, w.config.kv_events_load_interval_s
        ):
            yield batch
