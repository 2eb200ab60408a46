"""Normalized sampling options -> the worker's SamplingParams message.

proto3 cannot say "unset" for scalars, and real workers take temperature and n
as sent, so both are always written; top_p/top_k/repetition_penalty zeros mean
"off" on the worker side and are written as their neutral values anyway.
The detokenization flags are written too: proto3 reads an unwritten
``spaces_between_special_tokens`` as false, while SGLang (and the OpenAI-style
request) defaults it to true, so leaving it out would change what a worker that
detokenizes itself (stop strings, its own text output) sees.

``seed`` travels as ``custom_params.seed``, the shape a pass-through client's seed
already has, because this message has no seed field of its own. The vLLM and
TensorRT-LLM transports move it to their engine's seed field (both engines' OpenAI
servers seed sampling with it). SGLang's transports leave it out: the SglangScheduler
wire (smg-grpc-proto 0.4.28, smg-grpc-servicer 0.14.1) has no field that reaches
SGLang's ``sampling_seed``, and ``custom_params`` there feeds custom logit processors
only, so a seeded request is not reproducible on a ``--grpc-mode`` worker, and the
gateway says so (docs/sglang-mapping.md) instead of pretending.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.sampling import SamplingOptions

_CONSTRAINT_FIELD = {"regex": "regex", "json_schema": "json_schema", "ebnf": "ebnf_grammar", "structural_tag": "structural_tag"}


def to_sampling_params(
    options: SamplingOptions, *, stop_token_ids: Sequence[int], max_new_tokens: int | None,
    stop_strings: Sequence[str] = (),
) -> pb.SamplingParams:
    """Build the worker-side params. The gateway matches stop strings itself; ``stop_strings``
    are the ones the worker may match too (only a worker with its own tokenizer gets any)."""
    params = pb.SamplingParams(
        temperature=float(options.temperature),
        top_p=float(options.top_p) if options.top_p else 1.0,
        top_k=int(options.top_k) if options.top_k else -1,
        min_p=float(options.min_p or 0.0),
        frequency_penalty=float(options.frequency_penalty or 0.0),
        presence_penalty=float(options.presence_penalty or 0.0),
        repetition_penalty=float(options.repetition_penalty or 1.0),
        stop=list(stop_strings),
        stop_token_ids=list(stop_token_ids),
        skip_special_tokens=bool(options.skip_special_tokens),
        spaces_between_special_tokens=bool(options.spaces_between_special_tokens),
        n=max(1, int(options.n)),
        min_new_tokens=int(options.min_new_tokens or 0),
        ignore_eos=bool(options.ignore_eos),
        no_stop_trim=bool(options.no_stop_trim),
    )
    if max_new_tokens is not None:
        params.max_new_tokens = int(max_new_tokens)
    if options.constraint is not None:
        kind, value = options.constraint
        setattr(params, _CONSTRAINT_FIELD[kind], value)
    if options.logit_bias:
        for token, bias in options.logit_bias.items():
            params.logit_bias[str(token)] = float(bias)
    if options.seed is not None:
        params.custom_params.update({"seed": int(options.seed)})
    return params
