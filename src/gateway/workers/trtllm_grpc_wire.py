"""TensorRT-LLM's gRPC service in the worker seam's terms: no I/O, only translation.

The seam speaks SGLang's scheduler messages; TensorRT-LLM's ``TrtllmService`` has the
same Generate shape with differences that matter to the gateway (read from the
published contract and TensorRT-LLM's own servicer):

* ``max_tokens`` is required (there is no "up to the context"): an unset limit becomes
  what the model's sequence length leaves after the prompt.
* Sampling knobs are proto3 ``optional`` and a sample is a "sequence" (``sequence_index``,
  ``num_return_sequences``); logprobs are one list of entries per token, each with its
  alternatives; a logit bias is a whole-vocabulary ``embedding_bias``.
* A streamed sample's complete holds *all* of its ids, not the last chunk's again as
  SGLang's does, and a chunk may carry no ids at all: the reader drops empty chunks,
  sends any ids the chunks missed as one more chunk, and gives the complete the last
  chunk's ids, so the pipeline (and a pass-through client) sees SGLang's stream.
* finish_reason is TensorRT-LLM's ("stop_word", "cancelled", "timeout", "error"): the
  first is a stop, the next two an abort, "error" the engine failing the request.
* There is no GetLoads, FlushCache or start time; the model info has the model's id and
  lengths and the batch size, the server info only versions and parallel sizes.

What the service cannot take is refused before the call (``lacking``), a 400 that
names the feature, as for vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import trtllm_service_pb2 as tpb
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.vllm_grpc_wire import custom_seed
from gateway.workers.vllm_grpc_wire import lacking as vllm_lacking

# What the service has no field (or no RPC) for: feature -> why it is refused or missing.
LACKS: dict[str, str] = {
    "token_ids_logprob": "logprobs of chosen token ids (token_ids_logprob)",
    "hidden_states": "hidden states (return_hidden_states)",
    "lora": "LoRA adapters by id (lora_id)",
    "custom_logit_processor": "custom logit processors",
    "input_embeds": "input embeddings instead of token ids",
    "multimodal": "multimodal inputs",
    "pd_bootstrap": "SGLang's prefill/decode bootstrap (TensorRT-LLM pairs workers its own way)",
    "dp_rank": "a data-parallel rank to pin",
    "logit_bias": "a logit bias while the worker's vocabulary size is unknown",
    "loads": "worker-reported loads (GetLoads): the gateway's own in-flight counts stand in",
    "flush_cache": "a cache flush (FlushCache)",
    "embed": "embeddings (TensorRT-LLM's servicer answers UNIMPLEMENTED)",
}

_GUIDES = {
    "regex": tpb.GuidedDecodingParams.GUIDE_TYPE_REGEX,
    "json_schema": tpb.GuidedDecodingParams.GUIDE_TYPE_JSON_SCHEMA,
    "ebnf_grammar": tpb.GuidedDecodingParams.GUIDE_TYPE_EBNF_GRAMMAR,
    "structural_tag": tpb.GuidedDecodingParams.GUIDE_TYPE_STRUCTURAL_TAG,
}
_FINISH = {"stop_word": "stop", "cancelled": "abort", "timeout": "abort"}


def lacking(request: pb.GenerateRequest, vocab_size: int = 0) -> list[str]:
    """The features of ``request`` that TensorRT-LLM's gRPC service lacks: those vLLM's
    lacks too (the two contracts leave out the same SGLang fields), a rank to pin, and a
    logit bias while the vocabulary is unknown."""
    out = vllm_lacking(request)
    if request.HasField("data_parallel_rank") and request.data_parallel_rank > 0:
        out.append("dp_rank")
    if request.sampling_params.logit_bias and vocab_size <= 0:
        out.append("logit_bias")
    return out


def refusal(kind: str, url: str, features: Sequence[str]) -> WorkerCallError:
    """The INVALID_ARGUMENT a request needing ``features`` gets (the client sees a 400)."""
    named = "; ".join(LACKS[f] for f in features)
    return WorkerCallError(
        CallCode.INVALID_ARGUMENT, f"the {kind} worker at {url} cannot serve this request: it lacks {named}",
    )


def max_tokens(request: pb.GenerateRequest, max_seq_len: int) -> int:
    """The request's token limit, or what the sequence length leaves after the prompt."""
    sp = request.sampling_params
    if sp.HasField("max_new_tokens"):
        return sp.max_new_tokens
    left = max_seq_len - len(request.tokenized.input_ids)
    if left < 1:
        raise WorkerCallError(
            CallCode.INVALID_ARGUMENT,
            "TensorRT-LLM needs a token limit and the worker reported no room after the prompt: set max_tokens",
        )
    return left


def sampling_config(sp: pb.SamplingParams, seed: int | None = None) -> tpb.SamplingConfig:
    out = tpb.SamplingConfig(
        beam_width=1, num_return_sequences=max(1, sp.n), temperature=sp.temperature,
        top_p=sp.top_p if 0.0 < sp.top_p <= 1.0 else 1.0,
        repetition_penalty=sp.repetition_penalty or 1.0,
    )
    if sp.top_k > 0:
        out.top_k = sp.top_k
    if sp.min_p > 0:
        out.min_p = sp.min_p
    if sp.frequency_penalty:
        out.frequency_penalty = sp.frequency_penalty
    if sp.presence_penalty:
        out.presence_penalty = sp.presence_penalty
    if sp.min_new_tokens > 0:
        out.min_tokens = sp.min_new_tokens
    if seed is not None:
        out.seed = seed % 2**64
    return out


def generate_request(request: pb.GenerateRequest, max_seq_len: int = 0, vocab_size: int = 0) -> tpb.GenerateRequest:
    """The TensorRT-LLM request for one seam request (``lacking`` is checked by the caller)."""
    sp = request.sampling_params
    out = tpb.GenerateRequest(
        request_id=request.request_id,
        sampling_config=sampling_config(sp, custom_seed(sp)),
        max_tokens=max_tokens(request, max_seq_len),
        streaming=request.stream,
        stop=sp.stop,
        stop_token_ids=sp.stop_token_ids,
        ignore_eos=sp.ignore_eos,
    )
    out.tokenized.input_token_ids.extend(request.tokenized.input_ids)
    if request.tokenized.original_text:
        out.tokenized.original_text = request.tokenized.original_text
    out.output_config.exclude_input_from_output = True
    if request.return_logprob:
        out.output_config.logprobs = max(0, request.top_logprobs_num)
        if request.logprob_start_len >= 0:
            out.output_config.prompt_logprobs = max(0, request.top_logprobs_num)
    constraint = sp.WhichOneof("constraint")
    if constraint is not None:
        out.guided_decoding.guide_type = _GUIDES[constraint]
        out.guided_decoding.guide = getattr(sp, constraint)
    if sp.logit_bias and vocab_size > 0:
        bias = [0.0] * vocab_size
        for token, value in sp.logit_bias.items():
            if 0 <= int(token) < vocab_size:
                bias[int(token)] = value
        out.embedding_bias.extend(bias)
    return out


def _output_logprobs(entries: Sequence[tpb.TokenLogprob], into: pb.OutputLogProbs) -> None:
    for entry in entries:
        into.token_logprobs.append(entry.logprob)
        into.token_ids.append(entry.token_id)
        into.top_logprobs.add(
            values=[t.logprob for t in entry.top_logprobs], token_ids=[t.token_id for t in entry.top_logprobs],
        )


def _input_logprobs(entries: Sequence[tpb.TokenLogprob], prompt_len: int, start: int, into: pb.InputLogProbs) -> None:
    """TensorRT-LLM's prompt entries, aligned on the prompt's end (the first prompt token
    has no logprob, and may have no entry), from ``start`` on as the seam wants."""
    missing = max(0, prompt_len - len(entries))
    for position in range(start, prompt_len):
        at = position - missing
        if at < 0:
            into.token_logprobs.add()
            into.token_ids.append(0)
            into.top_logprobs.add()
            continue
        entry = entries[at]
        into.token_logprobs.add(value=entry.logprob)
        into.token_ids.append(entry.token_id)
        into.top_logprobs.add(
            values=[t.logprob for t in entry.top_logprobs], token_ids=[t.token_id for t in entry.top_logprobs],
        )


class ReplyReader:
    """Turns one Generate call's TensorRT-LLM replies into the seam's (zero, one or two
    messages per reply), keeping what each sample's chunks carried."""

    __slots__ = ("_input_start", "_last", "_prompt_len", "_request_id", "_sent", "_stream")

    def __init__(self, request: pb.GenerateRequest) -> None:
        self._request_id = request.request_id
        self._stream = request.stream
        self._prompt_len = len(request.tokenized.input_ids)
        self._input_start = request.logprob_start_len if request.return_logprob else -1
        self._sent: dict[int, int] = {}
        self._last: dict[int, list[int]] = {}

    def _chunk(self, index: int, ids: Sequence[int], prompt: int, cached: int) -> pb.GenerateResponse:
        total = self._sent.get(index, 0) + len(ids)
        self._sent[index] = total
        self._last[index] = list(ids)
        chunk = pb.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=prompt, completion_tokens=total, cached_tokens=cached, index=index,
        )
        return pb.GenerateResponse(request_id=self._request_id, chunk=chunk)

    def read(self, reply: tpb.GenerateResponse) -> list[pb.GenerateResponse]:
        kind = reply.WhichOneof("response")
        if kind == "chunk":
            c = reply.chunk
            if not c.token_ids:
                return []  # TensorRT-LLM's "nothing yet": SGLang never sends one
            chunk = self._chunk(c.sequence_index, c.token_ids, c.prompt_tokens, c.cached_tokens)
            if c.logprobs:
                _output_logprobs(c.logprobs, chunk.chunk.output_logprobs)
            return [chunk]
        if kind != "complete":
            raise WorkerCallError(CallCode.INTERNAL, "the worker sent a reply with neither chunk nor complete")
        d = reply.complete
        if d.finish_reason == "error":
            raise WorkerCallError(CallCode.INTERNAL, "the engine failed the request (finish_reason 'error')")
        index = d.sequence_index
        out: list[pb.GenerateResponse] = []
        ids: Sequence[int] = d.output_token_ids
        if self._stream:
            tail = list(d.output_token_ids[self._sent.get(index, 0):])
            if tail:  # ids no chunk carried: sent as a chunk, as SGLang would have
                missed = self._chunk(index, tail, d.prompt_tokens, d.cached_tokens)
                if d.logprobs:
                    _output_logprobs(d.logprobs[len(d.logprobs) - len(tail):], missed.chunk.output_logprobs)
                out.append(missed)
            ids = self._last.get(index, [])
        complete = pb.GenerateComplete(
            output_ids=ids, finish_reason=_FINISH.get(d.finish_reason, d.finish_reason or "stop"),
            prompt_tokens=d.prompt_tokens, completion_tokens=len(d.output_token_ids),
            cached_tokens=d.cached_tokens, index=index,
            spec_accepted_tokens=d.spec_accepted_tokens, spec_draft_tokens=d.spec_draft_tokens,
        )
        stop = d.WhichOneof("matched_stop")
        if stop == "matched_token_id":
            complete.matched_token_id = d.matched_token_id
        elif stop == "matched_stop_str":
            complete.matched_stop_str = d.matched_stop_str
        if d.logprobs and not self._stream:
            _output_logprobs(d.logprobs, complete.output_logprobs)
        if d.prompt_logprobs and self._input_start >= 0:
            _input_logprobs(d.prompt_logprobs, self._prompt_len, self._input_start, complete.input_logprobs)
        out.append(pb.GenerateResponse(request_id=self._request_id, complete=complete))
        return out


def healthy(reply: tpb.HealthCheckResponse) -> pb.HealthCheckResponse:
    """TensorRT-LLM says "OK" when its executor is alive, else what is wrong."""
    ok = reply.status.strip().upper() == "OK"
    return pb.HealthCheckResponse(healthy=ok, message=reply.status)


def model_info(reply: tpb.GetModelInfoResponse) -> pb.GetModelInfoResponse:
    """The model's id is its name and, when it is a folder on this host, its tokenizer's;
    ``max_seq_len`` is the context (prompt plus output), ``max_input_len`` the prompt limit."""
    return pb.GetModelInfoResponse(
        model_path=reply.model_id, tokenizer_path=reply.model_id, is_generation=True,
        max_context_length=max(0, reply.max_seq_len), vocab_size=max(0, reply.vocab_size),
        max_req_input_len=max(0, reply.max_input_len),
    )


def server_info(reply: tpb.GetServerInfoResponse, model: tpb.GetModelInfoResponse | None) -> pb.GetServerInfoResponse:
    """Server arguments from what TensorRT-LLM reports: one rank (it reports no data
    parallelism), the context and, from the batch size, the running cap. Its page size
    and KV pool are unknown (KV events may tell the page size)."""
    args: dict[str, Any] = {"dp_size": 1, "tp_size": max(1, reply.tensor_parallel_size)}
    if model is not None:
        if model.max_seq_len > 0:
            args["context_length"] = model.max_seq_len
        if model.max_batch_size > 0:
            args["max_running_requests"] = model.max_batch_size
    out = pb.GetServerInfoResponse(server_type=f"trtllm-grpc/{reply.backend or 'unknown'}", sglang_version=reply.version)
    out.server_args.update(args)
    return out


def embed_request(request: pb.EmbedRequest) -> tpb.EmbedRequest:
    out = tpb.EmbedRequest(request_id=request.request_id)
    out.tokenized.input_token_ids.extend(request.tokenized.input_ids)
    return out


def embed_response(reply: tpb.EmbedResponse) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embedding=reply.embedding, embedding_dim=len(reply.embedding), prompt_tokens=reply.prompt_tokens,
    )


__all__ = [
    "LACKS", "ReplyReader", "embed_request", "embed_response", "generate_request", "healthy", "lacking", "max_tokens",
    "model_info", "refusal", "sampling_config", "server_info",
]
