"""The up-front bound on an answer's size: prompts x n x max_tokens, with logprobs."""

from __future__ import annotations

import pytest

from gateway.pipeline.limits import LimitsConfig, check_response_bytes, estimated_response_bytes
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.sampling import SamplingOptions


def test_the_estimate_grows_with_every_amplifier() -> None:
    base = estimated_response_bytes(SamplingOptions(n=1), max_tokens=100)
    assert estimated_response_bytes(SamplingOptions(n=4), max_tokens=100) == 4 * base
    assert estimated_response_bytes(SamplingOptions(n=1), prompts=3, max_tokens=100) == 3 * base
    with_lp = estimated_response_bytes(SamplingOptions(n=1, logprobs=True, top_logprobs=20), max_tokens=100)
    assert with_lp > 20 * base


def test_over_the_bound_is_a_400_and_zero_turns_it_off() -> None:
    limits = LimitsConfig(max_response_bytes=1 << 20)
    big = SamplingOptions(n=128, logprobs=True, top_logprobs=20, max_new_tokens=200)
    with pytest.raises(InvalidRequestError) as err:
        check_response_bytes(big, limits)
    assert err.value.code == "response_too_large" and err.value.param == "n"
    check_response_bytes(big, LimitsConfig(max_response_bytes=0))
    check_response_bytes(SamplingOptions(n=1, max_new_tokens=200), limits)
    with pytest.raises(InvalidRequestError):  # no max_tokens: what the context leaves counts
        check_response_bytes(SamplingOptions(n=128), limits, room=40_000)
    check_response_bytes(SamplingOptions(n=128), limits)  # nothing known: nothing to bound
