"""The VllmEngine gRPC service of a simulated worker: vLLM's wire on the same worker.

vLLM's gRPC server (``vllm_engine.proto``) has the SGLang scheduler's shape; the
simulated worker answers it through its SGLang servicer (same validation, cache,
step loop and faults) and says it the way vLLM's servicer does, where a client can
tell the difference:

* Replies carry no request id. A streamed chunk's ``completion_tokens`` is that
  chunk's count, and so is a streamed complete's (it repeats the last chunk's ids);
  an unstreamed complete holds every id, and ``n>1`` completes carry their sample's
  index whether streamed or not.
* ``temperature`` unset is 1.0, ``top_k`` 0 is no cut, ``max_tokens`` unset is up to
  the context; ``logprobs`` asks for output logprobs with that many alternatives,
  ``prompt_logprobs`` for every prompt position (the first has no value).
* After an Abort RPC the request's stream ends, with no complete and status OK (vLLM
  finishes an aborted request's output stream); Abort's reply is empty.
* GetModelInfo reports the model's true context, vocabulary and EOS ids;
  GetServerInfo the block (page) size, ranks and running cap; GetLoads the KV pool.
* HealthCheck runs nothing (vLLM reports whether its engine has errored).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from gateway.proto import common_pb2, vllm_engine_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import vllm_engine_pb2 as vpb
from gateway_lab.sim.model_dir import ARCHITECTURE, MODEL_TYPE
from gateway_lab.sim.servicer import SIM_VERSION, ServedWorker, SimServicer

SERVICE = vpb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class _SglangSide(SimServicer):
    numbers_unary_samples = True


class EndsAbortedStreams:
    """The call context, except that an aborted request ends its stream (as vLLM's does)."""

    ends_aborted_streams = True

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    async def abort(self, code: grpc.StatusCode, details: str = "", *args: Any) -> None:
        await self._context.abort(code, details, *args)

    def cancelled(self) -> bool:
        return bool(self._context.cancelled())


def scheduler_request(request: vpb.GenerateRequest) -> pb.GenerateRequest:
    """vLLM's request as the simulated scheduler's."""
    sp = request.sampling_params
    params = pb.SamplingParams(
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p or 1.0,
        top_k=sp.top_k or -1,
        min_p=sp.min_p,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty or 1.0,
        stop=sp.stop,
        stop_token_ids=sp.stop_token_ids,
        ignore_eos=sp.ignore_eos,
        n=sp.n or 1,
        min_new_tokens=sp.min_tokens,
    )
    if sp.HasField("max_tokens"):
        params.max_new_tokens = sp.max_tokens
    out = pb.GenerateRequest(
        request_id=request.request_id, sampling_params=params, stream=request.stream,
        return_logprob=sp.HasField("logprobs") or sp.HasField("prompt_logprobs"),
        top_logprobs_num=max(sp.logprobs, sp.prompt_logprobs, 0),
        logprob_start_len=0 if sp.HasField("prompt_logprobs") else -1,
    )
    out.tokenized.input_ids.extend(request.tokenized.input_ids)
    if request.HasField("data_parallel_rank"):
        out.data_parallel_rank = request.data_parallel_rank
    return out


def _logprobs(source: pb.OutputLogProbs, into: vpb.OutputLogProbs) -> None:
    into.token_logprobs.extend(source.token_logprobs)
    into.token_ids.extend(source.token_ids)
    for row in source.top_logprobs:
        into.top_logprobs.add(values=row.values, token_ids=row.token_ids)


def _input_logprobs(source: pb.InputLogProbs, into: vpb.InputLogProbs) -> None:
    for entry in source.token_logprobs:
        if entry.HasField("value"):
            into.token_logprobs.add(value=entry.value)
        else:
            into.token_logprobs.add()
    into.token_ids.extend(source.token_ids)
    for row in source.top_logprobs:
        into.top_logprobs.add(values=row.values, token_ids=row.token_ids)


def engine_reply(reply: pb.GenerateResponse) -> vpb.GenerateResponse:
    """The scheduler's reply as vLLM's servicer sends it (per-chunk counts, no id)."""
    if reply.HasField("chunk"):
        c = reply.chunk
        chunk = vpb.GenerateStreamChunk(
            token_ids=c.token_ids, prompt_tokens=c.prompt_tokens, completion_tokens=len(c.token_ids),
            cached_tokens=c.cached_tokens, index=c.index,
        )
        if c.HasField("output_logprobs"):
            _logprobs(c.output_logprobs, chunk.output_logprobs)
        if c.HasField("input_logprobs"):
            _input_logprobs(c.input_logprobs, chunk.input_logprobs)
        return vpb.GenerateResponse(chunk=chunk)
    d = reply.complete
    complete = vpb.GenerateComplete(
        output_ids=d.output_ids, finish_reason=d.finish_reason, prompt_tokens=d.prompt_tokens,
        completion_tokens=len(d.output_ids), cached_tokens=d.cached_tokens, index=d.index,
    )
    if d.HasField("matched_token_id"):
        complete.matched_token_id = d.matched_token_id
    if d.HasField("output_logprobs"):
        _logprobs(d.output_logprobs, complete.output_logprobs)
    if d.HasField("input_logprobs"):
        _input_logprobs(d.input_logprobs, complete.input_logprobs)
    return vpb.GenerateResponse(complete=complete)


class VllmSimServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """Serves one simulated worker over vLLM's engine service."""

    def __init__(self, worker: ServedWorker) -> None:
        self.w = worker
        self._sglang = _SglangSide(worker)

    async def Generate(
        self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vpb.GenerateResponse]:
        if request.WhichOneof("input") != "tokenized":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this worker takes token ids only")
        inner = scheduler_request(request)
        async for reply in self._sglang.Generate(inner, EndsAbortedStreams(context)):  # type: ignore[arg-type]
            if reply.HasField("complete") and reply.complete.finish_reason == "abort":
                return  # vLLM ends an aborted request's stream
            yield engine_reply(reply)

    async def Embed(self, request: vpb.EmbedRequest, context: grpc.aio.ServicerContext) -> vpb.EmbedResponse:
        inner = pb.EmbedRequest(request_id=request.request_id, tokenized=pb.TokenizedInput(
            input_ids=request.tokenized.input_ids
        ))
        reply = await self._sglang.Embed(inner, context)
        return vpb.EmbedResponse(
            embedding=reply.embedding, prompt_tokens=reply.prompt_tokens, embedding_dim=reply.embedding_dim
        )

    async def HealthCheck(
        self, request: vpb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vpb.HealthCheckResponse:
        self.w.counters.health_checks += 1
        if self.w.stopping:
            return vpb.HealthCheckResponse(healthy=False, message="Engine is not alive")
        return vpb.HealthCheckResponse(healthy=True, message="Health")

    async def Abort(self, request: vpb.AbortRequest, context: grpc.aio.ServicerContext) -> vpb.AbortResponse:
        for rid in request.request_ids:
            self.w.abort(rid)
        return vpb.AbortResponse()

    async def GetModelInfo(
        self, request: vpb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetModelInfoResponse:
        w = self.w
        cfg = w.config
        defaults = {k: v for k, v in cfg.sampling_defaults_dict().items() if k in _DEFAULT_KEYS}
        return vpb.GetModelInfoResponse(
            model_path=cfg.model, is_generation=True, max_context_length=cfg.context_length,
            vocab_size=w.vocab.vocab_size, served_model_name=cfg.served_name, tokenizer_path=str(w.model_path),
            model_type=MODEL_TYPE, architectures=[ARCHITECTURE], eos_token_ids=list(w.vocab.eos_ids),
            max_req_input_len=cfg.context_length,
            default_sampling_params_json=json.dumps(defaults, separators=(",", ":")) if defaults else "",
        )

    async def GetServerInfo(
        self, request: vpb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vpb.GetServerInfoResponse:
        w = self.w
        return vpb.GetServerInfoResponse(
            active_requests=w.busy,
            last_receive_timestamp=w.scheduler.last_receive, uptime_seconds=time.time() - w.started_at,
            server_type="vllm-grpc", data_parallel_size=w.config.dp_size, block_size=w.config.page_size,
            max_num_seqs=w.config.max_running_requests,
        )

    async def GetLoads(self, request: vpb.GetLoadsRequest, context: grpc.aio.ServicerContext) -> vpb.GetLoadsResponse:
        loads = [
            vpb.SchedulerLoad(
                dp_rank=s.dp_rank, num_running_reqs=s.num_running_reqs, num_waiting_reqs=s.num_waiting_reqs,
                num_total_reqs=s.num_total_reqs, num_used_tokens=s.num_used_tokens,
                max_total_num_tokens=s.max_total_num_tokens, token_usage=s.token_usage, gen_throughput=s.gen_throughput,
                cache_hit_rate=s.cache_hit_rate, utilization=s.utilization, max_running_requests=s.max_running_requests,
                num_waiting_uncached_tokens=s.num_waiting_uncached_tokens,
            )
            for s in self.w.scheduler_loads()
        ]
        return vpb.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version=SIM_VERSION,
            dp_rank_count=len(loads), loads=loads,
        )

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        return await self._sglang.FlushCache(request, context)

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        async for chunk in self._sglang.GetTokenizer(request, context):
            yield chunk

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in self._sglang.SubscribeKvEvents(request, context):
            yield batch
