"""Request models: good inputs parse, bad inputs give a 400 naming the offending param."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    GenerateRequest,
    InvalidRequestError,
    TokenizeRequest,
    limits,
    validation_error_to_gateway,
)

USER = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def rejects(model: type, body: Any) -> InvalidRequestError:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    error = validation_error_to_gateway(info.value)
    assert error.status == 400 and error.type == "invalid_request_error"
    return error


def test_minimal_chat_request_gets_openai_defaults() -> None:
    req = ChatCompletionRequest.model_validate(chat())
    assert req.n == 1 and req.stream is False and req.logprobs is False
    assert req.max_new_tokens is None
    assert req.effective_tool_choice == "none"
    assert req.template_tools() is None


def test_unknown_fields_are_ignored_and_null_means_default() -> None:
    req = ChatCompletionRequest.model_validate(
        chat(frequency_penalty=None, stream=None, n=None, service_tier="auto", store=True)
    )
    assert req.stream is False and req.n == 1 and req.frequency_penalty is None
    assert not hasattr(req, "service_tier")


def test_all_roles_and_content_parts() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "developer",
            "content": [{"type": "text", "text": "dev "}, {"type": "text", "text": "rules"}],
        },
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "need the tool",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages})
    rendered = req.template_messages()
    assert rendered[1]["content"] == "dev rules"
    assert rendered[3]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert rendered[3]["reasoning_content"] == "need the tool"
    assert rendered[4] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_tool_call_arguments_given_as_object_become_json_text() -> None:
    msg = {
        "role": "assistant",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}],
    }
    req = ChatCompletionRequest.model_validate({"messages": [msg]})
    assert req.messages[0].tool_calls is not None
    assert req.messages[0].tool_calls[0].function.arguments == '{"x": 1}'


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"messages": []}, "messages", "at least one message"),
        ({"messages": [{"role": "user"}]}, "messages.[0].content", "content is required"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.[0].role", "'assistant'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.[0].content", "valid string"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}
                ]
            },
            "messages.[0].content",
            "only 'text' parts",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages.[0].tool_call_id",
            "tool_call_id",
        ),
        ({"messages": [{"role": "assistant"}]}, "messages.[0].content", "content or tool_calls"),
        (
            {
                "messages": [
                    USER[0],
                    {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]},
                ]
            },
            "messages.[1].tool_calls",
            "only assistant",
        ),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": limits.MAX_N + 1}, "n", f"less than or equal to {limits.MAX_N}"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "greater than or equal to 1"),
        ({"frequency_penalty": 3}, "frequency_penalty", "less than or equal to 2"),
        ({"presence_penalty": -3}, "presence_penalty", "greater than or equal to -2"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"top_logprobs": 3}, "top_logprobs", "requires logprobs"),
        ({"stop": 5}, "stop", "valid string"),
        ({"stop": ["a", ""]}, "stop", "must not be empty"),
        ({"stop": ["s"] * (limits.MAX_STOP_SEQUENCES + 1)}, "stop", "at most"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream"),
        ({"logit_bias": {"token": 1}}, "logit_bias", "not a token id"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "'json_schema'"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "json_schema.schema",
        ),
        ({"tool_choice": "always", "tools": [WEATHER_TOOL]}, "tool_choice", "must be 'none'"),
        ({"tool_choice": "required"}, "tool_choice", "non-empty tools"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
            "not in tools",
        ),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools", "unique"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools.[0].function.parameters",
            "type 'object'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools.[0].function.name",
            "pattern",
        ),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "non-negative"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens", "must not exceed"),
        ({"stream": "yes please"}, "stream", "valid boolean"),
    ],
)
def test_chat_rejections_name_the_param(fields: dict[str, Any], param: str, needle: str) -> None:
    error = rejects(ChatCompletionRequest, chat(**fields))
    assert error.param == param, error.message
    assert needle in error.message
    assert param in error.message


def test_tool_schema_size_and_depth_are_bounded() -> None:
    huge = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(1000)},
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": huge}}
    error = rejects(ChatCompletionRequest, chat(tools=[tool]))
    assert "bytes" in error.message and error.param == "tools.[0].function.parameters"

    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(limits.MAX_SCHEMA_DEPTH + 2):
        node["properties"] = {"x": {"type": "object"}}
        node = node["properties"]["x"]
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    assert "nested deeper" in rejects(ChatCompletionRequest, chat(tools=[tool])).message


def test_body_that_is_not_an_object() -> None:
    error = rejects(ChatCompletionRequest, ["not", "an", "object"])
    assert error.param is None and "JSON object" in error.message


def test_tool_choice_forms_and_template_tools() -> None:
    auto = ChatCompletionRequest.model_validate(chat(tools=[WEATHER_TOOL]))
    assert auto.effective_tool_choice == "auto"
    assert auto.template_tools() == [WEATHER_TOOL]
    none = ChatCompletionRequest.model_validate(chat(tools=[WEATHER_TOOL], tool_choice="none"))
    assert none.template_tools() is None and none.tool_choice_json() == "none"
    named = ChatCompletionRequest.model_validate(
        chat(
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    assert named.tool_choice_json() == {"type": "function", "function": {"name": "get_weather"}}


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    req = ChatCompletionRequest.model_validate(chat(max_tokens=10, max_completion_tokens=20))
    assert req.max_new_tokens == 20


def test_sglang_extras_are_accepted() -> None:
    req = ChatCompletionRequest.model_validate(
        chat(
            regex="[ab]+",
            ignore_eos=True,
            min_tokens=2,
            skip_special_tokens=False,
            no_stop_trim=True,
            separate_reasoning=False,
            chat_template_kwargs={"enable_thinking": False},
            stop_token_ids=[151645],
            rid="r1",
            top_k=20,
            min_p=0.05,
            repetition_penalty=1.1,
        )
    )
    assert req.chat_template_kwargs == {"enable_thinking": False}
    assert req.separate_reasoning is False and req.rid == "r1"


# ---------------------------------------------------------------- completions


@pytest.mark.parametrize(
    "prompt",
    ["hello", ["a", "b"], [1, 2, 3], [[1, 2], [3]]],
)
def test_completion_prompt_shapes(prompt: Any) -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    batch = req.prompts()
    assert len(batch) == (
        len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
    )
    assert req.max_tokens == 16


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"prompt": []}, "prompt", "not empty"),
        ({"prompt": [1, "a"]}, "prompt", "token ids are non-negative"),
        ({"prompt": [-1]}, "prompt", "non-negative"),
        ({"prompt": [[1], []]}, "prompt", "token-id lists"),
        ({"prompt": {"text": "x"}}, "prompt", "a string"),
        ({"prompt": "x", "suffix": "tail"}, "suffix", "not supported"),
        ({"prompt": "x", "logprobs": 6}, "logprobs", "less than or equal to 5"),
        ({"prompt": "x", "best_of": 3}, "best_of", "not supported"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({}, "prompt", "Field required"),
    ],
)
def test_completion_rejections(fields: dict[str, Any], param: str, needle: str) -> None:
    error = rejects(CompletionRequest, {"model": "m", **fields})
    assert error.param == param, error.message
    assert needle in error.message


def test_completion_empty_suffix_and_matching_best_of_are_fine() -> None:
    req = CompletionRequest.model_validate({"prompt": "x", "suffix": "", "best_of": 2, "n": 2})
    assert req.suffix is None and req.n == 2


# ---------------------------------------------------------------- /generate


def test_generate_single_and_batch() -> None:
    single = GenerateRequest.model_validate(
        {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
    )
    assert not single.is_batch and single.prompts() == ["hi"]
    assert single.params_for(0).max_new_tokens == 4
    batch = GenerateRequest.model_validate(
        {
            "input_ids": [[1, 2], [3]],
            "sampling_params": [{"temperature": 0}, {"n": 2}],
            "rid": ["a", "b"],
        }
    )
    assert batch.is_batch and batch.batch_size == 2
    assert batch.params_for(1).n == 2 and batch.rid_for(1) == "b"
    defaults = GenerateRequest.model_validate({"input_ids": [5, 6], "sampling_params": None})
    assert defaults.prompts() == [[5, 6]] and defaults.params_for(0).max_new_tokens == 128


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({}, "text", "exactly one of text and input_ids"),
        ({"text": "x", "input_ids": [1]}, "text", "exactly one"),
        ({"input_ids": []}, "input_ids", "must not be empty"),
        ({"input_ids": [[1], []]}, "input_ids", "non-empty"),
        (
            {"text": "x", "sampling_params": {"temperature": -1}},
            "sampling_params.temperature",
            "greater than or equal to 0",
        ),
        (
            {"text": "x", "sampling_params": {"regex": "a", "ebnf": "b"}},
            "sampling_params.ebnf",
            "only one of",
        ),
        (
            {"text": ["a", "b"], "sampling_params": [{}]},
            "sampling_params",
            "1 entries for 2 prompts",
        ),
        ({"text": "x", "top_logprobs_num": 50}, "top_logprobs_num", "less than or equal to 20"),
        ({"text": "x", "rid": ["a", "b"]}, "rid", "2 entries for 1 prompts"),
    ],
)
def test_generate_rejections(body: dict[str, Any], param: str, needle: str) -> None:
    error = rejects(GenerateRequest, body)
    assert error.param == param, error.message
    assert needle in error.message


# ---------------------------------------------------------------- embeddings, tokenize


def test_embedding_request() -> None:
    req = EmbeddingRequest.model_validate(
        {"input": ["a", "b"], "model": "m", "encoding_format": "base64"}
    )
    assert req.inputs() == ["a", "b"]
    assert EmbeddingRequest.model_validate({"input": [1, 2]}).inputs() == [[1, 2]]
    assert (
        rejects(EmbeddingRequest, {"input": "x", "encoding_format": "hex"}).param
        == "encoding_format"
    )
    assert rejects(EmbeddingRequest, {"input": "x", "dimensions": 0}).param == "dimensions"
    assert rejects(EmbeddingRequest, {"input": []}).param == "input"


def test_tokenize_and_detokenize_requests() -> None:
    plain = TokenizeRequest.model_validate({"prompt": "hello"})
    assert plain.special_tokens is True
    chat_form = TokenizeRequest.model_validate(
        {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert chat_form.special_tokens is False and chat_form.add_generation_prompt is True
    assert chat_form.template_messages() == [{"role": "user", "content": "hi"}]
    assert rejects(TokenizeRequest, {}).param == "prompt"
    assert rejects(TokenizeRequest, {"prompt": "x", "messages": USER}).param == "prompt"
    assert DetokenizeRequest.model_validate({"tokens": [1, 2]}).tokens == [1, 2]
    assert rejects(DetokenizeRequest, {"tokens": [-1]}).param == "tokens"
    assert rejects(DetokenizeRequest, {"tokens": "12"}).param == "tokens"
