"""The TrtllmService gRPC service of a simulated worker: TensorRT-LLM's wire on the same worker.

TensorRT-LLM's gRPC server (``trtllm_service.proto``) has the SGLang scheduler's
Generate shape; the simulated worker answers it through its SGLang servicer (same
validation, cache, step loop and faults) and says it the way TensorRT-LLM's servicer
does, where a client can tell the difference:

* ``max_tokens`` is taken as sent (the request must carry one); sampling knobs unset
  are TensorRT-LLM's defaults (temperature 1.0, top_p 1.0, no top-k).
* A streamed sample's chunks carry running ``completion_tokens`` and their sample as
  ``sequence_index``; its complete holds every id of the sample (not the last chunk's
  again), with the prompt logprobs, which only the complete carries.
* After an Abort RPC the request ends with a complete whose finish_reason is
  "cancelled"; Abort says whether the request was found.
* GetModelInfo reports the model's id, prompt limit, sequence length, batch size and
  vocabulary; GetServerInfo versions and parallel sizes only. There is no GetLoads or
  FlushCache (UNIMPLEMENTED, as on a server built from the contract), and Embed answers
  UNIMPLEMENTED as TensorRT-LLM's servicer does.
* HealthCheck says "OK", or what is wrong.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from gateway.proto import common_pb2, trtllm_service_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import trtllm_service_pb2 as tpb
from gateway_lab.sim.servicer import SIM_VERSION, ServedWorker, SimServicer
from gateway_lab.sim.vllm_servicer import EndsAbortedStreams

SERVICE = tpb.DESCRIPTOR.services_by_name["TrtllmService"].full_name
_GUIDES = {
    tpb.GuidedDecodingParams.GUIDE_TYPE_REGEX: "regex",
    tpb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA: "json_schema",
    tpb.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR: "ebnf_grammar",
    tpb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG: "structural_tag",
}


class _SglangSide(SimServicer):
    numbers_unary_samples = True


def scheduler_request(request: tpb.GenerateRequest) -> pb.GenerateRequest:
    """TensorRT-LLM's request as the simulated scheduler's."""
    sc = request.sampling_config
    params = pb.SamplingParams(
        temperature=sc.temperature if sc.HasField("temperature") else 1.0,
        top_p=sc.top_p if sc.HasField("top_p") else 1.0,
        top_k=sc.top_k if sc.HasField("top_k") and sc.top_k > 0 else -1,
        min_p=sc.min_p,
        frequency_penalty=sc.frequency_penalty,
        presence_penalty=sc.presence_penalty,
        repetition_penalty=sc.repetition_penalty if sc.HasField("repetition_penalty") else 1.0,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        n=sc.num_return_sequences or 1,
        min_new_tokens=sc.min_tokens,
        max_new_tokens=request.max_tokens,
    )
    if request.HasField("guided_decoding") and request.guided_decoding.guide_type in _GUIDES:
        setattr(params, _GUIDES[request.guided_decoding.guide_type], request.guided_decoding.guide)
    oc = request.output_config
    out = pb.GenerateRequest(
        request_id=request.request_id, sampling_params=params, stream=request.streaming,
        return_logprob=oc.HasField("logprobs") or oc.HasField("prompt_logprobs"),
        top_logprobs_num=max(oc.logprobs, oc.prompt_logprobs, 0),
        logprob_start_len=0 if oc.HasField("prompt_logprobs") else -1,
    )
    out.tokenized.input_ids.extend(request.tokenized.input_token_ids)
    return out


def _entries(lp: pb.OutputLogProbs) -> list[tpb.TokenLogprob]:
    out = []
    for i, (token, value) in enumerate(zip(lp.token_ids, lp.token_logprobs, strict=True)):
        entry = tpb.TokenLogprob(token_id=token, logprob=value)
        if i < len(lp.top_logprobs):
            row = lp.top_logprobs[i]
            entry.top_logprobs.extend(tpb.TopLogprob(token_id=t, logprob=v) for t, v in zip(row.token_ids, row.values, strict=True))
        out.append(entry)
    return out


def _prompt_entries(lp: pb.InputLogProbs) -> list[tpb.TokenLogprob]:
    """Every prompt position that has a value (TensorRT-LLM has none for the first)."""
    out = []
    for i, (entry, token) in enumerate(zip(lp.token_logprobs, lp.token_ids, strict=True)):
        if not entry.HasField("value"):
            continue
        item = tpb.TokenLogprob(token_id=token, logprob=entry.value)
        if i < len(lp.top_logprobs):
            row = lp.top_logprobs[i]
            item.top_logprobs.extend(tpb.TopLogprob(token_id=t, logprob=v) for t, v in zip(row.token_ids, row.values, strict=True))
        out.append(item)
    return out


class ReplyWriter:
    """The scheduler's replies of one call as TensorRT-LLM's servicer sends them."""

    def __init__(self) -> None:
        self._ids: dict[int, list[int]] = {}
        self._logprobs: dict[int, list[tpb.TokenLogprob]] = {}
        self._prompt: dict[int, list[tpb.TokenLogprob]] = {}

    def reply(self, reply: pb.GenerateResponse) -> tpb.GenerateResponse:
        rid = reply.request_id
        if reply.HasField("chunk"):
            c = reply.chunk
            self._ids.setdefault(c.index, []).extend(c.token_ids)
            entries = _entries(c.output_logprobs) if c.HasField("output_logprobs") else []
            self._logprobs.setdefault(c.index, []).extend(entries)
            if c.HasField("input_logprobs"):
                self._prompt[c.index] = _prompt_entries(c.input_logprobs)
            return tpb.GenerateResponse(request_id=rid, chunk=tpb.GenerateStreamChunk(
                token_ids=c.token_ids, sequence_index=c.index, prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens, cached_tokens=c.cached_tokens, logprobs=entries,
            ))
        d = reply.complete
        streamed = d.index in self._ids
        ids = self._ids.get(d.index, []) if streamed else list(d.output_ids)
        complete = tpb.GenerateComplete(
            output_token_ids=ids, sequence_index=d.index,
            finish_reason="cancelled" if d.finish_reason == "abort" else d.finish_reason,
            prompt_tokens=d.prompt_tokens, completion_tokens=len(ids), cached_tokens=d.cached_tokens,
        )
        if d.HasField("matched_token_id"):
            complete.matched_token_id = d.matched_token_id
        if streamed:
            complete.logprobs.extend(self._logprobs.get(d.index, []))
        elif d.HasField("output_logprobs"):
            complete.logprobs.extend(_entries(d.output_logprobs))
        prompt = self._prompt.get(d.index) or (_prompt_entries(d.input_logprobs) if d.HasField("input_logprobs") else [])
        complete.prompt_logprobs.extend(prompt)
        return tpb.GenerateResponse(request_id=rid, complete=complete)


class TrtllmSimServicer(trtllm_service_pb2_grpc.TrtllmServiceServicer):
    """Serves one simulated worker over TensorRT-LLM's service."""

    def __init__(self, worker: ServedWorker) -> None:
        self.w = worker
        self._sglang = _SglangSide(worker)

    async def Generate(
        self, request: tpb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tpb.GenerateResponse]:
        if not request.HasField("tokenized"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing tokenized input")
        writer = ReplyWriter()
        async for reply in self._sglang.Generate(scheduler_request(request), EndsAbortedStreams(context)):  # type: ignore[arg-type]
            yield writer.reply(reply)

    async def Embed(self, request: tpb.EmbedRequest, context: grpc.aio.ServicerContext) -> tpb.EmbedResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Embed RPC not yet implemented")
        raise AssertionError("unreachable: abort raises")

    async def HealthCheck(
        self, request: tpb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> tpb.HealthCheckResponse:
        self.w.counters.health_checks += 1
        return tpb.HealthCheckResponse(status="Executor is unhealthy" if self.w.stopping else "OK")

    async def Abort(self, request: tpb.AbortRequest, context: grpc.aio.ServicerContext) -> tpb.AbortResponse:
        found = self.w.abort(request.request_id) > 0
        return tpb.AbortResponse(
            success=found, message=f"Request {request.request_id} {'aborted' if found else 'not found'}",
        )

    async def GetModelInfo(
        self, request: tpb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> tpb.GetModelInfoResponse:
        w = self.w
        cfg = w.config
        return tpb.GetModelInfoResponse(
            model_id=cfg.served_name, max_input_len=w.max_req_input_len, max_seq_len=cfg.context_length,
            max_batch_size=cfg.max_running_requests, vocab_size=w.vocab.vocab_size,
        )

    async def GetServerInfo(
        self, request: tpb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> tpb.GetServerInfoResponse:
        return tpb.GetServerInfoResponse(
            version=SIM_VERSION, backend="pytorch", tensor_parallel_size=1, pipeline_parallel_size=1,
            context_parallel_size=1, world_size=1,
        )

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
