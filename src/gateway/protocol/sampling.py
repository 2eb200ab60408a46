"""``SamplingOptions``: the one normalized form of "how to generate" the pipeline consumes.

Three request shapes (chat, completions, SGLang /generate) name and default the
same knobs differently; the builders here settle every default once, so the
pipeline never looks at a request model to decide how to sample.

Defaults are OpenAI's (temperature 1.0, top_p 1.0) and the worker's "off" values
(top_k -1, min_p 0, repetition_penalty 1.0). ``max_new_tokens`` None means "the
worker's default" (chat without max_tokens: until the context is full).

A chat request also records which of the model-tunable knobs it left out
(``unset``): SGLang's own OpenAI server fills exactly those from the model's
generation defaults, and the pipeline does the same (``pipeline.model_facts``); a
caller that knows the model's defaults already passes them to ``sampling_from_chat``,
which fills them as it builds the options (one object, not a copy per request).
Completions and /generate keep their fixed defaults, as SGLang's server does.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.common import SamplingRequest, StructuredOutputs, choice_regex, stop_list
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.frozen import slots_builder
from gateway.protocol.generate import GenerateRequest

ConstraintKind = Literal["regex", "json_schema", "ebnf"]

JSON_OBJECT_SCHEMA = '{"type": "object"}'
"""The constraint for ``response_format: {"type": "json_object"}``: any JSON object."""


MODEL_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The knobs a model's generation_config.json may set defaults for (the set SGLang reads)."""

# The unset keys by which of them a chat request left out (in MODEL_DEFAULT_KEYS order).
_UNSET = {
    flags: frozenset(k for k, left_out in zip(MODEL_DEFAULT_KEYS, flags, strict=True) if left_out)
    for flags in itertools.product((False, True), repeat=len(MODEL_DEFAULT_KEYS))
}


def model_default_values(unset: frozenset[str], defaults: Mapping[str, float]) -> dict[str, int | float]:
    """The values a model's generation ``defaults`` give the knobs a request left out."""
    values: dict[str, int | float] = {}
    for key in unset:
        if key in defaults:
            value = defaults[key]
            values[key] = int(value) if key == "top_k" else float(value)
    if values.get("top_k") == 0:
        values["top_k"] = -1  # 0 means "off" in generation_config.json, as for clients
    return values


class Constraint(NamedTuple):
    """Constrained decoding: ``kind`` and its text (a regex, a JSON schema, an EBNF grammar)."""

    kind: ConstraintKind
    value: str


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    logprob_start_len: int = -1
    """-1: no prompt logprobs; k >= 0: prompt logprobs from prompt token k on (echo)."""
    constraint: Constraint | None = None
    logit_bias: Mapping[str, float] = field(default_factory=dict)
    unset: frozenset[str] = frozenset()
    """Model-tunable knobs (``MODEL_DEFAULT_KEYS``) the request left out; the model's
    generation defaults may fill them."""

    def with_constraint(self, constraint: Constraint | tuple[str, str] | None) -> SamplingOptions:
        """Add a constraint (e.g. from ``tool_choice``); two constraints are a client error."""
        if constraint is None:
            return self
        if self.constraint is not None:
            raise InvalidRequestError(
                f"the request already constrains the output with {self.constraint.kind}; "
                f"it cannot also be constrained by {constraint[0]}",
                param="tool_choice",
            )
        kind, value = constraint
        return dataclasses.replace(self, constraint=Constraint(kind, value))  # type: ignore[arg-type]


# The options through their slots, not the frozen constructor (``protocol.frozen``).
_build_options = slots_builder(SamplingOptions)
_FIELDS = SamplingOptions.__slots__


def _constraint(candidates: list[tuple[str, ConstraintKind, str | None]]) -> Constraint | None:
    """The single constraint among ``(param, kind, value)`` candidates, or a 400 if several."""
    given = [(param, kind, value) for param, kind, value in candidates if value is not None]
    if len(given) > 1:
        names = ", ".join(param for param, _, _ in given)
        raise InvalidRequestError(
            f"only one output constraint may be given, got: {names}", param=given[1][0]
        )
    if not given:
        return None
    _, kind, value = given[0]
    return Constraint(kind, value)  # type: ignore[arg-type]


def _common(req: SamplingRequest) -> dict[str, object]:
    top_k = req.top_k if req.top_k is not None else -1
    return {
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": -1 if top_k == 0 else top_k,  # 0 means "off" for OpenAI-style clients
        "min_p": req.min_p or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "presence_penalty": req.presence_penalty or 0.0,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "min_new_tokens": req.min_tokens,
        "stop": tuple(stop_list(req.stop)),
        "stop_token_ids": tuple(req.stop_token_ids or ()),
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "no_stop_trim": req.no_stop_trim,
        "n": req.n,
        "seed": req.seed,
        "logit_bias": dict(req.logit_bias or {}),
    }


def structured_constraint(so: StructuredOutputs | None) -> tuple[ConstraintKind, str] | None:
    """vLLM's ``structured_outputs`` in the gateway's terms (its model checked there is at
    most one): a choice is the regex of its alternatives, ``json_object`` any JSON object."""
    if so is None:
        return None
    if so.regex is not None:
        return "regex", so.regex
    if so.choice is not None:
        return "regex", choice_regex(so.choice)
    if so.grammar is not None:
        return "ebnf", so.grammar
    if so.json_ is not None:
        return "json_schema", so.json_ if isinstance(so.json_, str) else json.dumps(so.json_, ensure_ascii=False)
    if so.json_object:
        return "json_schema", JSON_OBJECT_SCHEMA
    return None


def _structured_candidate(req: SamplingRequest) -> tuple[str, ConstraintKind, str | None]:
    found = structured_constraint(req.structured_outputs)
    return ("structured_outputs", found[0], found[1]) if found else ("structured_outputs", "regex", None)


def _response_format_schema(req: ChatCompletionRequest) -> str | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JSON_OBJECT_SCHEMA
    assert fmt.json_schema is not None and fmt.json_schema.schema_ is not None  # model-validated
    return json.dumps(fmt.json_schema.schema_, ensure_ascii=False)


def sampling_from_chat(req: ChatCompletionRequest, model_defaults: Mapping[str, float] | None = None) -> SamplingOptions:
    """Sampling for a chat request (tool_choice constraints are added by the caller); the
    knobs it left out take ``model_defaults`` (the model's generation defaults) when given."""
    constraint = _constraint(
        [
            ("regex", "regex", req.regex),
            ("ebnf", "ebnf", req.ebnf),
            ("response_format", "json_schema", _response_format_schema(req)),
            _structured_candidate(req),
        ]
    )
    unset = _UNSET[
        (req.temperature is None, req.top_p is None, req.top_k is None, req.min_p is None, req.repetition_penalty is None)
    ]
    common = _common(req)
    if unset and model_defaults:
        filled = model_default_values(unset, model_defaults)
        if filled:
            common.update(filled)
            unset = unset.difference(filled)  # filled now: nothing left for the pipeline to fill
    common["max_new_tokens"] = req.max_new_tokens
    common["unset"] = unset
    common["logprobs"] = req.logprobs
    common["top_logprobs"] = (req.top_logprobs or 0) if req.logprobs else 0
    common["logprob_start_len"] = -1
    common["constraint"] = constraint
    # Every field named (the builder takes them all, in order): one per chat request.
    return _build_options(*map(common.__getitem__, _FIELDS))


def sampling_from_completion(req: CompletionRequest) -> SamplingOptions:
    """Sampling for a legacy completion; ``logprobs=k`` asks for k alternatives per token."""
    constraint = _constraint(
        [
            ("regex", "regex", req.regex),
            ("ebnf", "ebnf", req.ebnf),
            ("json_schema", "json_schema", req.json_schema),
            _structured_candidate(req),
        ]
    )
    wants_logprobs = req.logprobs is not None
    return SamplingOptions(
        **_common(req),  # type: ignore[arg-type]
        max_new_tokens=req.max_tokens,
        logprobs=wants_logprobs,
        top_logprobs=req.logprobs or 0,
        logprob_start_len=0 if (req.echo and wants_logprobs) else -1,
        constraint=constraint,
    )


def sampling_from_generate(req: GenerateRequest, index: int = 0) -> SamplingOptions:
    """Sampling for prompt ``index`` of an SGLang-native /generate request."""
    p = req.params_for(index)
    constraint = _constraint(
        [
            ("sampling_params.regex", "regex", p.regex),
            ("sampling_params.json_schema", "json_schema", p.json_schema),
            ("sampling_params.ebnf", "ebnf", p.ebnf),
        ]
    )
    return SamplingOptions(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=-1 if p.top_k == 0 else p.top_k,
        min_p=p.min_p,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repetition_penalty=p.repetition_penalty,
        max_new_tokens=p.max_new_tokens,
        min_new_tokens=p.min_new_tokens,
        stop=tuple(p.stop_strings()),
        stop_token_ids=tuple(p.stop_token_ids or ()),
        ignore_eos=p.ignore_eos,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        no_stop_trim=p.no_stop_trim,
        n=p.n,
        seed=p.sampling_seed,
        logprobs=req.return_logprob,
        top_logprobs=req.top_logprobs_num if req.return_logprob else 0,
        logprob_start_len=req.logprob_start_len if req.return_logprob else -1,
        constraint=constraint,
        logit_bias=dict(p.logit_bias or {}),
    )
