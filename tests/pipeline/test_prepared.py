"""The prepared request (pipeline/prepared.py): what dispatch needs, with defaults that
are the request's own (no state shared between requests) and no stray attributes."""

from __future__ import annotations

import pytest

from gateway.pipeline.prepared import PreparedRequest
from gateway.protocol.sampling import SamplingOptions
from gateway.tokenization import StopPlan, Tokenizer


def _prepared(request_id: str) -> PreparedRequest:
    tokenizer = object.__new__(Tokenizer)  # never read by the dataclass
    return PreparedRequest(request_id, "m", [1, 2, 3], SamplingOptions(), StopPlan(), tokenizer)


def test_defaults_are_a_plain_unpinned_non_streaming_request() -> None:
    p = _prepared("r1")
    assert (p.stream, p.prompt_text, p.routing_key, p.target_worker) == (False, "", None, None)
    assert (p.require_reasoning, p.output_room, p.timings) == (False, None, {})


def test_each_request_has_its_own_timings() -> None:
    a, b = _prepared("a"), _prepared("b")
    a.timings["tokenize"] = 0.5
    assert b.timings == {}


def test_slots_refuse_a_misspelt_field() -> None:
    p = _prepared("r")
    with pytest.raises(AttributeError):
        p.routing_keys = "k"  # type: ignore[attr-defined]
