"""gRPC messages -> the HTTP API's JSON bodies: the same request models parse both."""

from __future__ import annotations

import json

import pytest
from google.protobuf.struct_pb2 import Struct

from gateway.client import chat_request, completion_request, function_tool, gpb, user
from gateway.protocol import limits
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import GatewayError
from gateway.protocol.logprobs import chat_logprobs, completion_logprobs
from gateway.protocol.stream import (
    CHAT_CHUNK,
    TEXT_COMPLETION,
    ChatDelta,
    CompletionDelta,
    StreamChunk,
    StreamHead,
    StreamUsage,
    ToolCallFragment,
)
from gateway.server.grpc import convert as convert
from gateway.server.http.util import parse_model


def test_chat_request_round_trips_to_the_http_model() -> None:
    kwargs = Struct()
    kwargs.update({"enable_thinking": False, "depth": 3})
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}}}
    request = chat_request(
        [gpb.ChatMessage(role="system", content="be brief"), user("hi"),
         gpb.ChatMessage(role="assistant", tool_calls=[gpb.ToolCall(id="c1", type="function", function=gpb.FunctionCall(name="f", arguments="{}"))]),
         gpb.ChatMessage(role="tool", content="42", tool_call_id="c1")],
        model="m", max_tokens=7, temperature=0.0, top_p=0.5, seed=2**40, stop=["END"], n=2,
        logit_bias={5: -100.0}, max_completion_tokens=5, logprobs=True, top_logprobs=3,
        tools=[function_tool("f", {"type": "object", "properties": {"x": {"type": "integer", "minimum": 1}}})],
        tool_choice=gpb.ToolChoice(mode="auto"), chat_template_kwargs=kwargs,
        response_format=gpb.ResponseFormat(type="json_schema", json_schema=gpb.JsonSchema(name="out", schema_json=json.dumps(schema))),
    )
    body = convert.chat_request(request, stream=False)
    req = parse_model(ChatCompletionRequest, body)
    assert req.model == "m" and req.max_tokens == 7 and req.max_new_tokens == 5 and req.n == 2
    assert req.temperature == 0.0 and req.top_p == 0.5 and req.seed == 2**40 and req.stop == ["END"]
    assert req.logit_bias == {"5": -100.0} and req.logprobs and req.top_logprobs == 3
    assert req.tools and req.tools[0].function.parameters == {"type": "object", "properties": {"x": {"type": "integer", "minimum": 1}}}
    assert req.tool_choice == "auto"
    assert req.chat_template_kwargs == {"enable_thinking": False, "depth": 3}
    assert isinstance(req.chat_template_kwargs["depth"], int)
    assert req.response_format is not None and req.response_format.json_schema.schema_ == schema  # type: ignore[union-attr]
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[2].tool_calls[0].function.name == "f"  # type: ignore[index]
    assert req.stream is False and req.stream_options is None


def test_unset_fields_take_the_http_defaults() -> None:
    req = parse_model(ChatCompletionRequest, convert.chat_request(chat_request([user("x")]), stream=True))
    assert req.temperature is None and req.max_tokens is None and req.n == 1 and req.tools is None
    completion = parse_model(CompletionRequest, convert.completion_request(completion_request("x"), stream=False))
    assert completion.max_tokens == 16  # OpenAI's default for this API, as over HTTP
    batch = parse_model(CompletionRequest, convert.completion_request(completion_request([[1, 2], [3]]), stream=False))
    assert batch.prompts() == [[1, 2], [3]]
    texts = parse_model(CompletionRequest, convert.completion_request(completion_request(["a", "b"]), stream=False))
    assert texts.prompts() == ["a", "b"]


def test_named_tool_choice_and_bad_json() -> None:
    request = chat_request([user("x")], tools=[function_tool("g", {"type": "object"})], tool_choice=gpb.ToolChoice(function_name="g"))
    req = parse_model(ChatCompletionRequest, convert.chat_request(request, stream=False))
    assert req.tool_choice_json() == {"type": "function", "function": {"name": "g"}}
    bad = gpb.ChatCompletionRequest(messages=[user("x")], response_format=gpb.ResponseFormat(type="json_schema", json_schema=gpb.JsonSchema(schema_json="[1,")))
    with pytest.raises(GatewayError) as err:
        convert.chat_request(bad, stream=False)
    assert err.value.status == 400 and err.value.param == "response_format.json_schema.schema_json"
    missing = gpb.ChatCompletionRequest(messages=[user("x")], response_format=gpb.ResponseFormat(type="json_schema"))
    with pytest.raises(GatewayError) as err:
        parse_model(ChatCompletionRequest, convert.chat_request(missing, stream=False))
    assert err.value.param == "response_format.json_schema"


def test_response_dicts_become_typed_messages() -> None:
    lp = chat_logprobs([97], [-0.5], [[(97, -0.5)]], lambda t: chr(t))
    head = StreamHead("c", CHAT_CHUNK, 1, "m")
    delta = ChatDelta(
        1, reasoning_content="hm", tool_calls=[ToolCallFragment(0, "{", id="t", name="f")], logprobs=lp,
        finish_reason="tool_calls", final=True,
    )
    chunk = convert.chat_chunk(StreamChunk(head, [delta], StreamUsage(3, 2, cached_tokens=2, reasoning_tokens=1)))
    choice = chunk.choices[0]
    assert choice.index == 1 and choice.delta.reasoning_content == "hm" and not choice.delta.HasField("content")
    assert choice.delta.tool_calls[0].function.arguments == "{" and choice.finish_reason == "tool_calls"
    assert choice.logprobs.content[0].bytes == b"a" and not choice.HasField("matched_stop")
    assert choice.delta.tool_calls[0].id == "t" and choice.delta.tool_calls[0].function.name == "f"
    assert (chunk.usage.cached_tokens, chunk.usage.reasoning_tokens, chunk.usage.total_tokens) == (2, 1, 5)
    text_lp = completion_logprobs([104, 105], [None, -1.0], [None, [(105, -1.0)]], lambda t: chr(t), text_offset=0)
    streamed = convert.completion_chunk(StreamChunk(
        StreamHead("x", TEXT_COMPLETION, 1, "m"), [CompletionDelta(0, "hi", text_lp, "stop", "\n")], StreamUsage(1, 2)
    ))
    tokens = streamed.choices[0].logprobs.tokens
    assert not tokens[0].HasField("logprob") and tokens[1].logprob == -1.0 and dict(tokens[1].top_logprobs) == {"i": -1.0}
    assert streamed.choices[0].matched_stop.text == "\n" and streamed.usage.total_tokens == 3
    assert not streamed.usage.HasField("reasoning_tokens")
    whole = convert.completion_response({
        "id": "x", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "matched_stop": "\n",
                     "logprobs": {"tokens": ["h", "i"], "token_logprobs": [None, -1.0], "top_logprobs": [None, {"i": -1.0}], "text_offset": [0, 1]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}},
    }, ["w1"])
    tokens = whole.choices[0].logprobs.tokens
    assert not tokens[0].HasField("logprob") and tokens[1].logprob == -1.0 and dict(tokens[1].top_logprobs) == {"i": -1.0}
    assert whole.choices[0].matched_stop.text == "\n" and list(whole.worker_ids) == ["w1"]
    assert not whole.usage.HasField("reasoning_tokens")


def test_messages_are_counted_before_any_is_converted() -> None:
    message = gpb.ChatMessage(role="user", content="hi")
    within = gpb.ChatCompletionRequest(model="m", messages=[message] * limits.MAX_MESSAGES)
    assert len(convert.chat_request(within, stream=False)["messages"]) == limits.MAX_MESSAGES
    over = gpb.ChatCompletionRequest(model="m", messages=[message] * (limits.MAX_MESSAGES + 1))
    with pytest.raises(GatewayError, match=f"at most {limits.MAX_MESSAGES} messages") as refused:
        convert.chat_request(over, stream=False)
    assert refused.value.status == 400 and refused.value.param == "messages"
    with pytest.raises(GatewayError, match="at most"):
        convert.tokenize_request(gpb.TokenizeRequest(model="m", messages=over.messages))


def test_token_prompt_lengths_are_read_from_the_message() -> None:
    assert convert.token_prompt_lengths(completion_request([5, 6, 7])) == [3]
    assert convert.token_prompt_lengths(completion_request([[5], [6, 7]])) == [1, 2]
    assert convert.token_prompt_lengths(completion_request("text")) == []
    assert convert.token_prompt_lengths(completion_request(["a", "b"])) == []
    assert convert.token_prompt_lengths(gpb.CompletionRequest()) == []
