"""Sampling options -> the worker's SamplingParams message."""

from __future__ import annotations

from gateway.pipeline.sampling import to_sampling_params
from gateway.protocol.sampling import SamplingOptions


def test_seed_is_not_put_in_custom_params() -> None:
    """SGLang reads custom_params only for custom logit processors: a seed there is lost,
    and the SglangScheduler wire has no field for it."""
    params = to_sampling_params(SamplingOptions(seed=7), stop_token_ids=[], max_new_tokens=4)
    assert not params.HasField("custom_params")


def test_temperature_and_n_are_always_written() -> None:
    params = to_sampling_params(SamplingOptions(temperature=0.0, top_p=0.0, top_k=0), stop_token_ids=[3], max_new_tokens=None)
    assert params.temperature == 0.0 and params.n == 1
    assert params.top_p == 1.0 and params.top_k == -1 and not params.HasField("max_new_tokens")
    assert list(params.stop_token_ids) == [3]
