"""The model's limits and sampling defaults, each from its true source (SGLang's rules)."""

from __future__ import annotations

import pytest

from gateway.pipeline.model_facts import (
    apply_model_defaults,
    context_length_from_config,
    parse_sampling_json,
    prompt_limit,
    resolve_context,
    resolve_sampling,
)
from gateway.protocol.sampling import MODEL_DEFAULT_KEYS, SamplingOptions

QWEN3_8B = {"max_position_embeddings": 40960, "rope_scaling": None, "model_type": "qwen3"}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (QWEN3_8B, 40960),
        ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 131072),
        ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072),
        ({"max_position_embeddings": 4096, "rope_scaling": {"factor": 2.0, "original_max_position_embeddings": 2048}}, 4096),
        ({"seq_length": 8192, "max_position_embeddings": 2048}, 8192),  # SGLang's key order
        ({"text_config": {"max_position_embeddings": 16384}}, 16384),
        ({"hidden_size": 64}, None),
    ],
)
def test_context_length_from_config(config: dict, expected: int | None) -> None:
    assert context_length_from_config(config) == expected


def test_context_precedence() -> None:
    assert resolve_context(context_arg=8192, model_config=QWEN3_8B, tokenizer_limit=131072, kv_pool=65536) == (
        8192, "server_args.context_length")
    assert resolve_context(context_arg=None, model_config=QWEN3_8B, tokenizer_limit=131072, kv_pool=65536) == (
        40960, "config.json")
    assert resolve_context(context_arg=None, model_config={}, tokenizer_limit=131072, kv_pool=65536)[0] == 131072
    value, source = resolve_context(context_arg=None, model_config={}, tokenizer_limit=None, kv_pool=65536)
    assert value == 65536 and "KV pool" in source


def test_prompt_limit_is_the_schedulers_rule() -> None:
    """Qwen3-8B on a 65,536-token pool: prompts of 40,954 tokens and more are refused."""
    assert prompt_limit(reported=0, context_length=40960, kv_pool=65536) == 40954
    assert prompt_limit(reported=0, context_length=40960, kv_pool=20000) == 19994
    assert prompt_limit(reported=40954, context_length=0, kv_pool=0) == 40954
    assert prompt_limit(reported=0, context_length=0, kv_pool=0) == 0


def test_sampling_precedence() -> None:
    generation = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2], "do_sample": True}
    assert resolve_sampling(worker_json='{"temperature":0.7,"max_new_tokens":5}', sampling_mode="model",
                            generation_config=generation) == ({"temperature": 0.7}, "GetModelInfo default_sampling_params_json")
    assert resolve_sampling(worker_json="", sampling_mode="model", generation_config=generation)[0] == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    defaults, source = resolve_sampling(worker_json="", sampling_mode="openai", generation_config=generation)
    assert defaults == {} and "openai" in source
    assert resolve_sampling(worker_json="", sampling_mode="", generation_config={})[0] == {}
    assert parse_sampling_json("not json") == {} and parse_sampling_json("[1]") == {}


def test_defaults_fill_only_what_the_request_left_out() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    omitted = SamplingOptions(unset=frozenset(MODEL_DEFAULT_KEYS))
    filled = apply_model_defaults(omitted, defaults)
    assert (filled.temperature, filled.top_p, filled.top_k, filled.min_p, filled.repetition_penalty) == (0.6, 0.95, 20, 0.0, 1.0)
    chosen = SamplingOptions(temperature=0.0, unset=frozenset({"top_p", "top_k"}))
    mixed = apply_model_defaults(chosen, defaults)
    assert (mixed.temperature, mixed.top_p, mixed.top_k) == (0.0, 0.95, 20)
    assert apply_model_defaults(SamplingOptions(), defaults) == SamplingOptions()  # completions: none unset
    assert apply_model_defaults(omitted, {"top_k": 0}).top_k == -1  # 0 means "off"
