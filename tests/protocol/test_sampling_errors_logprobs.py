"""SamplingOptions builders, the error hierarchy, and logprob conversion edge cases."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from gateway.protocol import (
    JSON_OBJECT_SCHEMA,
    AuthenticationError,
    ChatCompletionRequest,
    CompletionRequest,
    Constraint,
    ErrorResponse,
    GatewayError,
    GatewayTimeoutError,
    GenerateRequest,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    NoWorkerError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    RequestTimeoutError,
    SamplingOptions,
    ServiceUnavailableError,
    WorkerError,
    chat_logprobs,
    completion_logprobs,
    sampling_from_chat,
    sampling_from_completion,
    sampling_from_generate,
    sglang_logprob_rows,
    sglang_top_rows,
    validation_error_to_gateway,
)
from gateway.protocol.sampling import MODEL_DEFAULT_KEYS

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def test_chat_defaults() -> None:
    opts = sampling_from_chat(chat())
    assert opts == SamplingOptions(unset=frozenset(MODEL_DEFAULT_KEYS))
    assert opts.temperature == 1.0 and opts.top_p == 1.0 and opts.top_k == -1
    assert opts.max_new_tokens is None and opts.skip_special_tokens is True and opts.n == 1


def test_chat_records_which_model_tunable_knobs_it_left_out() -> None:
    """A knob the request sets, to any value (0 included), is the client's; the rest may
    take the model's defaults, as on SGLang's own server."""
    opts = sampling_from_chat(chat(temperature=0, top_k=5))
    assert opts.unset == {"top_p", "min_p", "repetition_penalty"}
    assert sampling_from_completion(CompletionRequest.model_validate({"model": "m", "prompt": "x"})).unset == frozenset()


def test_chat_fields_map_through() -> None:
    opts = sampling_from_chat(
        chat(
            temperature=0,
            top_p=0.9,
            top_k=0,
            min_p=0.1,
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            repetition_penalty=1.2,
            max_tokens=50,
            min_tokens=3,
            stop="###",
            stop_token_ids=[7],
            ignore_eos=True,
            skip_special_tokens=False,
            no_stop_trim=True,
            n=3,
            seed=42,
            logprobs=True,
            top_logprobs=5,
            logit_bias={"10": -100},
        )
    )
    assert (opts.temperature, opts.top_p, opts.top_k, opts.min_p) == (0.0, 0.9, -1, 0.1)
    assert (opts.frequency_penalty, opts.presence_penalty, opts.repetition_penalty) == (
        0.5,
        -0.5,
        1.2,
    )
    assert (opts.max_new_tokens, opts.min_new_tokens) == (50, 3)
    assert opts.stop == ("###",) and opts.stop_token_ids == (7,)
    assert opts.ignore_eos and not opts.skip_special_tokens and opts.no_stop_trim
    assert (opts.n, opts.seed, opts.logprobs, opts.top_logprobs) == (3, 42, True, 5)
    assert opts.logit_bias == {"10": -100.0}


def test_response_formats_become_json_schema_constraints() -> None:
    assert sampling_from_chat(chat(response_format={"type": "text"})).constraint is None
    obj = sampling_from_chat(chat(response_format={"type": "json_object"})).constraint
    assert obj == Constraint("json_schema", JSON_OBJECT_SCHEMA)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    got = sampling_from_chat(chat(response_format=rf)).constraint
    assert got is not None and got.kind == "json_schema" and json.loads(got.value) == schema
    assert sampling_from_chat(chat(regex="a+")).constraint == ("regex", "a+")
    assert sampling_from_chat(chat(ebnf='root ::= "x"')).constraint == ("ebnf", 'root ::= "x"')


def test_two_constraints_are_rejected() -> None:
    with pytest.raises(InvalidRequestError) as info:
        sampling_from_chat(chat(regex="a+", response_format={"type": "json_object"}))
    assert info.value.param == "response_format" and info.value.status == 400
    with pytest.raises(InvalidRequestError) as info:
        sampling_from_chat(chat(regex="a")).with_constraint(("json_schema", "{}"))
    assert info.value.param == "tool_choice"
    opts = sampling_from_chat(chat()).with_constraint(("json_schema", "{}"))
    assert opts.constraint == Constraint("json_schema", "{}")
    assert opts.with_constraint(None) is opts


def test_completion_sampling() -> None:
    req = CompletionRequest.model_validate(
        {"prompt": "x", "logprobs": 3, "echo": True, "json_schema": "{}"}
    )
    opts = sampling_from_completion(req)
    assert opts.max_new_tokens == 16
    assert opts.logprobs and opts.top_logprobs == 3 and opts.logprob_start_len == 0
    assert opts.constraint == Constraint("json_schema", "{}")
    plain = sampling_from_completion(
        CompletionRequest.model_validate({"prompt": "x", "logprobs": 0})
    )
    assert plain.logprobs and plain.top_logprobs == 0 and plain.logprob_start_len == -1
    assert not sampling_from_completion(CompletionRequest.model_validate({"prompt": "x"})).logprobs


def test_generate_sampling() -> None:
    req = GenerateRequest.model_validate(
        {
            "text": ["a", "b"],
            "sampling_params": [
                {
                    "temperature": 0,
                    "max_new_tokens": 8,
                    "stop": ["\n"],
                    "top_k": 0,
                    "sampling_seed": 3,
                },
                {"json_schema": '{"type": "object"}', "n": 2, "max_new_tokens": None},
            ],
            "return_logprob": True,
            "top_logprobs_num": 2,
            "logprob_start_len": 0,
        }
    )
    first = sampling_from_generate(req, 0)
    assert (first.temperature, first.max_new_tokens, first.stop, first.top_k, first.seed) == (
        0.0,
        8,
        ("\n",),
        -1,
        3,
    )
    assert first.logprobs and first.top_logprobs == 2 and first.logprob_start_len == 0
    second = sampling_from_generate(req, 1)
    assert second.constraint == Constraint("json_schema", '{"type": "object"}') and second.n == 2
    assert second.max_new_tokens == 128  # null means SGLang's default
    plain = sampling_from_generate(GenerateRequest.model_validate({"input_ids": [1]}))
    assert plain.max_new_tokens == 128 and not plain.logprobs and plain.logprob_start_len == -1


@pytest.mark.parametrize(
    ("error", "status", "type_", "code"),
    [
        (InvalidRequestError("x"), 400, "invalid_request_error", None),
        (AuthenticationError("x"), 401, "authentication_error", "invalid_api_key"),
        (PermissionDeniedError("x"), 403, "permission_error", "permission_denied"),
        (NotFoundError("x"), 404, "not_found_error", "not_found"),
        (ModelNotFoundError("gpt-9"), 404, "invalid_request_error", "model_not_found"),
        (RequestTimeoutError("x"), 408, "timeout_error", "request_timeout"),
        (PayloadTooLargeError("x"), 413, "invalid_request_error", "payload_too_large"),
        (RateLimitError("x", retry_after=2.0), 429, "rate_limit_error", "rate_limit_exceeded"),
        (WorkerError("x"), 502, "worker_error", "worker_error"),
        (ServiceUnavailableError("x"), 503, "service_unavailable", "service_unavailable"),
        (NoWorkerError("x"), 503, "service_unavailable", "no_worker"),
        (GatewayTimeoutError("x"), 504, "timeout", "timeout"),
    ],
)
def test_error_hierarchy(error: GatewayError, status: int, type_: str, code: str | None) -> None:
    assert isinstance(error, GatewayError)
    assert (error.status, error.type, error.code) == (status, type_, code)
    body = error.to_dict()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert ErrorResponse.model_validate(body).error.type == type_


def test_model_not_found_names_model_and_overrides() -> None:
    error = ModelNotFoundError("gpt-9")
    assert error.param == "model" and "gpt-9" in error.message
    custom = GatewayError("teapot", status=418, type="teapot", code="short", param="p")
    assert (custom.status, custom.type, custom.code, custom.param) == (418, "teapot", "short", "p")
    assert "teapot" in repr(custom)


def test_validation_error_merges_union_branches() -> None:
    with pytest.raises(ValidationError) as info:
        GenerateRequest.model_validate({"text": "x", "sampling_params": {"top_p": 0}})
    error = validation_error_to_gateway(info.value)
    assert error.param == "sampling_params.top_p"
    assert "also invalid" not in error.message  # the list-branch complaint is the same field


def test_validation_error_lists_other_bad_params() -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"messages": USER, "temperature": 9, "top_p": 9})
    error = validation_error_to_gateway(info.value)
    assert error.param == "temperature" and "also invalid: top_p" in error.message


def test_chat_logprobs_floor_and_top_n() -> None:
    lp = chat_logprobs(
        [1, 2], [float("-inf"), float("nan")], [[(1, -1.0), (2, -2.0), (3, -3.0)]], str, top_n=2
    )
    assert lp.content is not None
    assert [t.logprob for t in lp.content] == [-9999.0, -9999.0]
    assert [t.token for t in lp.content[0].top_logprobs] == ["1", "2"]
    assert lp.content[1].top_logprobs == []


def test_completion_logprobs_offsets_duplicates_and_streaming_extend() -> None:
    pieces = {1: "ab", 2: "c", 3: "ab"}
    first = completion_logprobs([1], [-0.5], [[(1, -0.5), (3, -0.1)]], pieces.__getitem__)
    assert first.top_logprobs == [{"ab": -0.1}]  # same text, larger logprob kept
    second = completion_logprobs([2], [-1.0], [[]], pieces.__getitem__, text_offset=2)
    assert second.top_logprobs == [{}]
    first.extend(second)
    assert first.tokens == ["ab", "c"] and first.text_offset == [0, 2]
    assert first.token_logprobs == [-0.5, -1.0]
    no_tops = completion_logprobs([2], [-1.0], None, pieces.__getitem__)
    assert no_tops.top_logprobs is None


def test_sglang_rows() -> None:
    assert sglang_logprob_rows([5, 6], [None, -1.0]) == [[None, 5, None], [-1.0, 6, None]]
    assert sglang_logprob_rows([5], [-math.inf], str) == [[-9999.0, 5, "5"]]
    assert sglang_top_rows([None, [(1, -0.5)]], str) == [None, [[-0.5, 1, "1"]]]
