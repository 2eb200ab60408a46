"""The front doors' one rule set, applied to SGLang-shaped requests (the scheduler pass-through).

A pass-through client sends the worker's own ``GenerateRequest``. Before it goes to a
worker it is held to exactly the rules of ``/generate``: its sampling parameters are
validated by the same request model (ranges, NaN and infinity, stops, logit_bias,
constraints), its prompt by ``Engine.prepare`` (vocabulary, ``--max-prompt-tokens``,
the context length, ``--max-n``, ``--max-tokens-cap``, which also fills an unset
``max_new_tokens``). Fields a client must not control are refused or stripped; each is
listed with its reason in ``FORBIDDEN`` / ``STRIPPED`` and in docs/security.md.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine
from gateway.pipeline.prepared import PreparedRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol import limits as hard
from gateway.protocol.errors import InvalidRequestError, validation_error_to_gateway
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.sampling import sampling_from_generate

FORBIDDEN: dict[str, str] = {
    "custom_logit_processor": "a serialized callable the worker would run: client code on the GPU host",
    "disaggregated_params": "the prefill host and port a decode worker connects to; the gateway pairs PD workers itself",
    "input_embeds": "embeddings instead of token ids: nothing to validate, route or bound",
    "mm_inputs": "URLs and blobs the worker would fetch or decode; the gateway serves text models",
}
"""GenerateRequest fields the pass-through refuses (400), with the reason."""

STRIPPED: dict[str, str] = {
    "return_hidden_states": "hidden states are a debugging aid, megabytes per token",
    "data_parallel_rank": "pins a DP rank, overriding the worker's balancing",
    "log_metrics": "worker-side metric logging is the operator's choice",
}
"""GenerateRequest fields the pass-through clears before forwarding, with the reason."""

# custom_params keys a pass-through client may send: a seed (validated and relayed; SGLang's
# sampler does not read it, see pipeline/sampling.py); others feed custom logit processors.
ALLOWED_CUSTOM_PARAMS = frozenset({"seed"})


def _sampling_dict(params: pb.SamplingParams) -> dict[str, Any]:
    """The worker's SamplingParams in /generate's ``sampling_params`` shape (proto3 zeros
    that mean "off" become the defaults)."""
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p or 1.0,
        "top_k": params.top_k if params.top_k not in (0,) else -1,
        "min_p": params.min_p,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
        "repetition_penalty": params.repetition_penalty or 1.0,
        "max_new_tokens": params.max_new_tokens if params.HasField("max_new_tokens") else None,
        "min_new_tokens": params.min_new_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "n": params.n or 1,
        "ignore_eos": params.ignore_eos,
        "skip_special_tokens": params.skip_special_tokens,
        "spaces_between_special_tokens": params.spaces_between_special_tokens,
        "no_stop_trim": params.no_stop_trim,
        "logit_bias": dict(params.logit_bias) or None,
    }
    kind = params.WhichOneof("constraint")
    if kind == "regex":
        out["regex"] = params.regex
    elif kind == "json_schema":
        out["json_schema"] = params.json_schema
    elif kind == "ebnf_grammar":
        out["ebnf"] = params.ebnf_grammar
    elif kind == "structural_tag":
        if len(params.structural_tag.encode()) > hard.MAX_SCHEMA_BYTES:
            raise InvalidRequestError(f"structural_tag is larger than {hard.MAX_SCHEMA_BYTES} bytes", param="sampling_params.structural_tag")
    if params.HasField("custom_params"):
        extra = set(params.custom_params.fields) - ALLOWED_CUSTOM_PARAMS
        if extra:
            raise InvalidRequestError(
                f"custom_params {sorted(extra)} are not accepted (they feed custom logit processors); only 'seed' is",
                param="sampling_params.custom_params",
            )
        seed = params.custom_params.fields.get("seed")
        if seed is not None:
            if not (seed.HasField("number_value") and math.isfinite(seed.number_value) and seed.number_value == int(seed.number_value)):
                raise InvalidRequestError("custom_params.seed must be an integer", param="sampling_params.custom_params")
            out["sampling_seed"] = int(seed.number_value)
    if params.HasField("stream_interval") and params.stream_interval < 1:
        raise InvalidRequestError("stream_interval must be at least 1", param="sampling_params.stream_interval")
    return out


def check_scheduler_generate(
    engine: Engine, entry: ModelEntry, request: pb.GenerateRequest, *, cache_salt: str | None = None
) -> tuple[pb.GenerateRequest, PreparedRequest]:
    """Validate a pass-through Generate under the gateway's rules; returns the request to
    forward (stripped fields cleared, max_new_tokens and n settled) and its preparation."""
    for name, why in FORBIDDEN.items():
        if request.HasField(name) if name in ("disaggregated_params", "mm_inputs") else bool(getattr(request, name)):
            raise InvalidRequestError(f"{name} is not accepted through the gateway: {why}", param=name)
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise InvalidRequestError("tokenized.input_ids is empty: the pass-through routes on token ids", param="tokenized")
    if len(request.token_ids_logprob) > hard.MAX_STOP_TOKEN_IDS:
        raise InvalidRequestError(f"at most {hard.MAX_STOP_TOKEN_IDS} token_ids_logprob", param="token_ids_logprob")
    vocab = entry.tokenizer.vocab_size
    if request.token_ids_logprob and max(request.token_ids_logprob) >= vocab:
        raise InvalidRequestError(f"token_ids_logprob must be in [0, {vocab})", param="token_ids_logprob")
    try:
        model = GenerateRequest.model_validate({
            "input_ids": [0],  # the prompt is checked by Engine.prepare, without a copy through pydantic
            "sampling_params": _sampling_dict(request.sampling_params),
            "stream": request.stream,
            "return_logprob": request.return_logprob,
            "top_logprobs_num": request.top_logprobs_num,
            "logprob_start_len": request.logprob_start_len if request.return_logprob else -1,
        })
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None
    sampling = sampling_from_generate(model)
    if not request.sampling_params.HasField("max_new_tokens"):
        # /generate's model defaults max_new_tokens to 128; the worker's own default is
        # "until the context ends", which the operator's cap bounds instead.
        import dataclasses

        sampling = dataclasses.replace(sampling, max_new_tokens=None)
    prepared = engine.prepare(entry, ids, sampling, stream=request.stream, request_id=request.request_id,
                              prompt_param="tokenized.input_ids", cache_salt=cache_salt)
    out = pb.GenerateRequest()
    out.CopyFrom(request)
    if cache_salt:  # the salted prompt (pipeline.tenancy) is what the worker must see
        out.tokenized.input_ids[:] = prepared.prompt_ids
    for name in STRIPPED:
        out.ClearField(name)
    params = out.sampling_params
    params.n = prepared.sampling.n
    wanted = prepared.sampling.max_new_tokens
    if wanted is None and entry.max_context_length:
        wanted = entry.max_context_length - len(prepared.prompt_ids) - 1  # explicit: the most SGLang admits
    if wanted is not None:
        params.max_new_tokens = wanted
    return out, prepared
