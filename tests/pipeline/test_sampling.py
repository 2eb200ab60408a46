"""Sampling options -> the worker's SamplingParams message."""

from __future__ import annotations

from gateway.pipeline.sampling import to_sampling_params
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.sampling import SamplingOptions, sampling_from_chat


def test_a_seed_travels_in_custom_params() -> None:
    """The message has no seed field; vLLM's and TensorRT-LLM's transports take it from
    custom_params.seed (the pass-through's shape), SGLang's drop it (``without_seed``)."""
    params = to_sampling_params(SamplingOptions(seed=7), stop_token_ids=[], max_new_tokens=4)
    assert dict(params.custom_params) == {"seed": 7}
    assert not to_sampling_params(SamplingOptions(), stop_token_ids=[], max_new_tokens=4).HasField("custom_params")


def test_temperature_and_n_are_always_written() -> None:
    params = to_sampling_params(SamplingOptions(temperature=0.0, top_p=0.0, top_k=0), stop_token_ids=[3], max_new_tokens=None)
    assert params.temperature == 0.0 and params.n == 1
    assert params.top_p == 1.0 and params.top_k == -1 and not params.HasField("max_new_tokens")
    assert list(params.stop_token_ids) == [3]


def test_spaces_between_special_tokens_defaults_to_true_as_in_sglang() -> None:
    """proto3 would read an unwritten flag as false; SGLang's default is true."""
    params = to_sampling_params(SamplingOptions(), stop_token_ids=[], max_new_tokens=None)
    assert params.spaces_between_special_tokens is True
    off = to_sampling_params(SamplingOptions(spaces_between_special_tokens=False), stop_token_ids=[], max_new_tokens=None)
    assert off.spaces_between_special_tokens is False


def test_a_chat_request_that_omits_spaces_between_special_tokens_sends_true() -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    params = to_sampling_params(sampling_from_chat(req), stop_token_ids=[], max_new_tokens=None)
    assert params.spaces_between_special_tokens is True


def test_stop_strings_given_for_the_worker_go_in_stop_in_order() -> None:
    params = to_sampling_params(SamplingOptions(), stop_token_ids=[7], max_new_tokens=None, stop_strings=["b", "a"])
    assert list(params.stop) == ["b", "a"] and list(params.stop_token_ids) == [7]
    assert list(to_sampling_params(SamplingOptions(), stop_token_ids=[], max_new_tokens=None).stop) == []
