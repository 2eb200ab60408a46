"""Operator-set request limits, checked once in the pipeline so every front door obeys them.

The request models (``protocol/limits.py``) hold hard ceilings no deployment should
exceed; these options let an operator tighten them. Each breach is a 400 in the
OpenAI error shape naming the offending parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import limits as hard
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.sampling import SamplingOptions
from gateway.settings import check_at_least, option


@dataclass
class LimitsConfig:
    max_prompt_tokens: int = option(0, "longest prompt accepted, in tokens (0: only the model's context length)")
    max_tokens_cap: int = option(0, "largest max_tokens a request may ask for; also the default when it asks none (0: no cap)")
    max_n: int = option(hard.MAX_N, "most completions per request (n)")
    max_batch_size: int = option(hard.MAX_BATCH, "most prompts (or embedding inputs) per request; each also takes its own admission slot and rate-limit token")
    max_stop_sequences: int = option(hard.MAX_STOP_SEQUENCES, "most stop strings per request")
    max_tool_schema_bytes: int = option(hard.MAX_SCHEMA_BYTES, "largest declared tools list, in serialized JSON bytes")
    max_response_bytes: int = option(
        16 * 1024 * 1024,
        "largest answer a request may ask for, estimated up front from prompts x n x max_tokens (x top_logprobs "
        "when logprobs are asked for); larger requests get a 400 (0: no bound)",
    )

    def __post_init__(self) -> None:
        check_at_least(self, 0, "max_prompt_tokens", "max_tokens_cap", "max_stop_sequences", "max_response_bytes")
        check_at_least(self, 1, "max_n", "max_batch_size", "max_tool_schema_bytes")


def check_batch(size: int, limits: LimitsConfig, *, param: str = "prompt") -> None:
    if size > limits.max_batch_size:
        raise InvalidRequestError(
            f"the request has {size} prompts; this gateway accepts at most {limits.max_batch_size} per request",
            param=param, code="batch_too_large",
        )


def check_prompt(prompt_ids: Sequence[int], limits: LimitsConfig, *, param: str = "prompt") -> None:
    check_prompt_tokens(len(prompt_ids), limits, param=param)


def check_prompt_tokens(tokens: int, limits: LimitsConfig, *, param: str = "prompt") -> None:
    """``--max-prompt-tokens`` against a prompt's length alone (``check_prompt`` without the ids)."""
    cap = limits.max_prompt_tokens
    if cap > 0 and tokens > cap:
        raise InvalidRequestError(
            f"the prompt has {tokens} tokens; this gateway accepts at most {cap}",
            param=param, code="prompt_too_long",
        )


def apply_sampling_limits(
    sampling: SamplingOptions, limits: LimitsConfig, *, room: int | None = None
) -> SamplingOptions:
    """Reject sampling options over the limits; fill in max_tokens from the cap when unset
    (never past ``room``, what the context leaves after the prompt)."""
    if sampling.n > limits.max_n:
        raise InvalidRequestError(f"n is {sampling.n}; this gateway allows at most {limits.max_n}", param="n")
    if len(sampling.stop) > limits.max_stop_sequences:
        raise InvalidRequestError(
            f"{len(sampling.stop)} stop sequences given; this gateway allows at most {limits.max_stop_sequences}",
            param="stop",
        )
    cap = limits.max_tokens_cap
    if cap > 0:
        if sampling.max_new_tokens is None:
            fill = cap if room is None or room <= 0 else min(cap, room)
            return dataclasses.replace(sampling, max_new_tokens=fill)
        if sampling.max_new_tokens > cap:
            raise InvalidRequestError(
                f"max_tokens is {sampling.max_new_tokens}; this gateway allows at most {cap}",
                param="max_tokens",
            )
    return sampling


TEXT_BYTES_PER_TOKEN = 8
"""Estimated answer bytes of one generated token without logprobs (its text, escaped)."""

LOGPROB_BYTES = 64
"""Estimated answer bytes of one logprob entry (token, logprob, bytes), chosen or alternative."""


def estimated_response_bytes(sampling: SamplingOptions, *, prompts: int = 1, max_tokens: int) -> int:
    per_token = TEXT_BYTES_PER_TOKEN
    if sampling.logprobs:
        per_token += LOGPROB_BYTES * (1 + max(0, sampling.top_logprobs))
    return prompts * sampling.n * max_tokens * per_token


def check_response_bytes(sampling: SamplingOptions, limits: LimitsConfig, *, prompts: int = 1, room: int | None = None) -> None:
    """Refuse a request whose answer could pass ``--max-response-bytes``: every sample
    (prompts x n) of up to max_tokens tokens (or what the context leaves, when unset),
    each with its logprob entries. A small request must not buy a huge answer."""
    bound = limits.max_response_bytes
    max_tokens = sampling.max_new_tokens or room
    if bound <= 0 or not max_tokens or max_tokens <= 0:
        return
    size = estimated_response_bytes(sampling, prompts=prompts, max_tokens=max_tokens)
    if size > bound:
        raise InvalidRequestError(
            f"this request could produce about {size} bytes ({prompts * sampling.n} samples of up to {max_tokens} "
            f"tokens{' with logprobs' if sampling.logprobs else ''}); this gateway answers at most {bound} bytes: "
            "lower n, max_tokens or top_logprobs",
            param="n" if sampling.n > 1 else "max_tokens", code="response_too_large",
        )


def check_token_ids(sampling: SamplingOptions, vocab: int) -> None:
    """Token ids a request names beside its prompt (logit_bias keys, stop_token_ids) must
    be in the vocabulary: a worker indexing past its logits row fails the whole batch."""
    if sampling.logit_bias:
        top = max(int(k) for k in sampling.logit_bias)
        if top >= vocab:
            raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {vocab}); got {top}", param="logit_bias")
    if sampling.stop_token_ids and max(sampling.stop_token_ids) >= vocab:
        raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab})", param="stop_token_ids")


def check_tools(tools: Sequence[dict[str, Any]] | None, limits: LimitsConfig) -> None:
    if not tools:
        return
    size = len(orjson.dumps(list(tools)))
    if size > limits.max_tool_schema_bytes:
        raise InvalidRequestError(
            f"the tools are {size} bytes when serialized; this gateway allows at most {limits.max_tool_schema_bytes}",
            param="tools",
        )
