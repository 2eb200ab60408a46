"""vLLM's gRPC engine service in the worker seam's terms: no I/O, only translation.

The seam speaks SGLang's scheduler messages; vLLM's ``VllmEngine`` has the same shape
with differences that matter to the gateway (read from the published contract and
vLLM's servicer):

* Its replies carry no request id, and a streamed chunk's ``completion_tokens`` is
  that chunk's count, not a running total (the complete's too, when streamed): the
  reader keeps the totals per sample, so the pipeline sees SGLang's cumulative counts.
* A streamed sample ends with its last chunk and then a complete holding the same
  ids, as on SGLang; an unstreamed ``n>1`` answer numbers its completes by sample.
* ``top_k`` is unsigned (0 is "off"), ``temperature`` and the token limit are
  optional (unset: 1.0 and the context), logprobs are one count of alternatives
  (``logprobs``) and prompt logprobs cover every prompt position from the first.
* finish_reason "error" is the engine failing the request, not an ending.

What the service cannot take is refused before the call (``lacking``): the request
fails as INVALID_ARGUMENT, a 400 that names the feature, instead of the feature
being dropped on the floor.
"""

from __future__ import annotations

import time
from typing import Any

from google.protobuf.json_format import MessageToDict

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import vllm_engine_pb2 as vpb
from gateway.workers.transport import CallCode, WorkerCallError

# What vLLM's gRPC service has no field for: feature -> why a request needing it is refused.
LACKS: dict[str, str] = {
    "token_ids_logprob": "logprobs of chosen token ids (token_ids_logprob)",
    "hidden_states": "hidden states (return_hidden_states)",
    "lora": "LoRA adapters by id (lora_id)",
    "custom_logit_processor": "custom logit processors",
    "input_embeds": "input embeddings instead of token ids",
    "multimodal": "multimodal inputs",
    "pd_bootstrap": "SGLang's prefill/decode bootstrap (vLLM pairs workers through its KV connector)",
}

_CONSTRAINTS = {"regex": "regex", "json_schema": "json_schema", "ebnf_grammar": "grammar", "structural_tag": "structural_tag"}


def lacking(request: pb.GenerateRequest) -> list[str]:
    """The features of ``request`` that vLLM's gRPC service lacks."""
    out = []
    if request.token_ids_logprob:
        out.append("token_ids_logprob")
    if request.return_hidden_states:
        out.append("hidden_states")
    if request.lora_id:
        out.append("lora")
    if request.custom_logit_processor:
        out.append("custom_logit_processor")
    if request.input_embeds:
        out.append("input_embeds")
    if request.HasField("mm_inputs"):
        out.append("multimodal")
    if request.HasField("disaggregated_params") and request.disaggregated_params.bootstrap_host:
        out.append("pd_bootstrap")
    return out


def refusal(kind: str, url: str, features: list[str]) -> WorkerCallError:
    """The INVALID_ARGUMENT a request needing ``features`` gets (the client sees a 400)."""
    named = "; ".join(LACKS[f] for f in features)
    return WorkerCallError(
        CallCode.INVALID_ARGUMENT,
        f"the {kind} worker at {url} cannot serve this request: it lacks {named}",
    )


def sampling_params(sp: pb.SamplingParams, seed: int | None = None) -> vpb.SamplingParams:
    out = vpb.SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p or 1.0,
        top_k=max(0, sp.top_k),
        min_p=sp.min_p,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty or 1.0,
        min_tokens=sp.min_new_tokens,
        stop_token_ids=sp.stop_token_ids,
        skip_special_tokens=sp.skip_special_tokens,
        spaces_between_special_tokens=sp.spaces_between_special_tokens,
        ignore_eos=sp.ignore_eos,
        n=max(1, sp.n),
    )
    if sp.HasField("max_new_tokens"):
        out.max_tokens = sp.max_new_tokens
    if sp.stop:
        out.stop.extend(sp.stop)
    for token, bias in sp.logit_bias.items():
        out.logit_bias[int(token)] = bias
    constraint = sp.WhichOneof("constraint")
    if constraint is not None:
        setattr(out, _CONSTRAINTS[constraint], getattr(sp, constraint))
    if seed is not None:
        out.seed = seed
    return out


def custom_seed(sp: pb.SamplingParams) -> int | None:
    """A pass-through client's ``custom_params.seed``: vLLM has a field for it."""
    if not sp.HasField("custom_params"):
        return None
    seed = MessageToDict(sp.custom_params).get("seed")
    return int(seed) if isinstance(seed, int | float) and not isinstance(seed, bool) else None


def generate_request(request: pb.GenerateRequest) -> vpb.GenerateRequest:
    """The vLLM request for one seam request (``lacking`` is checked by the caller)."""
    out = vpb.GenerateRequest(
        request_id=request.request_id,
        sampling_params=sampling_params(request.sampling_params, custom_seed(request.sampling_params)),
        stream=request.stream,
    )
    out.tokenized.input_ids.extend(request.tokenized.input_ids)
    if request.tokenized.original_text:
        out.tokenized.original_text = request.tokenized.original_text
    if request.return_logprob:
        out.sampling_params.logprobs = max(0, request.top_logprobs_num)
        if request.logprob_start_len >= 0:
            out.sampling_params.prompt_logprobs = max(0, request.top_logprobs_num)
    if request.HasField("data_parallel_rank"):
        out.data_parallel_rank = request.data_parallel_rank
    return out


def _top(rows: Any, into: Any) -> None:
    for row in rows:
        into.add(values=row.values, token_ids=row.token_ids)


def _output_logprobs(lp: vpb.OutputLogProbs, into: pb.OutputLogProbs) -> None:
    into.token_logprobs.extend(lp.token_logprobs)
    into.token_ids.extend(lp.token_ids)
    _top(lp.top_logprobs, into.top_logprobs)


def _input_logprobs(lp: vpb.InputLogProbs, start: int, into: pb.InputLogProbs) -> None:
    """vLLM sends every prompt position; the seam wants them from ``logprob_start_len``."""
    for entry in lp.token_logprobs[start:]:
        if entry.HasField("value"):
            into.token_logprobs.add(value=entry.value)
        else:
            into.token_logprobs.add()
    into.token_ids.extend(lp.token_ids[start:])
    _top(lp.top_logprobs[start:], into.top_logprobs)


class ReplyReader:
    """Turns one Generate call's vLLM replies into the seam's, keeping per-sample totals."""

    __slots__ = ("_input_start", "_request_id", "_stream", "_totals")

    def __init__(self, request: pb.GenerateRequest) -> None:
        self._request_id = request.request_id
        self._stream = request.stream
        self._input_start = request.logprob_start_len if request.return_logprob else -1
        self._totals: dict[int, int] = {}

    def read(self, reply: vpb.GenerateResponse) -> pb.GenerateResponse:
        kind = reply.WhichOneof("response")
        if kind == "chunk":
            c = reply.chunk
            total = self._totals.get(c.index, 0) + len(c.token_ids)
            self._totals[c.index] = total
            chunk = pb.GenerateStreamChunk(
                token_ids=c.token_ids, prompt_tokens=c.prompt_tokens, completion_tokens=total,
                cached_tokens=c.cached_tokens, index=c.index,
            )
            if c.HasField("output_logprobs"):
                _output_logprobs(c.output_logprobs, chunk.output_logprobs)
            if c.HasField("input_logprobs") and self._input_start >= 0:
                _input_logprobs(c.input_logprobs, self._input_start, chunk.input_logprobs)
            return pb.GenerateResponse(request_id=self._request_id, chunk=chunk)
        if kind != "complete":
            raise WorkerCallError(CallCode.INTERNAL, "the worker sent a reply with neither chunk nor complete")
        d = reply.complete
        if d.finish_reason == "error":
            raise WorkerCallError(CallCode.INTERNAL, "the engine failed the request (finish_reason 'error')")
        # Streamed, the complete repeats the last chunk (already counted); unstreamed it is all.
        total = self._totals.get(d.index, 0) if self._stream else len(d.output_ids)
        complete = pb.GenerateComplete(
            output_ids=d.output_ids, finish_reason=d.finish_reason, prompt_tokens=d.prompt_tokens,
            completion_tokens=total, cached_tokens=d.cached_tokens, index=d.index,
            spec_accepted_tokens=d.spec_accepted_tokens, spec_draft_tokens=d.spec_draft_tokens,
        )
        stop = d.WhichOneof("matched_stop")
        if stop == "matched_token_id":
            complete.matched_token_id = d.matched_token_id
        elif stop == "matched_stop_str":
            complete.matched_stop_str = d.matched_stop_str
        if d.HasField("output_logprobs"):
            _output_logprobs(d.output_logprobs, complete.output_logprobs)
        if d.HasField("input_logprobs") and self._input_start >= 0:
            _input_logprobs(d.input_logprobs, self._input_start, complete.input_logprobs)
        return pb.GenerateResponse(request_id=self._request_id, complete=complete)


def model_info(reply: vpb.GetModelInfoResponse) -> pb.GetModelInfoResponse:
    """vLLM's model info; its ``max_context_length`` is the model's context (max_model_len)."""
    return pb.GetModelInfoResponse(
        model_path=reply.model_path, tokenizer_path=reply.tokenizer_path, is_generation=reply.is_generation,
        served_model_name=reply.served_model_name, max_context_length=reply.max_context_length,
        vocab_size=reply.vocab_size, supports_vision=reply.supports_vision, model_type=reply.model_type,
        eos_token_ids=reply.eos_token_ids, pad_token_id=reply.pad_token_id, bos_token_id=reply.bos_token_id,
        max_req_input_len=reply.max_req_input_len, architectures=reply.architectures,
        default_sampling_params_json=reply.default_sampling_params_json,
    )


def server_info(
    reply: vpb.GetServerInfoResponse, model: vpb.GetModelInfoResponse | None, kv_tokens: int,
    started: float = 0.0,
) -> pb.GetServerInfoResponse:
    """vLLM's server info as server arguments: the block size is the page size, the
    data-parallel size the rank count, ``max_num_seqs`` the running cap; the KV pool
    (``kv_tokens``) comes from GetLoads, which alone reports it. vLLM reports its uptime,
    not its start: ``started`` is the start the caller settled on (see ``StartClock``)."""
    args: dict[str, Any] = {"dp_size": max(1, reply.data_parallel_size)}
    if reply.block_size > 0:
        args["page_size"] = reply.block_size
    if reply.max_num_seqs > 0:
        args["max_running_requests"] = reply.max_num_seqs
    if reply.kv_role:
        args["kv_role"] = reply.kv_role
    if model is not None:
        if model.served_model_name:
            args["served_model_name"] = model.served_model_name
        if model.max_context_length > 0:
            args["context_length"] = model.max_context_length
    out = pb.GetServerInfoResponse(
        active_requests=reply.active_requests, is_paused=reply.is_paused,
        last_receive_timestamp=reply.last_receive_timestamp, uptime_seconds=reply.uptime_seconds,
        server_type=reply.server_type or "vllm-grpc", max_total_num_tokens=max(0, kv_tokens),
    )
    out.server_args.update(args)
    if started > 0:  # a restart behind the same address changes it
        out.start_time.FromNanoseconds(int(started * 1e9))
    return out


class StartClock:
    """A worker's start time from the uptimes it reports, held steady between polls.

    ``now - uptime`` moves by the poll's own delays each time; the gateway takes a changed
    start time for a restart (and forgets the worker's cache), so a start within
    ``tolerance_s`` of the one held is the same start, and only a larger jump (uptime
    starting over) is a new one."""

    __slots__ = ("started", "tolerance_s")

    def __init__(self, tolerance_s: float = 2.0) -> None:
        self.tolerance_s = tolerance_s
        self.started = 0.0

    def observe(self, uptime_s: float, now: float | None = None) -> float:
        """The start time to report for this uptime (0.0 when the worker gives none)."""
        if uptime_s <= 0:
            return self.started
        derived = (time.time() if now is None else now) - uptime_s
        if not self.started or abs(derived - self.started) > self.tolerance_s:
            self.started = derived
        return self.started


def loads(reply: vpb.GetLoadsResponse) -> pb.GetLoadsResponse:
    out = pb.GetLoadsResponse(timestamp=reply.timestamp, version=reply.version, dp_rank_count=reply.dp_rank_count)
    agg = out.aggregate
    for load in reply.loads:
        out.loads.add(
            dp_rank=load.dp_rank, num_running_reqs=load.num_running_reqs, num_waiting_reqs=load.num_waiting_reqs,
            num_total_reqs=load.num_total_reqs, num_used_tokens=load.num_used_tokens,
            max_total_num_tokens=load.max_total_num_tokens, token_usage=load.token_usage,
            gen_throughput=load.gen_throughput, cache_hit_rate=load.cache_hit_rate, utilization=load.utilization,
            max_running_requests=load.max_running_requests,
            num_waiting_uncached_tokens=load.num_waiting_uncached_tokens,
        )
        agg.total_running_reqs += load.num_running_reqs
        agg.total_waiting_reqs += load.num_waiting_reqs
        agg.total_reqs += load.num_total_reqs
    if reply.loads:
        n = len(reply.loads)
        agg.avg_token_usage = sum(x.token_usage for x in reply.loads) / n
        agg.avg_throughput = sum(x.gen_throughput for x in reply.loads) / n
        agg.avg_utilization = sum(x.utilization for x in reply.loads) / n
    return out


def embed_request(request: pb.EmbedRequest) -> vpb.EmbedRequest:
    out = vpb.EmbedRequest(request_id=request.request_id)
    out.tokenized.input_ids.extend(request.tokenized.input_ids)
    return out


def embed_response(reply: vpb.EmbedResponse) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embedding=reply.embedding, embedding_dim=reply.embedding_dim or len(reply.embedding),
        prompt_tokens=reply.prompt_tokens,
    )


def kv_pool_tokens(reply: vpb.GetLoadsResponse) -> int:
    """The KV pool of the whole endpoint, summed over its ranks (0: not reported)."""
    return sum(max(0, load.max_total_num_tokens) for load in reply.loads)


__all__ = [
    "LACKS", "ReplyReader", "StartClock", "custom_seed", "embed_request", "embed_response", "generate_request", "kv_pool_tokens", "lacking",
    "loads", "model_info", "refusal", "sampling_params", "server_info",
]
