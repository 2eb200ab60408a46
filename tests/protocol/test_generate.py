"""SGLang's ``/generate`` (protocol/generate.py): one prompt or a batch, per-prompt
sampling params and rids, SGLang's defaults, and its finish_reason object."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol.errors import validation_error_to_gateway
from gateway.protocol.generate import (
    GenerateMetaInfo,
    GenerateRequest,
    GenerateResponse,
    GenerateSamplingParams,
    generate_finish_reason,
)


def _error(body: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as exc:
        GenerateRequest.model_validate(body)
    err = validation_error_to_gateway(exc.value)
    return err.param, err.message


def test_sglangs_defaults() -> None:
    p = GenerateSamplingParams()
    assert (p.temperature, p.max_new_tokens, p.top_k, p.n) == (1.0, 128, -1, 1)
    assert GenerateSamplingParams(stop="x").stop_strings() == ["x"] and p.stop_strings() == []


def test_one_prompt_and_a_batch() -> None:
    one = GenerateRequest.model_validate({"text": "hi", "rid": "r"})
    assert (one.is_batch, one.batch_size, one.prompts(), one.rid_for(0)) == (False, 1, ["hi"], "r")
    ids = GenerateRequest.model_validate({"input_ids": [1, 2]})
    assert (ids.is_batch, ids.prompts()) == (False, [[1, 2]])
    batch = GenerateRequest.model_validate({
        "input_ids": [[1], [2, 3]], "rid": "r",
        "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 8}],
    })
    assert (batch.is_batch, batch.batch_size, batch.prompts()) == (True, 2, [[1], [2, 3]])
    assert [batch.params_for(i).max_new_tokens for i in range(2)] == [4, 8]
    assert [batch.rid_for(i) for i in range(2)] == ["r-0", "r-1"]  # one rid for a batch is numbered
    named = GenerateRequest.model_validate({"text": ["a", "b"], "rid": ["x", "y"]})
    assert [named.rid_for(i) for i in range(2)] == ["x", "y"] and named.params_for(1).max_new_tokens == 128


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({}, "text", "exactly one of text and input_ids"),
        ({"text": "a", "input_ids": [1]}, "text", "exactly one"),
        ({"text": []}, "text", "empty list"),
        ({"input_ids": []}, "input_ids", "must not be empty"),
        ({"input_ids": [[1], []]}, "input_ids", "non-empty lists of non-negative"),
        ({"input_ids": [1, -1]}, "input_ids", "non-negative"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "1 entries for 2 prompts"),
        ({"text": ["a", "b"], "rid": ["x"]}, "rid", "1 entries for 2 prompts"),
        ({"text": "a", "rid": ""}, "rid", "printable"),
        ({"text": "a", "sampling_params": {"regex": "a", "ebnf": "b"}}, "sampling_params.ebnf", "only one of"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 1.5}}, "sampling_params.max_new_tokens", ""),
        ({"text": "a", "top_logprobs_num": -1}, "top_logprobs_num", ""),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, Any], param: str, text: str) -> None:
    got, message = _error(body)
    assert got == param and text in message


def test_finish_reasons_as_sglang_reports_them() -> None:
    assert generate_finish_reason(None, completion_tokens=3) is None
    assert generate_finish_reason("", completion_tokens=3) is None
    assert generate_finish_reason("length", completion_tokens=3).model_dump(exclude_none=True) == {"type": "length", "length": 3}  # type: ignore[union-attr]
    abort = generate_finish_reason("abort", completion_tokens=0, message="client gone")
    assert abort is not None and (abort.type, abort.message) == ("abort", "client gone")
    by_string = generate_finish_reason("stop", completion_tokens=2, matched_token_id=7, matched_stop_str="END")
    assert by_string is not None and by_string.matched == "END"  # a stop string wins over its token
    by_token = generate_finish_reason("stop", completion_tokens=2, matched_token_id=7)
    assert by_token is not None and by_token.matched == 7
    eos = generate_finish_reason("stop", completion_tokens=2)
    assert eos is not None and eos.model_dump(exclude_none=True) == {"type": "stop"}


def test_a_response_leaves_out_what_was_not_asked() -> None:
    meta = GenerateMetaInfo(id="r", prompt_tokens=3, completion_tokens=2)
    out = GenerateResponse(text="ok", output_ids=[5, 6], meta_info=meta).to_dict()
    assert out == {"text": "ok", "output_ids": [5, 6], "meta_info": {"id": "r", "prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0}}


def test_input_ids_are_checked_once_and_kept_as_sent() -> None:
    ids = list(range(100_000))
    assert GenerateRequest.model_validate({"input_ids": ids}).input_ids is ids
    for bad, says in (([1, True], "non-negative token ids"), ([[1], [-1]], "non-negative token ids"),
                      ([[1], []], "non-negative token ids"), ([1, [2]], "non-negative token ids"),
                      ([], "must not be empty"), ("12", "must be a list")):  # fmt: skip
        with pytest.raises(ValidationError, match=says):
            GenerateRequest.model_validate({"input_ids": bad})
