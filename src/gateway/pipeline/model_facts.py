"""What the gateway believes about a model, and where each belief comes from.

A ``--grpc-mode`` worker's GetModelInfo is only partly true: its
``max_context_length`` is the KV pool size, its ``vocab_size`` and
``eos_token_ids`` are placeholders (the servicer reads keys the scheduler never
sends), and it does not apply the model's sampling defaults itself. The true
values live in the model's own files (``config.json``, ``generation_config.json``,
which the worker's GetTokenizer zip carries) and in a few server arguments. This
module settles each fact once, with the name of its source, so that ``GET /workers``
and the docs can say where every number came from.

Rules, as SGLang's own server applies them:

* Context length: ``--context-length`` when the operator set it, else the model's
  config (the first of ``max_sequence_length``, ``seq_length``, ``max_seq_len``,
  ``model_max_length``, ``max_position_embeddings``, times the rope scaling factor
  unless the scaling names its original length), else the tokenizer's
  ``model_max_length``; the KV pool size is the last resort and is flagged as such.
* Prompt limit: the scheduler refuses a prompt of ``max_req_input_len`` tokens or
  more; that is ``min(context - 1, kv_pool - 1) - 5`` (the worker reports it when
  its scheduler does; the rule fills in otherwise).
* Sampling defaults (chat only): a knob the request leaves out takes the worker's
  ``default_sampling_params_json`` (the model's generation config merged with the
  server's preferred sampling params), else the model's ``generation_config.json``
  unless the server runs with ``--sampling-defaults openai``, else OpenAI's value.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.sampling import MODEL_DEFAULT_KEYS, SamplingOptions, model_default_values

CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
"""config.json keys that give a model's context length, in the order SGLang reads them."""

INPUT_RESERVE_TOKENS = 5
"""Tokens SGLang's scheduler keeps back from its longest request when it sizes the prompt limit."""


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One model's limits and sampling defaults, each with the name of its source."""

    context_length: int = 0
    context_source: str = "unknown"
    default_sampling: Mapping[str, float] = field(default_factory=dict)
    default_sampling_source: str = "none"

    def describe(self) -> dict[str, object]:
        return {
            "context_length": {"value": self.context_length, "source": self.context_source},
            "default_sampling": {"value": dict(self.default_sampling), "source": self.default_sampling_source},
        }


def context_length_from_config(config: Mapping[str, Any]) -> int | None:
    """The context length a model's config.json declares (None when it declares none)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and not any(k in config for k in CONTEXT_LENGTH_KEYS):
        config = text
    factor = 1.0
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and scaling:
        factor = float(scaling.get("factor", 1) or 1)
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1.0
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(factor * value)
    return None


def sampling_defaults(values: Mapping[str, Any]) -> dict[str, float]:
    """The model-tunable knobs among ``values``, as numbers (others and nulls dropped)."""
    out: dict[str, float] = {}
    for key in MODEL_DEFAULT_KEYS:
        value = values.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
    return out


def parse_sampling_json(text: str) -> dict[str, float]:
    """A worker's ``default_sampling_params_json``; anything unreadable counts as none."""
    if not text:
        return {}
    try:
        values = json.loads(text)
    except ValueError:
        return {}
    return sampling_defaults(values) if isinstance(values, Mapping) else {}


def resolve_context(
    *, context_arg: int | None, model_config: Mapping[str, Any], tokenizer_limit: int | None, kv_pool: int
) -> tuple[int, str]:
    """(context length, source) by the precedence in the module doc."""
    if context_arg:
        return int(context_arg), "server_args.context_length"
    declared = context_length_from_config(model_config)
    if declared:
        return declared, "config.json"
    if tokenizer_limit:
        return int(tokenizer_limit), "tokenizer_config.json model_max_length"
    if kv_pool:
        return int(kv_pool), "GetModelInfo max_context_length (the KV pool size; the model's context is unknown)"
    return 0, "unknown"


def resolve_sampling(
    *, worker_json: str, sampling_mode: str, generation_config: Mapping[str, Any]
) -> tuple[dict[str, float], str]:
    """(defaults, source) by the precedence in the module doc."""
    reported = parse_sampling_json(worker_json)
    if reported:
        return reported, "GetModelInfo default_sampling_params_json"
    if sampling_mode == "openai":
        return {}, "none (the worker runs with --sampling-defaults openai)"
    from_file = sampling_defaults(generation_config)
    if from_file:
        return from_file, "generation_config.json"
    return {}, "none (OpenAI defaults)"


def prompt_limit(*, reported: int, context_length: int, kv_pool: int) -> int:
    """The longest prompt + 1 a worker's scheduler admits (0: no known limit)."""
    if reported > 0:
        return reported
    bounds = [n - 1 for n in (context_length, kv_pool) if n > 0]
    return max(1, min(bounds) - INPUT_RESERVE_TOKENS) if bounds else 0


def apply_model_defaults(sampling: SamplingOptions, defaults: Mapping[str, float]) -> SamplingOptions:
    """Fill the knobs the request left out from the model's defaults (nothing else changes)."""
    if not sampling.unset or not defaults:
        return sampling
    changes = model_default_values(sampling.unset, defaults)
    return dataclasses.replace(sampling, **changes) if changes else sampling  # type: ignore[arg-type]
